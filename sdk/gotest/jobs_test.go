//go:build !wasip1

package gotest

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestExampleJobFiles runs the Go examples' job files in process, at their
// own parallelism and at another one, and compares the sink's files with
// expected.txt.
func TestExampleJobFiles(t *testing.T) {
	for _, tc := range []struct {
		dir, job string
		wasm     []string
	}{
		{"examples/wasm/uppercase", "uppercase.yaml", []string{uppercaseWasm}},
		{"examples/wasm/window-count", "window-count.yaml", []string{keybyWasm, windowCountWasm}},
	} {
		for _, par := range []int{0, 3} {
			t.Run(tc.job+"/p"+string(rune('0'+par)), func(t *testing.T) {
				dir := t.TempDir()
				for _, f := range []string{tc.job, "input.txt"} {
					copyFile(t, filepath.Join("../..", tc.dir, f), filepath.Join(dir, f))
				}
				for _, w := range tc.wasm {
					copyFile(t, testwasm.Path(t, w), filepath.Join(dir, filepath.Base(w)))
				}
				job, err := jobfile.LoadJob(filepath.Join(dir, tc.job), jobfile.Options{Parallelism: par})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if _, err := runtime.Run(ctx, job.Graph, runtime.Options{Engine: newEngine(t)}); err != nil {
					t.Fatal(err)
				}
				parts, err := filepath.Glob(filepath.Join(dir, "out", "part-*"))
				if err != nil || len(parts) == 0 {
					t.Fatalf("no output files in %s (%v)", filepath.Join(dir, "out"), err)
				}
				var got []string
				for _, p := range parts {
					b, err := os.ReadFile(p)
					if err != nil {
						t.Fatal(err)
					}
					if s := strings.TrimSuffix(string(b), "\n"); s != "" {
						got = append(got, strings.Split(s, "\n")...)
					}
				}
				want := readLines(t, filepath.Join("../..", tc.dir, "expected.txt"))
				sort.Strings(got)
				sort.Strings(want)
				if strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Fatalf("output\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			})
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
