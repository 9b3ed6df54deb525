// Package jsonl holds what the examples' tests share: reading a JSON-lines
// input as the file source with timestamp: {field: ts} does, and comparing
// sorted output with an expected file (-update rewrites it).
package jsonl

import (
	"bufio"
	"encoding/json"
	"os"
	"sort"
	"strings"
	"testing"

	streamd "github.com/streamd/streamd/sdk/go"
)

// Read returns the lines of file as records: the line as value, its "ts"
// field as event time.
func Read(t testing.TB, file string) []streamd.Record {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []streamd.Record
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var v struct{ TS *int64 }
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil || v.TS == nil {
			t.Fatalf("%s line %d: no number field ts (%v)", file, n, err)
		}
		recs = append(recs, streamd.Record{Value: append([]byte(nil), sc.Bytes()...), Timestamp: *v.TS})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}

// Compare checks the values of recs, sorted, against the lines of file,
// sorted; with update it writes them to file instead.
func Compare(t testing.TB, file string, recs []streamd.Record, update bool) {
	t.Helper()
	got := make([]string, 0, len(recs))
	for _, r := range recs {
		got = append(got, string(r.Value))
	}
	sort.Strings(got)
	if update {
		if err := os.WriteFile(file, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(b) == 0 {
		want = nil
	}
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s differs:\n%s\nwant\n%s", file, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
