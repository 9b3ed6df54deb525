package gotest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/testwasm"
)

// TestFlinkTable: the Flink -> streamd table is the same in both SDK
// READMEs, and every function or method it names in the Go and Rust
// columns exists in that SDK's source.
func TestFlinkTable(t *testing.T) {
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	table := func(readme string) string {
		b, err := os.ReadFile(filepath.Join(root, readme))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		i, j := strings.Index(s, "<!-- flink-table"), strings.Index(s, "<!-- /flink-table -->")
		if i < 0 || j < i {
			t.Fatalf("%s: no flink-table markers", readme)
		}
		return s[i:j]
	}
	goTable, rustTable := table("sdk/go/README.md"), table("sdk/rust/README.md")
	if goTable != rustTable {
		t.Fatal("the Flink table differs between sdk/go/README.md and sdk/rust/README.md")
	}
	source := func(dir, ext string) string {
		var all strings.Builder
		err := filepath.Walk(filepath.Join(root, dir), func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() && strings.HasSuffix(p, ext) {
				b, err := os.ReadFile(p)
				all.Write(b)
				return err
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return all.String()
	}
	goSrc, rustSrc := source("sdk/go", ".go"), source("sdk/rust/src", ".rs")
	goCall := regexp.MustCompile(`\b([A-Z][A-Za-z0-9]*)(\[[^\]]*\])?\(`)
	rustCall := regexp.MustCompile(`\b([a-z][a-z0-9_]*)(::<[^>]*>)?\(`)
	rows := 0
	for _, line := range strings.Split(goTable, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") || strings.TrimSpace(cells[1]) == "Flink" {
			continue
		}
		rows++
		for _, m := range goCall.FindAllStringSubmatch(cells[2], -1) {
			name := m[1]
			if !regexp.MustCompile(`func (\([^)]*\) )?` + name + `\b`).MatchString(goSrc) {
				t.Errorf("Go column names %s, which sdk/go does not define (row %q)", name, strings.TrimSpace(cells[1]))
			}
		}
		for _, m := range rustCall.FindAllStringSubmatch(cells[3], -1) {
			name := m[1]
			if !regexp.MustCompile(`fn ` + name + `\b`).MatchString(rustSrc) {
				t.Errorf("Rust column names %s, which sdk/rust does not define (row %q)", name, strings.TrimSpace(cells[1]))
			}
		}
	}
	if rows < 20 {
		t.Fatalf("the table has %d rows", rows)
	}
}
