package connector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
)

func genSpec() *SourceSpec {
	return &SourceSpec{Type: "generator", KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 7, TSStep: 1}
}

// readAll reads src to the end with a buffer of bufSize records and renders
// each record as "key|value|ts".
func readAll(t *testing.T, src Source, bufSize int) []string {
	t.Helper()
	buf := make([]abi.Record, bufSize)
	var out []string
	for {
		n, err := src.Read(context.Background(), buf)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatal("Read returned 0 records without io.EOF")
		}
		for _, r := range buf[:n] {
			out = append(out, fmt.Sprintf("%s|%s|%d", r.Key, r.Value, r.Timestamp))
		}
	}
}

func TestGeneratorRecords(t *testing.T) {
	spec := genSpec()
	spec.Count = 5
	spec.StartTS = 1000
	spec.TSStep = 10
	spec.ValueSize = 10
	spec.WatermarkLag = 5 * time.Millisecond
	g, err := NewGenerator(spec, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.Watermark() != abi.MinWatermark {
		t.Fatalf("watermark before any record = %d", g.Watermark())
	}
	got := readAll(t, g, 3)
	want := []string{
		"key-0|value-0...|1000", "key-1|value-1...|1010", "key-2|value-2...|1020",
		"key-3|value-3...|1030", "key-4|value-4...|1040",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if g.Watermark() != 1040-5 {
		t.Fatalf("watermark = %d, want max ts - lag = 1035", g.Watermark())
	}

	// No key pattern: records without key; literal braces stay.
	spec = &SourceSpec{Count: 2, ValuePattern: "{x}{n}/{k}", Keys: 1}
	g, _ = NewGenerator(spec, 0, 1, nil)
	buf := make([]abi.Record, 4)
	n, _ := g.Read(context.Background(), buf)
	if n != 2 || buf[0].Key != nil || string(buf[1].Value) != "{x}1/0" {
		t.Fatalf("got %d records %q %q", n, buf[0].Key, buf[1].Value)
	}
}

func TestGeneratorDeterministicAcrossParallelismAndResume(t *testing.T) {
	spec := genSpec()
	spec.Count = 1000
	g, _ := NewGenerator(spec, 0, 1, nil)
	all := readAll(t, g, 64)
	if len(all) != 1000 {
		t.Fatalf("got %d records, want 1000", len(all))
	}
	// Again: the same.
	g, _ = NewGenerator(spec, 0, 1, nil)
	if again := readAll(t, g, 100); strings.Join(again, ",") != strings.Join(all, ",") {
		t.Fatal("two runs of the same generator differ")
	}
	// Parallelism 3: subtask i produces n = i, i+3, ...; together all records.
	var union []string
	for i := 0; i < 3; i++ {
		g, _ := NewGenerator(spec, i, 3, nil)
		part := readAll(t, g, 50)
		for j, r := range part {
			if want := all[i+3*j]; r != want {
				t.Fatalf("subtask %d record %d = %s, want %s", i, j, r, want)
			}
		}
		union = append(union, part...)
	}
	if len(union) != 1000 {
		t.Fatalf("parallel subtasks produced %d records, want 1000", len(union))
	}
	// Resume from a position in the middle.
	g, _ = NewGenerator(spec, 1, 3, nil)
	buf := make([]abi.Record, 100)
	if _, err := g.Read(context.Background(), buf); err != nil {
		t.Fatal(err)
	}
	pos := g.Position()
	rest := readAll(t, g, 33)
	g2, err := NewGenerator(spec, 1, 3, pos)
	if err != nil {
		t.Fatal(err)
	}
	if resumed := readAll(t, g2, 7); strings.Join(resumed, ",") != strings.Join(rest, ",") {
		t.Fatal("a generator resumed from its position produces other records")
	}
	if _, err := NewGenerator(spec, 0, 3, pos); err == nil {
		t.Fatal("a position of subtask 1 was accepted by subtask 0")
	}
}

func TestGeneratorRate(t *testing.T) {
	spec := genSpec()
	spec.Count = 600
	spec.Rate = 2000 // over 2 subtasks: 1000/s each, 300 records each -> ~0.3 s
	start := time.Now()
	var wg sync.WaitGroup
	counts := make([]int, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, _ := NewGenerator(spec, i, 2, nil)
			buf := make([]abi.Record, 1024)
			for {
				n, err := g.Read(context.Background(), buf)
				if err == io.EOF {
					return
				}
				counts[i] += n
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if counts[0]+counts[1] != 600 {
		t.Fatalf("produced %v records, want 600", counts)
	}
	if el < 250*time.Millisecond || el > 1500*time.Millisecond {
		t.Fatalf("600 records at 2000/s took %v, want ~300ms", el)
	}

	// Unbounded: runs until the context ends, at the rate.
	spec = genSpec()
	spec.Rate = 5000
	g, _ := NewGenerator(spec, 0, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	buf := make([]abi.Record, 1024)
	total := 0
	var err error
	began := time.Now()
	for {
		var n int
		n, err = g.Read(ctx, buf)
		if err != nil {
			break
		}
		total += n
		// Never ahead of the rate (a read after a stall of the machine may
		// return what fell due meanwhile, but not more), give or take a
		// step of 20 ms.
		if due := int(5000*time.Since(began).Seconds()) + 100; total > due {
			t.Fatalf("%d records after %v at 5000/s: ahead of the rate (at most %d)", total, time.Since(began), due)
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unbounded generator ended with %v", err)
	}
	if total < 500 || total > 1100 {
		t.Fatalf("unbounded generator at 5000/s produced %d records in 200ms", total)
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func values(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.Split(l, "|")[1]
	}
	return out
}

func TestFileSourceSplitsLines(t *testing.T) {
	var b strings.Builder
	var want []string
	for i := 0; i < 100; i++ {
		l := fmt.Sprintf("line %d %s", i, strings.Repeat("x", i*700)) // some lines longer than the read buffer
		want = append(want, l)
		b.WriteString(l)
		if i%2 == 0 {
			b.WriteString("\r\n")
		} else {
			b.WriteString("\n")
		}
	}
	b.WriteString("last without newline")
	want = append(want, "last without newline")
	path := writeFile(t, b.String())

	src, err := NewFileSource(path, nil, 0, 1, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := values(readAll(t, src, 16))
	src.Close()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("parallelism 1 read %d lines, want %d", len(got), len(want))
	}

	var union []string
	for i := 0; i < 3; i++ {
		src, err := NewFileSource(path, nil, i, 3, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		part := values(readAll(t, src, 5))
		src.Close()
		for j, l := range part {
			if l != want[i+3*j] {
				t.Fatalf("subtask %d got line %q at %d, want line %d", i, l[:10], j, i+3*j)
			}
		}
		union = append(union, part...)
	}
	sort.Strings(union)
	sorted := append([]string(nil), want...)
	sort.Strings(sorted)
	if strings.Join(union, "\n") != strings.Join(sorted, "\n") {
		t.Fatal("the subtasks of parallelism 3 together did not read every line once")
	}

	// Resume: a new source from the position continues with the next line.
	src, _ = NewFileSource(path, nil, 1, 3, nil, 0)
	buf := make([]abi.Record, 4)
	src.Read(context.Background(), buf)
	pos := src.Position()
	rest := values(readAll(t, src, 3))
	src.Close()
	src2, err := NewFileSource(path, nil, 1, 3, pos, 0)
	if err != nil {
		t.Fatal(err)
	}
	if resumed := values(readAll(t, src2, 10)); strings.Join(resumed, "\n") != strings.Join(rest, "\n") || len(rest) == 0 {
		t.Fatalf("resumed source read %d lines, want %d", len(resumed), len(rest))
	}
	src2.Close()

	// Empty file: no records.
	src, _ = NewFileSource(writeFile(t, ""), nil, 0, 1, nil, 0)
	if got := readAll(t, src, 4); len(got) != 0 {
		t.Fatalf("empty file produced %v", got)
	}
	if _, err := NewFileSource(filepath.Join(t.TempDir(), "missing"), nil, 0, 1, nil, 0); err == nil || !strings.Contains(err.Error(), "connector: file source") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestFileSourceStdin(t *testing.T) {
	in := strings.NewReader("a\nb\nc\n")
	s0, _ := NewFileSource("-", in, 0, 2, nil, 0)
	s1, _ := NewFileSource("-", in, 1, 2, nil, 0)
	if got := values(readAll(t, s0, 2)); strings.Join(got, ",") != "a,b,c" {
		t.Fatalf("stdin subtask 0 read %v", got)
	}
	if got := readAll(t, s1, 2); len(got) != 0 {
		t.Fatalf("stdin subtask 1 read %v", got)
	}
}

func TestFileSink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out", "nested")
	recs := []abi.Record{
		{Key: []byte("k1"), Value: []byte("v1")},
		{Value: []byte("v2")},
	}
	for _, tc := range []struct{ format, want string }{{"", "v1\nv2\n"}, {"kv", "k1\tv1\n\tv2\n"}} {
		s, err := NewFileSink(dir, "", 3, tc.format)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(recs); err != nil {
			t.Fatal(err)
		}
		if err := s.CommitFinal(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "part-3"))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Fatalf("format %q: wrote %q, want %q", tc.format, b, tc.want)
		}
		if err := s.Write(recs); err == nil {
			t.Fatal("write after close succeeded")
		}
	}
	if _, err := NewFileSink(dir, "", 0, "json"); err == nil {
		t.Fatal("unknown format accepted")
	}
}

func TestStdoutSinkKeepsBatchesTogether(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := NewStdoutSink(&out, &mu)
			recs := make([]abi.Record, 100)
			for j := range recs {
				recs[j].Value = []byte(fmt.Sprintf("s%d", i))
			}
			for k := 0; k < 10; k++ {
				s.Write(recs)
			}
			s.Close()
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 4000 {
		t.Fatalf("got %d lines, want 4000", len(lines))
	}
	for i := 0; i < len(lines); i += 100 {
		for j := i; j < i+100; j++ {
			if lines[j] != lines[i] {
				t.Fatalf("batches of different subtasks interleave at line %d", j)
			}
		}
	}
}

// visible returns the sorted visible files of dir with their content.
func visible(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

func TestFileSinkTwoPhaseCommit(t *testing.T) {
	dir := t.TempDir()
	rec := func(v string) []abi.Record { return []abi.Record{{Value: []byte(v)}} }
	s, err := NewFileSink(dir, "", 1, "")
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Write(rec("a")))
	if v := visible(t, dir); len(v) != 0 {
		t.Fatalf("in-progress data visible: %v", v)
	}
	st1, err := s.PreCommit(1)
	must(err)
	must(s.Write(rec("b")))
	st2, err := s.PreCommit(2) // checkpoint 1 was never notified: 2 carries both
	must(err)
	if v := visible(t, dir); len(v) != 0 {
		t.Fatalf("pending data visible: %v", v)
	}
	if ps, _ := DecodePending(st1); len(ps) != 1 {
		t.Fatalf("state of checkpoint 1: %v", ps)
	}
	if ps, _ := DecodePending(st2); len(ps) != 2 {
		t.Fatalf("state of checkpoint 2: %v", ps)
	}
	must(s.Write(rec("c"))) // after checkpoint 2: never committed
	must(s.Commit(1))
	if v := visible(t, dir); len(v) != 1 || v["part-1-1"] != "a\n" {
		t.Fatalf("after commit 1: %v", v)
	}
	// The job fails before checkpoint 2 is committed; Close keeps pending files.
	must(s.Close())

	// Restore from checkpoint 2: commit its pending files first, twice (a
	// second restore of the same checkpoint changes nothing), and the
	// in-progress data of the failed attempt is gone.
	for i := 0; i < 2; i++ {
		r, err := NewFileSink(dir, "", 1, "")
		must(err)
		must(r.CommitPending([][]byte{st2}))
		must(r.Close())
		v := visible(t, dir)
		if len(v) != 2 || v["part-1-1"] != "a\n" || v["part-1-2"] != "b\n" {
			t.Fatalf("restore %d: %v", i, v)
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				t.Fatalf("restore %d: stale hidden file %s", i, e.Name())
			}
		}
	}
	// A pending file that is gone without being committed is an error.
	bad := EncodePending([]PendingFile{{ID: 9, Pending: ".part-1-9.pending", Final: "part-1-9"}})
	r, _ := NewFileSink(dir, "", 1, "")
	if err := r.CommitPending([][]byte{bad}); err == nil || !strings.Contains(err.Error(), "neither") {
		t.Fatalf("lost pending file: %v", err)
	}
	if _, err := DecodePending([]byte{1, 0, 0, 0, 1, 0}); err == nil {
		t.Fatal("truncated state decoded")
	}
}

func TestCommitPendingUpTo(t *testing.T) {
	dir := t.TempDir()
	// The pending files of another job in the same directory stay pending.
	other := []string{".part-wc-1a2b-0-3.pending", ".part-wc-1a2b-1-4.pending"}
	for _, n := range append([]string{".part-0-3.pending", ".part-1-5.pending", ".part-1-9.pending", ".part-0.inprogress"}, other...) {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		if err := CommitPendingUpTo(dir, PartPrefix(""), 5); err != nil {
			t.Fatal(err)
		}
		v := visible(t, dir)
		if len(v) != 2 || v["part-0-3"] == "" || v["part-1-5"] == "" {
			t.Fatalf("round %d: %v", i, v)
		}
	}
	for _, n := range other {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Fatalf("another job's pending file: %v", err)
		}
	}
	if err := CommitPendingUpTo(dir, PartPrefix("wc-1a2b"), 3); err != nil {
		t.Fatal(err)
	}
	if v := visible(t, dir); len(v) != 3 || v["part-wc-1a2b-0-3"] == "" {
		t.Fatalf("job wc-1a2b up to 3: %v", v)
	}
	if err := CommitPendingUpTo(filepath.Join(dir, "missing"), PartPrefix(""), 5); err != nil {
		t.Fatal(err)
	}
}

// TestFileSinksOfTwoJobsInOneDirectory: two jobs' sinks with the same subtask
// index write one directory; each commits, restores and cleans up only its own
// files, so every record of both stays.
func TestFileSinksOfTwoJobsInOneDirectory(t *testing.T) {
	dir := t.TempDir()
	a, err := NewFileSink(dir, "job-a", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewFileSink(dir, "job-b", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.Write([]abi.Record{{Value: []byte("a1")}}))
	must(b.Write([]abi.Record{{Value: []byte("b1")}}))
	stA, err := a.PreCommit(1)
	must(err)
	_, err = b.PreCommit(1)
	must(err)
	must(b.Commit(1))
	must(b.Write([]abi.Record{{Value: []byte("b2")}}))
	// Job a fails before its commit and is restored: its cleanup must not
	// remove job b's in-progress file, and its commit only its own file.
	must(a.Close())
	r, err := NewFileSink(dir, "job-a", 0, "")
	must(err)
	must(r.CommitPending([][]byte{stA}))
	must(b.CommitFinal())
	v := visible(t, dir)
	if len(v) != 3 || v["part-job-a-0-1"] != "a1\n" || v["part-job-b-0-1"] != "b1\n" || v["part-job-b-0"] != "b2\n" {
		t.Fatalf("visible files: %v", v)
	}
}
