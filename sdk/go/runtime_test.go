//go:build !wasip1

package streamd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/streamd/streamd/sdk/go/internal/hook"
)

// fakeHost is an in-memory host for native tests of the SDK's dispatch.
type fakeHost struct {
	hook.Host            // the SPEC14 imports: the tests of those use streamdtest
	frames    [][]Record // one entry per emit call
	state     map[string][]byte
	lists     map[string][][]byte
	listModes map[string]int32
	timers    map[string]bool
	watermark int64
	logs      []string
	fails     []string
	rejects   []string
}

func newFakeHost() *fakeHost {
	return &fakeHost{state: map[string][]byte{}, lists: map[string][][]byte{}, listModes: map[string]int32{},
		timers: map[string]bool{}, watermark: MinWatermark}
}

func (h *fakeHost) Emit(frame []byte) {
	recs, err := decodeFrame(frame) // copies: the SDK reuses its buffer
	if err != nil {
		h.fails = append(h.fails, "host: bad emit frame: "+err.Error())
		return
	}
	h.frames = append(h.frames, recs)
}

func sk(name string, key []byte) string { return name + "\x00" + string(key) }

func (h *fakeHost) StateGet(name string, key, buf []byte) int32 {
	v, ok := h.state[sk(name, key)]
	if !ok {
		return -1
	}
	if len(v) <= len(buf) {
		copy(buf, v)
	}
	return int32(len(v))
}
func (h *fakeHost) StatePut(name string, key, val []byte) { h.state[sk(name, key)] = bytes.Clone(val) }
func (h *fakeHost) StateDelete(name string, key []byte)   { delete(h.state, sk(name, key)) }
func (h *fakeHost) ListAdd(name string, mode int32, val []byte) {
	h.listModes[name] = mode
	h.lists[name] = append(h.lists[name], bytes.Clone(val))
}
func (h *fakeHost) ListGet(name string, index int32, buf []byte) int32 {
	l := h.lists[name]
	if int(index) >= len(l) {
		return -1
	}
	if len(l[index]) <= len(buf) {
		copy(buf, l[index])
	}
	return int32(len(l[index]))
}
func (h *fakeHost) TimerRegister(key []byte, ts int64) {
	h.timers[string(key)+"@"+itoa(int(ts))] = true
}
func (h *fakeHost) TimerDelete(key []byte, ts int64) { delete(h.timers, string(key)+"@"+itoa(int(ts))) }
func (h *fakeHost) CurrentWatermark() int64          { return h.watermark }
func (h *fakeHost) Log(level int32, msg string)      { h.logs = append(h.logs, msg) }
func (h *fakeHost) Fail(msg string)                  { h.fails = append(h.fails, msg) }
func (h *fakeHost) Reject(msg string)                { h.rejects = append(h.rejects, msg) }

func (h *fakeHost) emitted() []Record {
	var all []Record
	for _, f := range h.frames {
		all = append(all, f...)
	}
	return all
}

// install runs o on a fresh fake host for the rest of the test.
func install(t *testing.T, o Operator) *fakeHost {
	t.Helper()
	h := newFakeHost()
	nativeHost, op = h, o
	t.Cleanup(func() { nativeHost, op, scratch = nil, nil, nil; out.reset() })
	return h
}

func rec(key, value string, ts int64) Record {
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	return Record{Key: k, Value: []byte(value), Timestamp: ts}
}

// funcOp adapts a ProcessElement function, with hooks for the other phases.
type funcOp struct {
	Base
	process  func(r Record, input int) error
	snapshot func(id int64) error
	open     func(c *Context) error
}

func (f *funcOp) ProcessElement(r Record, input int) error { return f.process(r, input) }
func (f *funcOp) SnapshotState(id int64) error {
	if f.snapshot != nil {
		return f.snapshot(id)
	}
	return nil
}
func (f *funcOp) Open(c *Context) error {
	if f.open != nil {
		return f.open(c)
	}
	return nil
}

func TestProcessEmitsOneFramePerCall(t *testing.T) {
	var inputs []int
	h := install(t, &funcOp{process: func(r Record, input int) error {
		inputs = append(inputs, input)
		Emit(r.Key, append([]byte("<"), r.Value...), r.Timestamp)
		EmitRecord(Record{Value: []byte("second"), Timestamp: NoTimestamp})
		return nil
	}})
	if st := doProcess(1, batch(rec("a", "x", 5), rec("", "y", NoTimestamp))); st != statusOK {
		t.Fatalf("status %d, fails %q", st, h.fails)
	}
	if len(h.frames) != 1 {
		t.Fatalf("%d emit calls, want 1 per export call", len(h.frames))
	}
	want := []Record{rec("a", "<x", 5), rec("", "second", NoTimestamp), rec("", "<y", NoTimestamp), rec("", "second", NoTimestamp)}
	if got := h.emitted(); !sameRecords(got, want) {
		t.Fatalf("emitted %v, want %v", got, want)
	}
	if len(inputs) != 2 || inputs[0] != 1 || inputs[1] != 1 {
		t.Fatalf("inputs %v, want [1 1]", inputs)
	}
	if st := doProcess(0, batch()); st != statusOK || len(h.frames) != 1 {
		t.Fatalf("empty batch: status %d, %d emit calls (want no new emit)", st, len(h.frames))
	}
}

func TestEmitFlushesLargeOutput(t *testing.T) {
	val := bytes.Repeat([]byte("v"), 1000)
	h := install(t, &funcOp{process: func(r Record, input int) error {
		for i := 0; i < 200; i++ {
			Emit(nil, val, int64(i))
		}
		return nil
	}})
	if st := doProcess(0, batch(rec("", "go", 0))); st != statusOK {
		t.Fatalf("status %d", st)
	}
	got := h.emitted()
	if len(got) != 200 || len(h.frames) < 3 {
		t.Fatalf("%d records in %d frames, want 200 records in >= 3 frames (flush at %d bytes)", len(got), len(h.frames), flushThreshold)
	}
	for i, r := range got {
		if r.Timestamp != int64(i) {
			t.Fatalf("record %d has ts %d: order lost across flushes", i, r.Timestamp)
		}
	}
	for i, f := range h.frames {
		if size := frameSize(f); size > flushThreshold+recordSize(f[0]) {
			t.Fatalf("frame %d is %d bytes", i, size)
		}
	}
}

// TestRejectReturnsStatusReject: Reject from ProcessElement gives the reason
// to the reject import and returns status 3 without failing or emitting;
// from another method it fails the subtask.
func TestRejectReturnsStatusReject(t *testing.T) {
	h := install(t, &funcOp{
		process: func(r Record, input int) error {
			Emit(nil, []byte("dropped"), 0)
			if string(r.Value) == "bad" {
				return Reject(errors.New("value is bad"))
			}
			return nil
		},
		snapshot: func(int64) error { return Reject(nil) },
	})
	if st := doProcess(0, batch(rec("", "ok", 0), rec("", "bad", 0))); st != statusReject {
		t.Fatalf("status %d, want %d (fails %q)", st, statusReject, h.fails)
	}
	if len(h.rejects) != 1 || h.rejects[0] != "value is bad" || len(h.fails) != 0 || len(h.frames) != 0 {
		t.Fatalf("rejects %q, fails %q, %d frames; want one reject, no fail, no frame", h.rejects, h.fails, len(h.frames))
	}
	if st := doSnapshot(1); st != statusError || len(h.fails) != 1 || !strings.Contains(h.fails[0], "SnapshotState: rejected") {
		t.Fatalf("Reject in SnapshotState: status %d, fails %q; want a fail", st, h.fails)
	}
}

func TestPanicBecomesFail(t *testing.T) {
	h := install(t, &funcOp{process: func(r Record, input int) error {
		Emit(nil, []byte("dropped"), 0)
		if string(r.Value) == "boom" {
			panic("guest exploded")
		}
		return nil
	}})
	if st := doProcess(0, batch(rec("", "ok", 0), rec("", "boom", 0))); st != statusError {
		t.Fatalf("status %d, want %d", st, statusError)
	}
	if len(h.fails) != 1 {
		t.Fatalf("fails %q, want one", h.fails)
	}
	msg := h.fails[0]
	for _, want := range []string{"panic in ProcessElement: guest exploded", "goroutine", "runtime_test.go"} {
		if !strings.Contains(msg, want) {
			t.Errorf("fail message lacks %q:\n%s", want, msg)
		}
	}
	if len(h.frames) != 0 {
		t.Errorf("records of the failed call reached the host: %v", h.frames)
	}
	// A runtime error panics with an error value.
	h2 := install(t, &funcOp{process: func(r Record, input int) error {
		var m map[string]int
		m["x"] = 1
		return nil
	}})
	doProcess(0, batch(rec("", "x", 0)))
	if len(h2.fails) != 1 || !strings.Contains(h2.fails[0], "assignment to entry in nil map") {
		t.Fatalf("fails %q", h2.fails)
	}
}

func TestErrorAndFail(t *testing.T) {
	h := install(t, &funcOp{process: func(r Record, input int) error {
		if string(r.Value) == "fail" {
			Fail("explicit failure")
		}
		return errors.New("bad record " + string(r.Value))
	}})
	if st := doProcess(0, batch(rec("", "v1", 0))); st != statusError {
		t.Fatalf("status %d", st)
	}
	if st := doProcess(0, batch(rec("", "fail", 0))); st != statusError {
		t.Fatalf("status %d", st)
	}
	want := []string{"ProcessElement: bad record v1", "explicit failure"}
	if strings.Join(h.fails, "|") != strings.Join(want, "|") {
		t.Fatalf("fails %q, want %q", h.fails, want)
	}
}

func TestEmitOutsideAllowedPhases(t *testing.T) {
	h := install(t, &funcOp{
		process:  func(Record, int) error { return nil },
		snapshot: func(int64) error { Emit(nil, []byte("x"), 0); return nil },
	})
	if st := doSnapshot(7); st != statusError {
		t.Fatalf("status %d", st)
	}
	if len(h.fails) != 1 || !strings.Contains(h.fails[0], "Emit called in SnapshotState") {
		t.Fatalf("fails %q", h.fails)
	}
}

func TestNoOperatorRegistered(t *testing.T) {
	h := install(t, nil)
	if st := doOpen(contextFrame(t, "j", "")); st != statusError {
		t.Fatalf("status %d", st)
	}
	if len(h.fails) != 1 || !strings.Contains(h.fails[0], "streamd.Register") {
		t.Fatalf("fails %q", h.fails)
	}
}

func TestInvalidFrames(t *testing.T) {
	called := false
	h := install(t, &funcOp{process: func(Record, int) error { called = true; return nil }})
	frame := batch(rec("k", "v", 1))
	if st := doProcess(0, frame[:len(frame)-1]); st != statusInvalidInput {
		t.Fatalf("truncated batch: status %d", st)
	}
	if st := doOpen([]byte{1, 0, 0}); st != statusInvalidInput {
		t.Fatalf("truncated context: status %d", st)
	}
	if called || len(h.logs) != 2 || !strings.Contains(h.logs[0], "malformed frame") {
		t.Fatalf("called %v, logs %q", called, h.logs)
	}
}

func TestOpenContextAndListState(t *testing.T) {
	var got *Context
	var entries [][]byte
	var missing bool
	total := ListState("total", Split)
	h := install(t, &funcOp{
		process: func(Record, int) error { return nil },
		open: func(c *Context) error {
			got = c
			entries = total.Entries()
			_, ok := ListState("none", Union).Get(0)
			missing = !ok
			return nil
		},
		snapshot: func(id int64) error {
			total.AddUint64(uint64(id))
			ListState("big", Broadcast).Add(bytes.Repeat([]byte("b"), 1000))
			return nil
		},
	})
	h.lists["total"] = [][]byte{[]byte("one"), bytes.Repeat([]byte("2"), 500)} // larger than the scratch buffer
	// Subtask 1 of 2, 128 key groups, one input, restored, config k: v.
	if st := doOpen(contextFrame(t, "j", "op")); st != statusOK {
		t.Fatalf("status %d, fails %q", st, h.fails)
	}
	if got.Job != "j" || got.Operator != "op" || got.Subtask != 1 || !got.Restored || got.Config.String("k", "") != "v" {
		t.Fatalf("context %+v", got)
	}
	if len(entries) != 2 || string(entries[0]) != "one" || len(entries[1]) != 500 || !missing {
		t.Fatalf("entries %q, missing %v", entries, missing)
	}
	h.lists = map[string][][]byte{}
	if st := doSnapshot(42); st != statusOK {
		t.Fatalf("snapshot status %d", st)
	}
	if l := h.lists["total"]; len(l) != 1 || binary.LittleEndian.Uint64(l[0]) != 42 || h.listModes["total"] != int32(Split) {
		t.Fatalf("total list %q mode %d", l, h.listModes["total"])
	}
	if h.listModes["big"] != int32(Broadcast) || len(h.lists["big"][0]) != 1000 {
		t.Fatal("broadcast list not written")
	}
}

func TestKeyedState(t *testing.T) {
	count := ValueState("count")
	blob := ValueState("blob")
	h := install(t, &funcOp{process: func(r Record, input int) error {
		n, _ := count.GetInt64(r.Key)
		count.PutInt64(r.Key, n+1)
		big := bytes.Repeat(r.Value, 300) // larger than any scratch buffer so far
		blob.Put(r.Key, big)
		if v, ok := blob.Get(r.Key); !ok || !bytes.Equal(v, big) {
			return errors.New("blob round trip failed")
		}
		if v, ok := blob.AppendGet([]byte("pre:"), r.Key); !ok || !bytes.HasPrefix(v, []byte("pre:")) || len(v) != 4+len(big) {
			return errors.New("AppendGet failed")
		}
		if string(r.Value) == "del" {
			count.Delete(r.Key)
		}
		RegisterEventTimeTimer(r.Timestamp + 10)
		return nil
	}})
	if st := doProcess(0, batch(rec("a", "x", 1), rec("a", "y", 2), rec("b", "z", 3), rec("b", "del", 4))); st != statusOK {
		t.Fatalf("status %d, fails %q", st, h.fails)
	}
	if v := h.state[sk("count", []byte("a"))]; binary.LittleEndian.Uint64(v) != 2 {
		t.Fatalf("count of a = %v", v)
	}
	if _, ok := h.state[sk("count", []byte("b"))]; ok {
		t.Fatal("count of b not deleted")
	}
	if len(h.timers) != 4 || !h.timers["a@11"] {
		t.Fatalf("timers %v", h.timers)
	}
	// A value of the wrong size fails the subtask with a message naming the state.
	h.state[sk("count", []byte("a"))] = []byte("abc")
	if st := doProcess(0, batch(rec("a", "x", 1))); st != statusError || !strings.Contains(h.fails[0], `state "count" holds 3 bytes`) {
		t.Fatalf("status %d, fails %q", st, h.fails)
	}
}

func TestStatelessHelpers(t *testing.T) {
	h := install(t, Filter(func(r Record) bool { return len(r.Value) > 1 }))
	doProcess(0, batch(rec("", "a", 1), rec("k", "bb", 2)))
	if got := h.emitted(); !sameRecords(got, []Record{rec("k", "bb", 2)}) {
		t.Fatalf("Filter emitted %v", got)
	}
	h = install(t, FlatMap(func(r Record, emit func(Record)) {
		for _, c := range r.Value {
			emit(Record{Key: r.Key, Value: []byte{c}, Timestamp: r.Timestamp})
		}
	}))
	doProcess(0, batch(rec("k", "xy", 3)))
	if got := h.emitted(); !sameRecords(got, []Record{rec("k", "x", 3), rec("k", "y", 3)}) {
		t.Fatalf("FlatMap emitted %v", got)
	}
}

// TestProcessDoesNotAllocatePerRecord checks the batch loop of a Map that
// reuses its output buffer: a batch costs the same few allocations whatever
// its size.
func TestProcessDoesNotAllocatePerRecord(t *testing.T) {
	var buf []byte
	install(t, Map(func(r Record) Record {
		buf = append(buf[:0], r.Value...)
		r.Value = buf
		return r
	}))
	emits := 0
	nativeHost = countingHost{fakeHost: newFakeHost(), emits: &emits}
	perBatch := func(n int) float64 {
		recs := make([]Record, n)
		for i := range recs {
			recs[i] = rec("key", "some value", int64(i))
		}
		frame := batch(recs...)
		doProcess(0, frame) // grow the buffers
		return testing.AllocsPerRun(20, func() { doProcess(0, frame) })
	}
	small, large := perBatch(10), perBatch(2000)
	if small != large || large > 2 {
		t.Fatalf("allocations per batch: %v for 10 records, %v for 2000", small, large)
	}
	if emits == 0 {
		t.Fatal("nothing emitted")
	}
}

// countingHost counts emit calls without decoding (which would allocate).
type countingHost struct {
	*fakeHost
	emits *int
}

func (c countingHost) Emit([]byte) { *c.emits++ }
