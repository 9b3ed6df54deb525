package wordcount_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

var update = flag.Bool("update", false, "rewrite expected.txt from input.txt")

const minLength = 3 // wordcount.yaml: split's config min_length

// reference counts the words of text the way split+count do: maximal runs of
// ASCII letters and digits, lower-cased, at least minLen bytes long.
func reference(text []byte, minLen int) map[string]int {
	counts := map[string]int{}
	isWord := func(r rune) bool { return r < 128 && (unicode.IsLetter(r) || unicode.IsDigit(r)) }
	for _, line := range strings.Split(string(text), "\n") {
		for _, w := range strings.FieldsFunc(line, func(r rune) bool { return !isWord(r) }) {
			if len(w) >= minLen {
				counts[strings.ToLower(w)]++
			}
		}
	}
	return counts
}

// render is the sink's output sorted: one "word count" line per word.
func render(counts map[string]int) []string {
	lines := make([]string, 0, len(counts))
	for w, n := range counts {
		lines = append(lines, fmt.Sprintf("%s %d", w, n))
	}
	sort.Strings(lines)
	return lines
}

func readInput(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("input.txt")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestExpectedFile checks expected.txt against input.txt (go test -update rewrites it).
func TestExpectedFile(t *testing.T) {
	want := strings.Join(render(reference(readInput(t), minLength)), "\n") + "\n"
	if *update {
		if err := os.WriteFile("expected.txt", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("expected.txt")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("expected.txt is stale: run go test ./examples/wasm/wordcount -run TestExpectedFile -update")
	}
}

type harness struct {
	t   *testing.T
	ctx context.Context
	eng *host.Engine
}

func newHarness(t *testing.T) *harness {
	ctx := context.Background()
	eng, err := host.NewEngine(ctx, host.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	return &harness{t: t, ctx: ctx, eng: eng}
}

func (h *harness) instances(mod *host.Module, uid string, p int, cfg map[string]string, restore func(i int) *host.Snapshot) []*host.Instance {
	h.t.Helper()
	var out []*host.Instance
	for i := 0; i < p; i++ {
		ic := host.InstanceConfig{Job: "wordcount", Operator: uid, Subtask: i, Parallelism: p, NumInputs: 1, Config: cfg}
		if restore != nil {
			ic.Restore = restore(i)
		}
		inst, err := mod.NewInstance(h.ctx, ic)
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { inst.Close(h.ctx) })
		if err := inst.Open(h.ctx); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, inst)
	}
	return out
}

// TestWordCountOnHost runs split (p=2, rebalance) -> hash -> count through the
// host with the real Rust modules, takes a checkpoint of count half way,
// restores it at another parallelism, and checks the final counts.
func TestWordCountOnHost(t *testing.T) {
	h := newHarness(t)
	splitMod, err := h.eng.LoadFile(h.ctx, testwasm.Path(t, "examples/wasm/wordcount/split.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	countMod, err := h.eng.LoadFile(h.ctx, testwasm.Path(t, "examples/wasm/wordcount/count.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	input := readInput(t)
	var lines []abi.Record
	sc := bufio.NewScanner(bytes.NewReader(input))
	for sc.Scan() {
		lines = append(lines, abi.Record{Value: append([]byte(nil), sc.Bytes()...), Timestamp: abi.NoTimestamp})
	}

	splits := h.instances(splitMod, "split", 2, map[string]string{"min_length": fmt.Sprint(minLength)}, nil)
	countP := 2
	counts := h.instances(countMod, "count", countP, nil, nil)

	var out []string
	sink := func(sub int) host.Emitter {
		return func(recs []abi.Record) {
			for _, r := range recs {
				if got := abi.SubtaskForKeyGroup(abi.KeyGroup(r.Key, abi.DefaultMaxParallelism), abi.DefaultMaxParallelism, countP); got != sub {
					t.Errorf("count subtask %d emitted key %q of subtask %d", sub, r.Key, got)
				}
				out = append(out, string(r.Value))
			}
		}
	}
	// hash partition of split's output into per-count-subtask batches.
	pending := make([][]abi.Record, 8)
	route := func(recs []abi.Record) {
		for _, r := range recs {
			if len(r.Value) != 0 {
				t.Errorf("split emitted value %q, want empty", r.Value)
			}
			sub := abi.SubtaskForKeyGroup(abi.KeyGroup(r.Key, abi.DefaultMaxParallelism), abi.DefaultMaxParallelism, countP)
			pending[sub] = append(pending[sub], r)
		}
	}
	drain := func() {
		for sub := 0; sub < countP; sub++ {
			if len(pending[sub]) > 0 {
				if err := counts[sub].Process(h.ctx, 0, pending[sub], sink(sub)); err != nil {
					t.Fatal(err)
				}
				pending[sub] = pending[sub][:0]
			}
		}
	}
	feed := func(lines []abi.Record) {
		const batch = 7
		for n := 0; n*batch < len(lines); n++ {
			b := lines[n*batch : min((n+1)*batch, len(lines))]
			if err := splits[n%len(splits)].Process(h.ctx, 0, b, route); err != nil {
				t.Fatal(err)
			}
			drain()
		}
	}

	half := len(lines) / 2
	feed(lines[:half])

	// Checkpoint count, discard it and restore at parallelism 3.
	merged := &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}}
	for _, c := range counts {
		s, err := c.SnapshotState(h.ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Load(); err != nil { // a cut: its timers are read here
			t.Fatal(err)
		}
		for kg, st := range s.KeyGroups {
			merged.KeyGroups[kg] = st
		}
		if err := c.Close(h.ctx); err != nil {
			t.Fatal(err)
		}
	}
	countP = 3
	counts = h.instances(countMod, "count", countP, nil, func(i int) *host.Snapshot {
		r := abi.RangeForSubtask(i, abi.DefaultMaxParallelism, countP)
		s := &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}}
		for kg, st := range merged.KeyGroups {
			if r.Contains(kg) {
				s.KeyGroups[kg] = st
			}
		}
		return s
	})

	feed(lines[half:])
	for _, s := range splits {
		if err := s.EndInput(h.ctx, 0, route); err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(h.ctx, route); err != nil {
			t.Fatal(err)
		}
		if err := s.AdvanceWatermark(h.ctx, abi.MaxWatermark, route); err != nil {
			t.Fatal(err)
		}
	}
	drain()
	if len(out) != 0 {
		t.Fatalf("count emitted %d records before the end of event time", len(out))
	}
	for sub, c := range counts {
		if err := c.AdvanceWatermark(h.ctx, math.MaxInt64, sink(sub)); err != nil {
			t.Fatal(err)
		}
		if err := c.EndInput(h.ctx, 0, sink(sub)); err != nil {
			t.Fatal(err)
		}
		if err := c.Finish(h.ctx, sink(sub)); err != nil {
			t.Fatal(err)
		}
	}

	sort.Strings(out)
	want := render(reference(input, minLength))
	if strings.Join(out, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got %d words, want %d\ngot:  %q\nwant: %q", len(out), len(want), head(out), head(want))
	}
	if len(want) < 100 {
		t.Fatalf("only %d distinct words: the input is too small to be a test", len(want))
	}
}

func head(s []string) []string { return s[:min(len(s), 20)] }

// TestCountRejectsUnkeyed: count fails the subtask, with its message, on a record without a key.
func TestCountRejectsUnkeyed(t *testing.T) {
	h := newHarness(t)
	mod, err := h.eng.LoadFile(h.ctx, testwasm.Path(t, "examples/wasm/wordcount/count.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	c := h.instances(mod, "count", 1, nil, nil)[0]
	err = c.Process(h.ctx, 0, []abi.Record{{Value: []byte("x"), Timestamp: abi.NoTimestamp}}, func([]abi.Record) {})
	var he *host.Error
	if !errors.As(err, &he) || !errors.Is(err, host.ErrGuestFailed) || !strings.Contains(he.Message, "record without a key") {
		t.Fatalf("got %v, want a guest failure about a record without a key", err)
	}
}

// TestSplitRejectsBadConfig: a min_length that is not a number fails open with a message naming it.
func TestSplitRejectsBadConfig(t *testing.T) {
	h := newHarness(t)
	mod, err := h.eng.LoadFile(h.ctx, testwasm.Path(t, "examples/wasm/wordcount/split.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mod.NewInstance(h.ctx, host.InstanceConfig{Job: "wordcount", Operator: "split", Parallelism: 1, NumInputs: 1,
		Config: map[string]string{"min_length": "three"}})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(h.ctx)
	err = inst.Open(h.ctx)
	if !errors.Is(err, host.ErrGuestFailed) || !strings.Contains(err.Error(), `config "min_length"`) || !strings.Contains(err.Error(), "three") {
		t.Fatalf("got %v, want a failure naming min_length", err)
	}
}

// TestJobFile: wordcount.yaml is valid and names the modules this example builds.
func TestJobFile(t *testing.T) {
	testwasm.Path(t, "examples/wasm/wordcount/split.wasm")
	testwasm.Path(t, "examples/wasm/wordcount/count.wasm")
	j, err := jobfile.Load("wordcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, v := range j.Vertices {
		uids = append(uids, v.UID)
		if w, ok := v.Spec.(*jobfile.WasmSpec); ok && v.UID == "split" && w.Config["min_length"] != fmt.Sprint(minLength) {
			t.Errorf("split config min_length = %q, want %d (the test's reference uses it)", w.Config["min_length"], minLength)
		}
	}
	if got := strings.Join(uids, ","); got != "lines,split,count,out" {
		t.Errorf("operators %s", got)
	}
}
