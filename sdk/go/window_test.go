package streamd_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/streamdtest"
)

// countAgg counts records of any value.
type countAgg struct{}

func (countAgg) CreateAccumulator() int64      { return 0 }
func (countAgg) Add(_ string, acc int64) int64 { return acc + 1 }
func (countAgg) GetResult(acc int64) int64     { return acc }
func (countAgg) Merge(a, b int64) int64        { return a + b }

func countWindows(a streamd.WindowAssigner, opts ...streamd.WindowOption) *streamd.WindowOperator[string] {
	return streamd.Window(a, streamd.String, streamd.AggregateProcessWindow(streamd.Int64, streamd.Aggregator[string, int64, int64](countAgg{}),
		func(key []byte, w streamd.TimeWindow, n int64, out *streamd.WindowOutput) error {
			out.Emit([]byte(fmt.Sprintf("%d%v", n, w)))
			return nil
		}), opts...)
}

// listWindows emits the values of a window joined by commas, and the window.
func listWindows(a streamd.WindowAssigner, opts ...streamd.WindowOption) *streamd.WindowOperator[string] {
	return streamd.Window(a, streamd.String, streamd.ProcessWindow(func(key []byte, w streamd.TimeWindow, elems []string, out *streamd.WindowOutput) error {
		out.Emit([]byte(strings.Join(elems, ",") + w.String()))
		return nil
	}), opts...)
}

func feed(t *testing.T, h *streamdtest.Harness, recs ...streamd.Record) {
	t.Helper()
	for _, r := range recs {
		must(t, h.ProcessElement(r, 0))
	}
}

func checkClean(t *testing.T, h *streamdtest.Harness) {
	t.Helper()
	if n, ts := h.StateEntries(), h.EventTimeTimers(); n != 0 || len(ts) != 0 {
		t.Fatalf("after the last window: %d state entries, timers %v; want none", n, ts)
	}
}

func TestTumblingEventTimeWindows(t *testing.T) {
	op := countWindows(streamd.TumblingEventTimeWindows(10*time.Millisecond, 0))
	h := open(t, op, streamdtest.Options{})
	feed(t, h, rec("a", "x", 1), rec("a", "x", 5), rec("b", "x", 3), rec("a", "x", 12), rec("a", "x", 8))
	must(t, h.ProcessWatermark(9))
	wantOutput(t, "at watermark 9", h.Output(), "a 3[0, 10) @9\nb 1[0, 10) @9\n")
	h.ClearOutput()
	feed(t, h, rec("a", "late", 2), rec("b", "x", -5)) // [0,10) is gone: dropped; [-10,0) too
	if op.LateDropped() != 2 || len(h.Logs()) != 1 {
		t.Fatalf("dropped %d, logs %q", op.LateDropped(), h.Logs())
	}
	must(t, h.EndOfInput())
	wantOutput(t, "at the end", h.Output(), "a 1[10, 20) @19\n")
	checkClean(t, h)

	// Offsets shift the windows; negative timestamps floor.
	h = open(t, countWindows(streamd.TumblingEventTimeWindows(10*time.Millisecond, 3*time.Millisecond)), streamdtest.Options{})
	feed(t, h, rec("a", "x", 2), rec("a", "x", 3), rec("a", "x", -8))
	must(t, h.EndOfInput())
	wantOutput(t, "offset 3", h.Output(), "a 1[-17, -7) @-8\na 1[-7, 3) @2\na 1[3, 13) @12\n")
}

func TestSlidingEventTimeWindows(t *testing.T) {
	sum := streamd.Window(streamd.SlidingEventTimeWindows(10*time.Millisecond, 5*time.Millisecond), streamd.Int64,
		streamd.ReduceWindow(func(a, b int64) int64 { return a + b }))
	h := open(t, sum, streamdtest.Options{})
	for _, r := range []struct {
		ts, v int64
	}{{7, 1}, {3, 10}, {12, 100}} {
		must(t, h.ProcessElement(streamd.Record{Key: []byte("k"), Value: streamd.Int64.Encode(nil, r.v), Timestamp: r.ts}, 0))
	}
	must(t, h.EndOfInput())
	var got []string
	for _, r := range h.Output() {
		v, err := streamd.Int64.Decode(r.Value)
		must(t, err)
		got = append(got, fmt.Sprintf("%d@%d", v, r.Timestamp))
	}
	// [-5,5): 10; [0,10): 11; [5,15): 101; [10,20): 100.
	if strings.Join(got, " ") != "10@4 11@9 101@14 100@19" {
		t.Fatalf("sliding sums %v", got)
	}
	checkClean(t, h)
}

func TestSessionWindowsMerge(t *testing.T) {
	h := open(t, listWindows(streamd.EventTimeSessionWindows(10*time.Millisecond)), streamdtest.Options{})
	feed(t, h, rec("a", "0", 0), rec("a", "5", 5), rec("a", "30", 30), rec("b", "1", 1))
	timers := func() string {
		var s []string
		for _, tm := range h.EventTimeTimers() {
			s = append(s, fmt.Sprintf("%s@%d", tm.Key, tm.TS))
		}
		return strings.Join(s, " ")
	}
	if got := timers(); got != "b@10 a@14 a@39" {
		t.Fatalf("timers %s", got)
	}
	feed(t, h, rec("a", "20", 20)) // [20,30) touches [30,40): [20,40)
	feed(t, h, rec("a", "16", 16)) // [16,26) joins it: [16,40)
	if got := timers(); got != "b@10 a@14 a@39" {
		t.Fatalf("timers after merging into [16,40): %s", got)
	}
	feed(t, h, rec("a", "14", 14)) // [14,24) bridges [0,15) and [16,40): [0,40)
	if got := timers(); got != "b@10 a@39" {
		t.Fatalf("timers after the bridge: %s (the merged windows' timers must go)", got)
	}
	must(t, h.ProcessWatermark(38))
	wantOutput(t, "at 38", h.Output(), "b 1[1, 11) @10\n")
	must(t, h.ProcessWatermark(39))
	wantOutput(t, "at 39", h.Output(), "b 1[1, 11) @10\na 0,5,30,20,16,14[0, 40) @39\n")
	checkClean(t, h)
}

func TestAllowedLatenessAndLateOutput(t *testing.T) {
	op := countWindows(streamd.TumblingEventTimeWindows(10*time.Millisecond, 0),
		streamd.AllowedLateness(5*time.Millisecond), streamd.LateOutput("late"))
	h := open(t, op, streamdtest.Options{})
	feed(t, h, rec("a", "x", 1))
	must(t, h.ProcessWatermark(9))
	feed(t, h, rec("a", "x", 3)) // late but allowed: fires again at once
	must(t, h.ProcessWatermark(13))
	feed(t, h, rec("a", "x", 0)) // still allowed
	wantOutput(t, "fired three times", h.Output(), "a 1[0, 10) @9\na 2[0, 10) @9\na 3[0, 10) @9\n")
	must(t, h.ProcessWatermark(14)) // cleanup at 9+5
	if n := h.StateEntries(); n != 0 {
		t.Fatalf("%d entries after the cleanup time", n)
	}
	feed(t, h, rec("a", "too-late", 4), rec("a", "x", 15))
	wantOutput(t, "late", h.SideOutput("late"), "a too-late @4\n")
	if op.LateDropped() != 0 {
		t.Fatal("records sent to the late output were counted as dropped")
	}
	must(t, h.EndOfInput())
	wantOutput(t, "output", h.Output()[3:], "a 1[10, 20) @19\n")
	checkClean(t, h)
}

func TestSessionAllowedLateness(t *testing.T) {
	h := open(t, countWindows(streamd.EventTimeSessionWindows(10*time.Millisecond),
		streamd.AllowedLateness(20*time.Millisecond), streamd.LateOutput("late")), streamdtest.Options{})
	feed(t, h, rec("a", "x", 0))
	must(t, h.ProcessWatermark(9))
	feed(t, h, rec("a", "x", 5))  // merges into the fired session: [0,15) fires at 14
	feed(t, h, rec("a", "x", -3)) // [-3,7) is late but allowed and merges: [-3,15)
	must(t, h.ProcessWatermark(14))
	wantOutput(t, "output", h.Output(), "a 1[0, 10) @9\na 3[-3, 15) @14\n")
	must(t, h.ProcessWatermark(40)) // cleanup at 14+20
	feed(t, h, rec("a", "x", 3))    // [3,13): cleanup 32 <= 40: late
	wantOutput(t, "late", h.SideOutput("late"), "a x @3\n")
	checkClean(t, h)
}

func TestProcessingTimeWindows(t *testing.T) {
	h := open(t, countWindows(streamd.TumblingProcessingTimeWindows(10*time.Millisecond, 0)), streamdtest.Options{AllowClock: true})
	must(t, h.SetProcessingTime(3))
	feed(t, h, rec("a", "x", streamd.NoTimestamp), rec("b", "x", 100), rec("a", "x", 0))
	must(t, h.SetProcessingTime(12))
	feed(t, h, rec("a", "x", 0))
	must(t, h.SetProcessingTime(19))
	wantOutput(t, "tumbling", h.Output(), "a 2[0, 10) @9\nb 1[0, 10) @9\na 1[10, 20) @19\n")

	h = open(t, countWindows(streamd.ProcessingTimeSessionWindows(5*time.Millisecond)), streamdtest.Options{AllowClock: true})
	must(t, h.SetProcessingTime(20))
	feed(t, h, rec("a", "x", 0))
	must(t, h.SetProcessingTime(23))
	feed(t, h, rec("a", "x", 0))
	must(t, h.SetProcessingTime(26)) // the session is [20,28): it fires at 27
	if len(h.Output()) != 0 {
		t.Fatalf("fired early: %v", lines(h.Output()))
	}
	must(t, h.SetProcessingTime(27))
	wantOutput(t, "session", h.Output(), "a 2[20, 28) @27\n")
	if n, ts := h.StateEntries(), h.ProcessingTimeTimers(); n != 0 || len(ts) != 0 {
		t.Fatalf("%d entries, timers %v left", n, ts)
	}

	h = open(t, countWindows(streamd.TumblingProcessingTimeWindows(10*time.Millisecond, 0)), streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("a", "x", 0), 0), "processing_time needs allow_clock: true")
}

func TestWindowMisconfiguration(t *testing.T) {
	for _, c := range []struct {
		op   streamd.Operator
		want string
	}{
		{countWindows(streamd.TumblingEventTimeWindows(0, 0)), "TumblingEventTimeWindows: size 0s is not positive"},
		{countWindows(streamd.SlidingEventTimeWindows(time.Second, 1500*time.Microsecond)), "slide 1.5ms is not a whole number of milliseconds"},
		{countWindows(streamd.TumblingEventTimeWindows(time.Second, 2*time.Second)), "offset 2s is not smaller than the size"},
		{countWindows(streamd.EventTimeSessionWindows(-time.Second)), "gap -1s is not positive"},
		{countWindows(streamd.EventTimeSessionWindows(time.Second), streamd.LateOutput("a b")), `LateOutput: side output name "a b"`},
		{streamd.Window(streamd.WindowAssigner{}, streamd.String, streamd.ReduceWindow(func(a, b string) string { return a })), "no window assigner"},
	} {
		h := streamdtest.New(c.op, streamdtest.Options{})
		failsWith(t, h.Open(), c.want)
	}
	h := open(t, countWindows(streamd.EventTimeSessionWindows(time.Second)), streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("a", "x", streamd.NoTimestamp), 0), `a record of key "a" has no event time`)
}

// event is one step of a random scenario: a record or a watermark.
type event struct {
	key       string
	ts        int64
	watermark bool
}

func randomEvents(rng *rand.Rand, n int) []event {
	var evs []event
	wm := int64(-1 << 62)
	maxTS := int64(0)
	for i := 0; i < n; i++ {
		if rng.IntN(8) == 0 {
			w := maxTS - int64(rng.IntN(30))
			if w > wm {
				wm = w
				evs = append(evs, event{ts: w, watermark: true})
			}
			continue
		}
		ts := int64(rng.IntN(400))
		maxTS = max(maxTS, ts)
		evs = append(evs, event{key: "k" + strconv.Itoa(rng.IntN(4)), ts: ts})
	}
	return evs
}

// referenceWindows computes what count windows of size/slide with lateness
// emit for evs, naively: the Flink semantics written out.
func referenceWindows(evs []event, size, slide, lateness int64) (out, late []string) {
	type win struct {
		key   string
		start int64
	}
	counts := map[win]int64{}
	wm := int64(-1 << 63)
	emit := func(w win) {
		out = append(out, fmt.Sprintf("%s %d[%d, %d) @%d", w.key, counts[w], w.start, w.start+size, w.start+size-1))
	}
	for _, e := range evs {
		if e.watermark {
			var due []win
			for w := range counts {
				if m := w.start + size - 1; m > wm && m <= e.ts {
					due = append(due, w)
				}
			}
			for _, w := range due {
				emit(w)
			}
			for w := range counts {
				if w.start+size-1+lateness <= e.ts {
					delete(counts, w)
				}
			}
			wm = e.ts
			continue
		}
		taken := false
		last := e.ts - ((e.ts%slide)+slide)%slide
		for s := last; s > e.ts-size; s -= slide {
			w := win{e.key, s}
			if s+size-1+lateness <= wm {
				continue
			}
			taken = true
			counts[w]++
			if s+size-1 <= wm {
				emit(w)
			}
		}
		if !taken && e.ts+lateness <= wm {
			late = append(late, fmt.Sprintf("%s x @%d", e.key, e.ts))
		}
	}
	for w := range counts {
		if w.start+size-1 > wm {
			emit(w)
		}
	}
	return out, late
}

// againstReference runs evs through operators of newOp straight, and
// stopped with a snapshot after cut events and restored at each of
// parallelisms (the watermark sent again after the restore), and compares
// output and late output with the reference's.
func againstReference(t *testing.T, name string, newOp func() streamd.Operator, evs []event, wantOut, wantLate []string, cut int, parallelisms ...int) {
	t.Helper()
	check := checker(t, name, wantOut, wantLate)
	h := open(t, newOp(), streamdtest.Options{})
	run(t, h, evs)
	must(t, h.EndOfInput())
	check("straight", h.Output(), h.SideOutput("late"))
	checkClean(t, h)

	h = open(t, newOp(), streamdtest.Options{})
	run(t, h, evs[:cut])
	snap := h.Snapshot(1)
	must(t, h.Err())
	out, late, wm := h.Output(), h.SideOutput("late"), h.Watermark()
	for _, p := range parallelisms {
		o, l := slices.Clone(out), slices.Clone(late)
		for sub := 0; sub < p; sub++ {
			r := open(t, newOp(), streamdtest.Options{Subtask: sub, Parallelism: p, Restore: &snap})
			if wm > streamd.MinWatermark {
				must(t, r.ProcessWatermark(wm)) // the watermark starts over after a restore
			}
			for _, e := range evs[cut:] {
				if e.watermark {
					must(t, r.ProcessWatermark(e.ts))
				} else if streamdtest.SubtaskOf([]byte(e.key), 128, p) == sub {
					must(t, r.ProcessElement(rec(e.key, "x", e.ts), 0))
				}
			}
			must(t, r.EndOfInput())
			checkClean(t, r)
			o, l = append(o, r.Output()...), append(l, r.SideOutput("late")...)
		}
		check(fmt.Sprintf("restored at p=%d", p), o, l)
	}
}

// checker returns a check of output and late output against a reference.
func checker(t *testing.T, name string, wantOut, wantLate []string) func(what string, out, late []streamd.Record) {
	return func(what string, out, late []streamd.Record) {
		t.Helper()
		if got := sortedLines(out); strings.Join(got, "\n") != strings.Join(wantOut, "\n") {
			t.Fatalf("%s %s: output\n%s\nwant\n%s", name, what, strings.Join(got, "\n"), strings.Join(wantOut, "\n"))
		}
		if got := sortedLines(late); strings.Join(got, "\n") != strings.Join(wantLate, "\n") {
			t.Fatalf("%s %s: late\n%s\nwant\n%s", name, what, strings.Join(got, "\n"), strings.Join(wantLate, "\n"))
		}
	}
}

func sortedLines(recs []streamd.Record) []string {
	l := strings.Split(strings.TrimSuffix(lines(recs), "\n"), "\n")
	if len(recs) == 0 {
		l = nil
	}
	sort.Strings(l)
	return l
}

func run(t *testing.T, h *streamdtest.Harness, evs []event) {
	t.Helper()
	for _, e := range evs {
		if e.watermark {
			must(t, h.ProcessWatermark(e.ts))
		} else {
			must(t, h.ProcessElement(rec(e.key, "x", e.ts), 0))
		}
	}
}

// TestWindowsAgainstReference runs random out-of-order records and
// watermarks through tumbling and sliding count windows with and without
// lateness, also restored from a snapshot in the middle (at the same and at
// another parallelism), and compares with referenceWindows.
func TestWindowsAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 40; i++ {
		size := int64(rng.IntN(40) + 1)
		slide := size
		if i%2 == 1 {
			slide = int64(rng.IntN(int(size)) + 1)
		}
		lateness := int64(0)
		if i%4 >= 2 {
			lateness = int64(rng.IntN(50))
		}
		evs := randomEvents(rng, 300)
		wantOut, wantLate := referenceWindows(evs, size, slide, lateness)
		sort.Strings(wantOut)
		sort.Strings(wantLate)
		ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
		newOp := func() *streamd.WindowOperator[string] {
			a := streamd.SlidingEventTimeWindows(ms(size), ms(slide))
			if slide == size {
				a = streamd.TumblingEventTimeWindows(ms(size), 0)
			}
			return countWindows(a, streamd.AllowedLateness(ms(lateness)), streamd.LateOutput("late"))
		}
		againstReference(t, fmt.Sprintf("size=%d,slide=%d,lateness=%d", size, slide, lateness), func() streamd.Operator { return newOp() },
			evs, wantOut, wantLate, len(evs)/2, 1, 3)
	}
}

// TestSessionRestoreMidSession snapshots while sessions are open and merge
// after the restore.
func TestSessionRestoreMidSession(t *testing.T) {
	h := open(t, listWindows(streamd.EventTimeSessionWindows(10*time.Millisecond), streamd.AllowedLateness(5*time.Millisecond)), streamdtest.Options{})
	feed(t, h, rec("a", "0", 0), rec("a", "30", 30), rec("b", "2", 2))
	must(t, h.ProcessWatermark(9))
	snap := h.Snapshot(7)
	must(t, h.Err())
	r := open(t, listWindows(streamd.EventTimeSessionWindows(10*time.Millisecond), streamd.AllowedLateness(5*time.Millisecond)), streamdtest.Options{Restore: &snap})
	must(t, r.ProcessWatermark(9))
	feed(t, r, rec("a", "15", 15), rec("a", "8", 8)) // [8,18) merges [0,10) (fired) and [15,25); [30,40) stays apart
	must(t, r.EndOfInput())
	wantOutput(t, "after the restore", r.Output(), "b 2[2, 12) @11\na 0,15,8[0, 25) @24\na 30[30, 40) @39\n")
	checkClean(t, r)
}

// referenceSessions computes what count session windows with gap and
// lateness emit for evs, naively: per key a list of sessions, merged as
// Flink's MergingWindowSet does (merge first, then drop a late result).
func referenceSessions(evs []event, gap, lateness int64) (out, late []string) {
	type sess struct{ start, end, n int64 }
	byKey := map[string][]sess{}
	wm := int64(-1 << 63)
	emit := func(k string, s sess) {
		out = append(out, fmt.Sprintf("%s %d[%d, %d) @%d", k, s.n, s.start, s.end, s.end-1))
	}
	for _, e := range evs {
		if e.watermark {
			for k, ss := range byKey {
				keep := ss[:0]
				for _, s := range ss {
					if m := s.end - 1; m > wm && m <= e.ts {
						emit(k, s)
					}
					if s.end-1+lateness > e.ts {
						keep = append(keep, s)
					}
				}
				byKey[k] = keep
			}
			wm = e.ts
			continue
		}
		m := sess{e.ts, e.ts + gap, 1}
		for changed := true; changed; { // grow m over the sessions it touches
			changed = false
			for _, s := range byKey[e.key] {
				if s.start <= m.end && s.end >= m.start && (s.start < m.start || s.end > m.end) {
					m.start, m.end, changed = min(m.start, s.start), max(m.end, s.end), true
				}
			}
		}
		var rest []sess
		n := int64(1)
		for _, s := range byKey[e.key] {
			if s.start <= m.end && s.end >= m.start {
				n += s.n
			} else {
				rest = append(rest, s)
			}
		}
		m.n = n
		if m.end-1+lateness <= wm {
			if e.ts+lateness <= wm {
				late = append(late, fmt.Sprintf("%s x @%d", e.key, e.ts))
			}
			continue
		}
		byKey[e.key] = append(rest, m)
		if m.end-1 <= wm {
			emit(e.key, m)
		}
	}
	for k, ss := range byKey {
		for _, s := range ss {
			if s.end-1 > wm {
				emit(k, s)
			}
		}
	}
	return out, late
}

// TestSessionWindowsAgainstReference runs random out-of-order records and
// watermarks through count session windows with and without lateness,
// straight and restored mid-stream at p=2, against referenceSessions.
func TestSessionWindowsAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	for i := 0; i < 40; i++ {
		gap := int64(rng.IntN(30) + 1)
		lateness := int64(0)
		if i%2 == 1 {
			lateness = int64(rng.IntN(60))
		}
		evs := randomEvents(rng, 300)
		wantOut, wantLate := referenceSessions(evs, gap, lateness)
		sort.Strings(wantOut)
		sort.Strings(wantLate)
		newOp := func() streamd.Operator {
			return countWindows(streamd.EventTimeSessionWindows(ms(gap)), streamd.AllowedLateness(ms(lateness)), streamd.LateOutput("late"))
		}
		againstReference(t, fmt.Sprintf("gap=%d,lateness=%d", gap, lateness), newOp, evs, wantOut, wantLate, len(evs)/3, 2)
	}
}
