package streamd_test

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/streamdtest"
)

func TestValueStateAndNamespaces(t *testing.T) {
	count := streamd.NewValueState("count", streamd.Int64)
	name := streamd.NewValueState("name", streamd.String)
	h := open(t, &fnOp{process: func(r streamd.Record, _ int) error {
		ns := count.In(r.Value) // one count per key and value
		n, _ := ns.Get()
		ns.Set(n + 1)
		total, _ := count.Get()
		count.Set(total + 1)
		if string(r.Value) == "reset" {
			count.Clear()
			name.Clear()
			return nil
		}
		name.Set(strings.Repeat(string(r.Value), 1000)) // larger than the scratch buffer
		v, ok := name.Get()
		if !ok || len(v) != 1000*len(r.Value) {
			return fmt.Errorf("name round trip: %d bytes", len(v))
		}
		streamd.Emit(r.Key, strconv.AppendInt([]byte(string(r.Value)+"="), n+1, 10), total+1)
		return nil
	}}, streamdtest.Options{})
	for _, r := range []streamd.Record{rec("a", "x", 0), rec("a", "y", 0), rec("a", "x", 0), rec("b", "x", 0), rec("a", "reset", 0), rec("a", "x", 0)} {
		must(t, h.ProcessElement(r, 0))
	}
	wantOutput(t, "output", h.Output(), "a x=1 @1\na y=1 @2\na x=2 @3\nb x=1 @1\na x=3 @1\n")
}

func TestListMapReducingAggregatingState(t *testing.T) {
	list := streamd.NewListState("list", streamd.String)
	m := streamd.NewMapState("map", streamd.String, streamd.Int64)
	sum := streamd.NewReducingState("sum", streamd.Int64, func(a, b int64) int64 { return a + b })
	avg := streamd.NewAggregatingState("avg", streamd.JSON[avgAcc](), avgAgg{})
	var out []string
	h := open(t, &fnOp{process: func(r streamd.Record, _ int) error {
		v := string(r.Value)
		switch {
		case v == "dump":
			var all []string
			for k, n := range m.All() {
				all = append(all, k+":"+strconv.FormatInt(n, 10))
				m.Contains(k) // state calls inside the loop are fine
			}
			s, _ := sum.Get()
			a, _ := avg.Get()
			out = append(out, fmt.Sprintf("%s list=%q map=%v empty=%v sum=%d avg=%.1f", r.Key, list.Get(), all, m.IsEmpty(), s, a))
		case v == "clear":
			list.Clear()
			m.Clear()
			sum.Clear()
			avg.Clear()
		case v == "update":
			list.Update([]string{"u1", "u2"})
			m.Remove("b")
		default:
			list.Add(v)
			n, _ := m.Get(v)
			m.Put(v, n+1)
			sum.Add(int64(len(v)))
			avg.Add(float64(len(v)))
		}
		return nil
	}}, streamdtest.Options{})
	for _, v := range []string{"a", "bb", "a", "dump", "update", "dump", "clear", "dump"} {
		must(t, h.ProcessElement(rec("k", v, 0), 0))
	}
	want := []string{
		`k list=["a" "bb" "a"] map=[a:2 bb:1] empty=false sum=4 avg=1.3`,
		`k list=["u1" "u2"] map=[a:2 bb:1] empty=false sum=4 avg=1.3`,
		`k list=[] map=[] empty=true sum=0 avg=0.0`,
	}
	if strings.Join(out, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(out, "\n"), strings.Join(want, "\n"))
	}
}

type avgAcc struct{ Sum, N float64 }

type avgAgg struct{}

func (avgAgg) CreateAccumulator() avgAcc      { return avgAcc{} }
func (avgAgg) Add(v float64, a avgAcc) avgAcc { return avgAcc{a.Sum + v, a.N + 1} }
func (avgAgg) GetResult(a avgAcc) float64     { return a.Sum / a.N }
func (avgAgg) Merge(a, b avgAcc) avgAcc       { return avgAcc{a.Sum + b.Sum, a.N + b.N} }

func TestStateTTL(t *testing.T) {
	written := streamd.NewValueState("written", streamd.String, streamd.WithTTL(10*time.Millisecond, streamd.UpdateOnCreateAndWrite))
	read := streamd.NewValueState("read", streamd.String, streamd.WithTTL(10*time.Millisecond, streamd.UpdateOnReadAndWrite))
	events := streamd.NewListState("events", streamd.String, streamd.WithTTL(10*time.Millisecond, streamd.UpdateOnCreateAndWrite))
	var got []string
	h := open(t, &fnOp{process: func(r streamd.Record, _ int) error {
		if string(r.Value) == "write" {
			written.Set("w")
			read.Set("r")
		}
		if string(r.Value) != "get" {
			events.Add(string(r.Value))
		}
		w, wok := written.Get()
		rd, rok := read.Get()
		got = append(got, fmt.Sprintf("%v:%s %v:%s %q", wok, w, rok, rd, events.Get()))
		return nil
	}}, streamdtest.Options{})
	step := func(now int64, v string) {
		t.Helper()
		must(t, h.SetProcessingTime(now))
		must(t, h.ProcessElement(rec("k", v, 0), 0))
	}
	step(0, "write") // both expire at 10; event 1 at 10
	step(5, "e2")    // read refreshes "read" to 15; e2 expires at 15
	step(10, "get")  // written and write gone; read refreshed to 20
	step(16, "get")  // e2 gone
	step(30, "get")  // read gone
	want := []string{
		`true:w true:r ["write"]`,
		`true:w true:r ["write" "e2"]`,
		`false: true:r ["e2"]`,
		`false: true:r []`,
		`false: false: []`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := h.StateEntries(); n != 0 {
		t.Fatalf("%d entries live after every TTL ran out", n)
	}

	// A TTL state created after Open cannot reach the host.
	h = open(t, &fnOp{process: func(r streamd.Record, _ int) error {
		streamd.NewValueState("late", streamd.Int64, streamd.WithTTL(time.Second, streamd.UpdateOnCreateAndWrite))
		return nil
	}}, streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("k", "v", 0), 0), `state "late": a state WithTTL is created in ProcessElement`)
}

func TestKeyedMisuseFails(t *testing.T) {
	count := streamd.NewValueState("count", streamd.Int64)
	raw := streamd.NewValueState("count", streamd.Bytes)
	h := streamdtest.New(&fnOp{open: func(*streamd.Context) error { count.Get(); return nil }}, streamdtest.Options{})
	failsWith(t, h.Open(), `state "count": no current key in Open`)

	h = open(t, &fnOp{watermark: func(int64) error { streamd.RegisterEventTimeTimer(1); return nil }}, streamdtest.Options{})
	failsWith(t, h.ProcessWatermark(5), "RegisterEventTimeTimer(1): no current key in OnWatermark")

	h = open(t, &fnOp{process: func(r streamd.Record, _ int) error { raw.Set([]byte("abc")); count.Get(); return nil }}, streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("k", "v", 0), 0), `state "count": cannot decode the value: Int64: 3 bytes, not 8`)

	h = open(t, &fnOp{process: func(r streamd.Record, _ int) error { count.Set(1); return nil }}, streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("", "v", 0), 0), "the current key is empty in ProcessElement")

	// A key of another subtask's key groups fails as on the host.
	var foreign string
	for i := 0; ; i++ {
		if k := "k" + strconv.Itoa(i); streamdtest.SubtaskOf([]byte(k), 128, 2) == 1 {
			foreign = k
			break
		}
	}
	h = open(t, &fnOp{process: func(r streamd.Record, _ int) error { count.Set(1); return nil }}, streamdtest.Options{Parallelism: 2})
	failsWith(t, h.ProcessElement(rec(foreign, "v", 0), 0), "outside this subtask's key groups")

	h = open(t, &fnOp{process: func(r streamd.Record, _ int) error { streamd.CurrentProcessingTime(); return nil }}, streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("k", "v", 0), 0), "processing_time needs allow_clock: true (job file)")
}

func TestTimers(t *testing.T) {
	seen := streamd.NewListState("seen", streamd.String)
	var log []string
	op := &fnOp{
		process: func(r streamd.Record, _ int) error {
			seen.Add(string(r.Value))
			streamd.RegisterEventTimeTimer(r.Timestamp + 10)
			streamd.RegisterProcessingTimeTimer(r.Timestamp + 100)
			if string(r.Value) == "undo" {
				streamd.DeleteEventTimeTimer(r.Timestamp + 10)
				streamd.DeleteProcessingTimeTimer(r.Timestamp + 100)
			}
			return nil
		},
		timer: func(ts int64, key []byte) error {
			log = append(log, fmt.Sprintf("event %d %s %q key=%s", ts, key, seen.Get(), streamd.CurrentKey()))
			streamd.Emit(key, []byte("fired"), ts)
			streamd.RegisterEventTimeTimer(ts) // at the watermark: waits for the next advance
			return nil
		},
		ptime: func(ts int64, key []byte) error {
			log = append(log, fmt.Sprintf("processing %d %s", ts, key))
			return nil
		},
		watermark: func(ts int64) error { log = append(log, fmt.Sprintf("watermark %d", ts)); return nil },
	}
	h := open(t, op, streamdtest.Options{})
	must(t, h.ProcessElement(rec("b", "1", 5), 0))
	must(t, h.ProcessElement(rec("a", "2", 5), 0))
	must(t, h.ProcessElement(rec("a", "undo", 7), 0))
	must(t, h.ProcessWatermark(15))
	must(t, h.ProcessWatermark(15)) // no advance, nothing happens
	must(t, h.ProcessWatermark(16))
	must(t, h.SetProcessingTime(105))
	want := []string{
		`event 15 a ["2" "undo"] key=a`, `event 15 b ["1"] key=b`, "watermark 15",
		`event 15 a ["2" "undo"] key=a`, `event 15 b ["1"] key=b`, "watermark 16",
		"processing 105 a", "processing 105 b",
	}
	if strings.Join(log, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(log, "\n"), strings.Join(want, "\n"))
	}
	if got := h.ProcessingTimeTimers(); len(got) != 0 {
		t.Fatalf("processing timers left: %v", got)
	}
	if got := h.EventTimeTimers(); len(got) != 2 || got[0].TS != 15 {
		t.Fatalf("event timers %v", got)
	}
	must(t, h.Finish())
	must(t, h.SetProcessingTime(1000)) // no timers after Finish
}

func TestEmitToWatermarksAndInputs(t *testing.T) {
	h := open(t, &fnOp{
		open: func(*streamd.Context) error { streamd.EmitWatermark(1); return nil },
		process: func(r streamd.Record, input int) error {
			streamd.Emit(r.Key, r.Value, r.Timestamp)
			streamd.EmitTo("side-"+strconv.Itoa(input), r.Key, bytes.ToUpper(r.Value), r.Timestamp)
			streamd.EmitWatermark(r.Timestamp)
			streamd.Emit(r.Key, []byte(fmt.Sprintf("in0=%d in1=%d", streamd.InputWatermark(0), streamd.InputWatermark(1))), r.Timestamp)
			return nil
		},
		finish: func() error { streamd.EmitWatermark(100); return nil },
	}, streamdtest.Options{NumInputs: 2})
	must(t, h.ProcessInputWatermark(1, 7))
	must(t, h.ProcessElement(rec("k", "a", 5), 0))
	must(t, h.ProcessElement(rec("k", "b", 3), 1)) // 3 < 5: ignored
	must(t, h.ProcessElement(rec("k", "c", 9), 1))
	wantOutput(t, "main", h.Output(), "k a @5\nk in0=-9223372036854775808 in1=7 @5\nk b @3\nk in0=-9223372036854775808 in1=7 @3\nk c @9\nk in0=-9223372036854775808 in1=7 @9\n")
	wantOutput(t, "side-1", h.SideOutput("side-1"), "k B @3\nk C @9\n")
	if got := fmt.Sprint(h.EmittedWatermarks()); got != "[1 5 9]" {
		t.Fatalf("watermarks %s", got)
	}
	failsWith(t, h.Finish(), "EmitWatermark called in Finish")

	h = open(t, &fnOp{process: func(r streamd.Record, _ int) error { streamd.EmitTo("no spaces", nil, nil, 0); return nil }}, streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("k", "v", 0), 0), `side output name "no spaces" may hold only letters`)
	h = open(t, &fnOp{process: func(r streamd.Record, _ int) error { streamd.InputWatermark(3); return nil }}, streamdtest.Options{})
	failsWith(t, h.ProcessElement(rec("k", "v", 0), 0), "input_watermark: input 3 outside [0, 1)")
}

func TestRejectUndoesStateAndOutput(t *testing.T) {
	count := streamd.NewValueState("count", streamd.Int64)
	h := open(t, &fnOp{process: func(r streamd.Record, _ int) error {
		n, _ := count.Get()
		count.Set(n + 1)
		streamd.RegisterEventTimeTimer(n)
		streamd.Emit(r.Key, r.Value, n)
		if string(r.Value) == "bad" {
			return streamd.Reject(fmt.Errorf("bad record"))
		}
		return nil
	}}, streamdtest.Options{})
	must(t, h.ProcessElement(rec("k", "ok", 0), 0))
	if err := h.ProcessElement(rec("k", "bad", 0), 0); err == nil || !strings.Contains(err.Error(), "bad record") {
		t.Fatalf("reject: %v", err)
	}
	must(t, h.ProcessElement(rec("k", "ok2", 0), 0))
	wantOutput(t, "output", h.Output(), "k ok @0\nk ok2 @1\n")
	if got := h.EventTimeTimers(); len(got) != 2 {
		t.Fatalf("timers %v: the rejected record's timer is not undone", got)
	}
}

// TestSnapshotRestoreRescale counts per key at parallelism 2, restores the
// merged snapshots at parallelism 3 and checks every key continues from its
// count in the subtask that owns it now, with its timers; operator list
// state is split and unioned as the host does.
func TestSnapshotRestoreRescale(t *testing.T) {
	count := streamd.NewMapState("count", streamd.String, streamd.Int64)
	newOp := func(restored *[]string) *fnOp {
		return &fnOp{
			open: func(c *streamd.Context) error {
				for _, e := range streamd.ListState("split", streamd.Split).Entries() {
					*restored = append(*restored, "split:"+string(e))
				}
				for _, e := range streamd.ListState("union", streamd.Union).Entries() {
					*restored = append(*restored, "union:"+string(e))
				}
				return nil
			},
			process: func(r streamd.Record, _ int) error {
				n, _ := count.Get("n")
				count.Put("n", n+1)
				streamd.RegisterEventTimeTimer(100)
				return nil
			},
			timer: func(ts int64, key []byte) error {
				n, _ := count.Get("n")
				streamd.Emit(key, strconv.AppendInt(nil, n, 10), ts)
				return nil
			},
			snapshot: func(id int64) error {
				streamd.ListState("split", streamd.Split).Add([]byte(fmt.Sprintf("s%d-%d", id, 1)))
				streamd.ListState("split", streamd.Split).Add([]byte(fmt.Sprintf("s%d-%d", id, 2)))
				streamd.ListState("union", streamd.Union).Add([]byte(fmt.Sprintf("u%d", id)))
				return nil
			},
		}
	}
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	var snaps []streamdtest.Snapshot
	for sub := 0; sub < 2; sub++ {
		var restored []string
		h := open(t, newOp(&restored), streamdtest.Options{Subtask: sub, Parallelism: 2})
		for i, k := range keys {
			if streamdtest.SubtaskOf([]byte(k), 128, 2) != sub {
				continue
			}
			for j := 0; j <= i%3; j++ {
				must(t, h.ProcessElement(rec(k, "x", 0), 0))
			}
		}
		snaps = append(snaps, h.Snapshot(int64(10+sub)))
		must(t, h.Err())
	}
	all := streamdtest.Merge(snaps...)
	got := map[string]string{}
	var lists []string
	for sub := 0; sub < 3; sub++ {
		var restored []string
		h := open(t, newOp(&restored), streamdtest.Options{Subtask: sub, Parallelism: 3, Restore: &all})
		for _, k := range keys {
			if streamdtest.SubtaskOf([]byte(k), 128, 3) == sub {
				must(t, h.ProcessElement(rec(k, "x", 0), 0))
			}
		}
		must(t, h.ProcessWatermark(100))
		for _, r := range h.Output() {
			if _, dup := got[string(r.Key)]; dup {
				t.Fatalf("key %s fired in two subtasks", r.Key)
			}
			got[string(r.Key)] = string(r.Value)
		}
		lists = append(lists, fmt.Sprintf("%d:%v", sub, restored))
	}
	for i, k := range keys {
		if want := strconv.Itoa(i%3 + 2); got[k] != want {
			t.Errorf("key %s: count %q, want %s", k, got[k], want)
		}
	}
	// Split: the four entries of subtasks 0 and 1 round robin over three.
	want := "0:[split:s10-1 split:s11-2 union:u10 union:u11] 1:[split:s10-2 union:u10 union:u11] 2:[split:s11-1 union:u10 union:u11]"
	if strings.Join(lists, " ") != want {
		t.Fatalf("list state\n%s\nwant\n%s", strings.Join(lists, " "), want)
	}
}
