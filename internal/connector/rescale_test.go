package connector

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/roundrobin"
)

// rescaleStage is a run of a source at parallelism p in which subtask j
// reads reads(j) records (-1: to the end, or total for an unbounded one).
type rescaleStage struct {
	p     int
	reads func(j int) int
}

// checkRescaled runs the stages of source type typ, the positions of each
// (nil for a subtask that reached the end) rescaled to the next one's
// parallelism as a restore does, and checks that every record first <= n <
// first+total (index maps a record to its n, false for one past them)
// comes exactly once, each subtask's in increasing order and of its class
// modulo p.
func checkRescaled(t *testing.T, typ string, first int64, total int, open func(j, p int, pos []byte) (Source, error), index func(abi.Record) (int64, bool), stages []rescaleStage) {
	t.Helper()
	seen := map[int64]int{}
	var pos [][]byte
	for _, st := range stages {
		if pos != nil {
			var ok bool
			var err error
			if pos, ok, err = RescaleSourcePositions(typ, pos, st.p); !ok || err != nil {
				t.Fatalf("rescale %s to %d: rescales %v, %v", typ, st.p, ok, err)
			}
		}
		next := make([][]byte, st.p)
		for j := range st.p {
			var at []byte
			if pos != nil {
				at = pos[j]
			}
			src, err := open(j, st.p, at)
			if err != nil {
				t.Fatalf("subtask %d of %d: %v", j, st.p, err)
			}
			limit := st.reads(j)
			if limit < 0 {
				limit = total
			}
			last, done := int64(-1), false
			buf := make([]abi.Record, 13)
			for read := 0; read < limit; {
				k, err := src.Read(context.Background(), buf[:min(len(buf), limit-read)])
				if err == io.EOF {
					done = true
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range buf[:k] {
					n, ok := index(r)
					if !ok {
						continue // past total (unbounded)
					}
					if n <= last || n%int64(st.p) != int64(j) {
						t.Fatalf("subtask %d of %d produced n=%d after %d", j, st.p, n, last)
					}
					seen[n]++
					last = n
				}
				read += k
			}
			if !done {
				next[j] = src.(interface{ Position() []byte }).Position()
			}
			src.Close()
		}
		pos = next
	}
	for n := first; n < first+int64(total); n++ {
		if seen[n] != 1 {
			t.Fatalf("record %d produced %d times", n, seen[n])
		}
	}
}

// Uneven prefixes at p=2, then at 3 (before every subtask is past the
// first rescale), then the rest at 1.
var rescaleStages = []rescaleStage{
	{2, func(j int) int { return 100 + 350*j }},
	{3, func(j int) int { return 50 * (3 - j) }},
	{1, func(int) int { return -1 }},
}

// A generator rescaled 2 -> 3 -> 1 mid-stream produces every record exactly
// once; bounded and unbounded.
func TestGeneratorRescale(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			spec := genSpec()
			const total = 3000
			spec.Count = total
			if !bounded {
				spec.Count, spec.Rate = 0, 1e9
			}
			checkRescaled(t, "generator", 0, total,
				func(j, p int, pos []byte) (Source, error) { return NewGenerator(spec, j, p, pos) },
				func(r abi.Record) (int64, bool) {
					n, err := strconv.ParseInt(strings.TrimPrefix(string(r.Value), "value-"), 10, 64)
					if err != nil || string(r.Key) != fmt.Sprintf("key-%d", n%7) || r.Timestamp != n {
						t.Fatalf("record %s|%s|%d not of the sequence", r.Key, r.Value, r.Timestamp)
					}
					return n, n < total
				}, rescaleStages)
		})
	}
}

// A file source rescaled 2 -> 3 -> 1 mid-file keeps every line exactly once.
func TestFileSourceRescale(t *testing.T) {
	const total = 2000
	var b strings.Builder
	for i := range total {
		fmt.Fprintf(&b, "line %d %s\n", i, strings.Repeat("x", i%50))
	}
	path := writeFile(t, b.String())
	checkRescaled(t, "file", 0, total,
		func(j, p int, pos []byte) (Source, error) { return NewFileSource(path, nil, j, p, pos, 0) },
		func(r abi.Record) (int64, bool) {
			f := strings.Fields(string(r.Value))
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("line %q", r.Value)
			}
			return n, true
		}, rescaleStages)
	if _, err := NewFileSource("-", strings.NewReader("a\n"), 0, 1, filePosition(0, 4, mustLayers(t)), 0); err == nil {
		t.Error("stdin resumed after a rescale")
	}
}

// mustLayers is what a source rescaled from 2 subtasks at 4 and 9 has to
// skip.
func mustLayers(t *testing.T) roundrobin.Layers {
	t.Helper()
	_, skip := roundrobin.Merge([]int64{4, 9}, make([]roundrobin.Layers, 2))
	if len(skip) == 0 {
		t.Fatal("no layer to skip")
	}
	return skip
}

// A nats source rescaled 2 -> 3 -> 1 mid-stream keeps every message
// exactly once (the split is by stream sequence: n is the sequence, from
// 1); bounded, and unbounded with messages published while it runs.
func TestNATSSourceRescale(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			co, _, js := jsServer(t)
			const total = 1500
			publishOrders(t, js, 0, total)
			o := NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: bounded}
			stages := rescaleStages
			if !bounded {
				// The last stage reads the 650 left of the total and 25 of
				// the 50 published after it.
				publishOrders(t, js, total, 50)
				stages = append(slices.Clone(stages[:2]), rescaleStage{1, func(int) int { return total - 700 - 150 + 25 }})
			}
			checkRescaled(t, "nats", 1, total,
				func(j, p int, pos []byte) (Source, error) { return NewNATSSource(context.Background(), o, j, p, pos) },
				func(r abi.Record) (int64, bool) {
					i, err := strconv.ParseInt(strings.TrimPrefix(string(r.Value), "order-"), 10, 64)
					if err != nil {
						t.Fatalf("message %q", r.Value)
					}
					return i + 1, i < total // sequence i+1
				}, stages)
		})
	}
}
