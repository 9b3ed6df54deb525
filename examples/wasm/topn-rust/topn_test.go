// Tests of the topn-rust example: expected.txt against a reference written
// here in Go, the crate's own tests (the SDK's native harness), and the
// module on the real host, driven as topn.yaml wires it.
package topn_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

var update = flag.Bool("update", false, "rewrite expected.txt from input.jsonl")

// topn.yaml: topn's config and the source's max_out_of_orderness.
const (
	size, slide, topN = 10000, 5000, 3
	outOfOrderness    = 2000
)

type event struct {
	TS       int64  `json:"ts"`
	Category string `json:"category"`
	Item     string `json:"item"`
	line     string
}

func readEvents(t *testing.T) []event {
	t.Helper()
	f, err := os.Open("input.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []event
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("input.jsonl:%d: %v", n, err)
		}
		e.line = sc.Text()
		evs = append(evs, e)
	}
	return evs
}

// reference is the sorted output: per category and sliding window, the top
// items by count (then name), one JSON line each, as the module renders it.
func reference(evs []event) []string {
	type win struct {
		cat        string
		start, end int64
	}
	counts := map[win]map[string]int{}
	for _, e := range evs {
		last := e.TS - ((e.TS%slide)+slide)%slide
		for start := last; start > e.TS-size; start -= slide {
			w := win{e.Category, start, start + size}
			if counts[w] == nil {
				counts[w] = map[string]int{}
			}
			counts[w][e.Item]++
		}
	}
	var lines []string
	for w, m := range counts {
		items := make([]string, 0, len(m))
		for it := range m {
			items = append(items, it)
		}
		sort.Slice(items, func(i, j int) bool {
			if m[items[i]] != m[items[j]] {
				return m[items[i]] > m[items[j]]
			}
			return items[i] < items[j]
		})
		if len(items) > topN {
			items = items[:topN]
		}
		var top []string
		for _, it := range items {
			top = append(top, fmt.Sprintf("[%q,%d]", it, m[it]))
		}
		lines = append(lines, fmt.Sprintf(`{"category":%q,"start":%d,"end":%d,"top":[%s]}`, w.cat, w.start, w.end, strings.Join(top, ",")))
	}
	sort.Strings(lines)
	return lines
}

func expected(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("expected.txt")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// TestExpectedFile: expected.txt is what the reference computes (-update rewrites it).
func TestExpectedFile(t *testing.T) {
	want := reference(readEvents(t))
	if *update {
		if err := os.WriteFile("expected.txt", []byte(strings.Join(want, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := expected(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("expected.txt differs from the reference:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestHarness runs the crate's cargo tests: the example through the Rust
// SDK's native harness (streamd::testing), checked against expected.txt.
func TestHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping cargo test")
	}
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/cargo", "test", "--quiet", "--offline", "--locked", "--manifest-path", filepath.Join(root, "examples", "wasm", "topn-rust", "Cargo.toml"))
	cmd.Env = append(os.Environ(), "RUSTC=/usr/bin/rustc", "CARGO_NET_OFFLINE=true", "CARGO_TARGET_DIR="+filepath.Join(root, "target", "rust"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cargo test in examples/wasm/topn-rust: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "test result: ok") {
		t.Fatalf("cargo test printed no result:\n%s", out)
	}
}

// TestOnHost drives the module on the real host as topn.yaml does, one
// subtask each: key, then topn with the source's watermarks.
func TestOnHost(t *testing.T) {
	ctx := context.Background()
	eng, err := host.NewEngine(ctx, host.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	mod, err := eng.LoadFile(ctx, testwasm.Path(t, "examples/wasm/topn-rust/topn_rust.wasm"))
	if err != nil {
		if strings.Contains(err.Error(), "imports unknown function") {
			t.Skipf("this host lacks the SPEC14 imports the window library uses: %v", err)
		}
		t.Fatal(err)
	}
	open := func(role string) *host.Instance {
		inst, err := mod.NewInstance(ctx, host.InstanceConfig{Job: "topn", Operator: role, Parallelism: 1, NumInputs: 1,
			Config: map[string]string{"role": role, "size_ms": fmt.Sprint(size), "slide_ms": fmt.Sprint(slide), "n": fmt.Sprint(topN)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { inst.Close(ctx) })
		if err := inst.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return inst
	}
	key, topn := open("key"), open("topn")
	var keyed, out []abi.Record
	collect := func(dst *[]abi.Record) host.Emitter {
		return func(recs []abi.Record) {
			for _, r := range recs {
				*dst = append(*dst, abi.Record{Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value), Timestamp: r.Timestamp})
			}
		}
	}
	maxTS := int64(math.MinInt64)
	for _, e := range readEvents(t) {
		keyed = keyed[:0]
		if err := key.Process(ctx, 0, []abi.Record{{Value: []byte(e.line), Timestamp: e.TS}}, collect(&keyed)); err != nil {
			t.Fatal(err)
		}
		if len(keyed) != 1 || string(keyed[0].Key) != e.Category || string(keyed[0].Value) != e.Item || keyed[0].Timestamp != e.TS {
			t.Fatalf("key emitted %v for %s", keyed, e.line)
		}
		if err := topn.Process(ctx, 0, keyed, collect(&out)); err != nil {
			t.Fatal(err)
		}
		maxTS = max(maxTS, e.TS)
		if err := topn.AdvanceWatermark(ctx, maxTS-outOfOrderness, collect(&out)); err != nil {
			t.Fatal(err)
		}
	}
	if err := topn.AdvanceWatermark(ctx, math.MaxInt64, collect(&out)); err != nil {
		t.Fatal(err)
	}
	if err := topn.EndInput(ctx, 0, collect(&out)); err != nil {
		t.Fatal(err)
	}
	if err := topn.Finish(ctx, collect(&out)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range out {
		got = append(got, string(r.Value))
	}
	sort.Strings(got)
	if want := expected(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("output:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
