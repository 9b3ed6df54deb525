package conformance

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testlog"
	"github.com/streamd/streamd/internal/testwasm"
)

// guests are the implementations of the conformance operator (guests/SPEC.md).
var guests = []struct{ name, target string }{
	{"wat", "internal/conformance/guests/wat/conformance.wasm"},
	{"go", "internal/conformance/guests/go/conformance.wasm"},
	{"rust", "internal/conformance/guests/rust/conformance.wasm"},
}

var cacheDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "streamd-conformance-cache-")
	if err != nil {
		panic(err)
	}
	cacheDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// TestConformance runs every scenario over every guest whose make target
// exists. A guest with a target that fails to build fails the test.
func TestConformance(t *testing.T) {
	for _, g := range guests {
		t.Run(g.name, func(t *testing.T) {
			h := newHarness(t, g.name, guestPath(t, g.name, g.target))
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) { sc.run(t, h) })
			}
			// The scenarios that keep keyed state, again with the pebble backend.
			p := *h
			p.state = host.StateConfig{Backend: host.BackendPebble, DataDir: t.TempDir()}
			for _, sc := range scenarios {
				if sc.keyed {
					t.Run(sc.name+"/pebble", func(t *testing.T) { sc.run(t, &p) })
				}
			}
		})
	}
}

// guestPath builds a guest's make target and returns its path; it skips
// the test for an SDK guest without a target yet (the WAT guests must have one).
func guestPath(t *testing.T, guest, target string) string {
	t.Helper()
	ok, err := testwasm.HasTarget(target)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		if guest == "wat" {
			t.Fatalf("no make target for %s (mk/wat.mk)", target)
		}
		t.Skipf("no make target for %s yet", target)
	}
	return testwasm.Path(t, target)
}

var scenarios = []struct {
	name  string
	run   func(*testing.T, *harness)
	keyed bool // uses keyed state or timers: run with each state backend
}{
	{"basic", testBasic, true},
	{"delete", testDelete, true},
	{"two_inputs", testTwoInputs, true},
	{"timers_watermarks", testTimers, true},
	{"snapshot_restore", testSnapshotRestore, true},
	{"rescale_restore", testRescale, true},
	{"final_checkpoint_and_logs", testFinalCheckpointAndLogs, true},
	{"fail_in_open", testFailInOpen, false},
	{"panic", testPanic, false},
	{"oob", testOOB, false},
	{"grow", testGrow, false},
	{"spin", testSpin, false},
	{"reject_and_replace", testRejectAndReplace, true},
}

// harness holds engines for one guest module. All engines share a cache dir.
type harness struct {
	guest string
	path  string
	logs  *testlog.Capture
	plain *host.Module // 128 MiB memory limit, no deadline
	small *host.Module // 64 MiB memory limit (grow)
	timed *host.Module // 500 ms call deadline (spin)
	state host.StateConfig
}

func newHarness(t *testing.T, guest, path string) *harness {
	ctx := context.Background()
	logs := testlog.New()
	h := &harness{guest: guest, path: path, logs: logs}
	load := func(opts ...host.Option) *host.Module {
		opts = append([]host.Option{host.WithCacheDir(cacheDir), host.WithLogger(slog.New(logs))}, opts...)
		e, err := host.NewEngine(ctx, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(ctx) })
		m, err := e.LoadFile(ctx, path)
		if err != nil {
			t.Fatalf("load %s guest: %v", guest, err)
		}
		return m
	}
	h.plain = load(host.WithMemoryLimitMiB(128))
	h.small = load(host.WithMemoryLimitMiB(64))
	h.timed = load(host.WithMemoryLimitMiB(128), host.WithCallDeadline(500*time.Millisecond))
	return h
}

// sub is one running instance and the records it emitted.
type sub struct {
	t    *testing.T
	inst *host.Instance
	out  []abi.Record
}

func (s *sub) emit(recs []abi.Record) { s.out = append(s.out, recs...) }

// take returns and clears the records emitted so far.
func (s *sub) take() []abi.Record {
	out := s.out
	s.out = nil
	return out
}

func (h *harness) start(t *testing.T, m *host.Module, cfg host.InstanceConfig) *sub {
	t.Helper()
	if cfg.Job == "" {
		cfg.Job = "conf"
	}
	if cfg.Operator == "" {
		cfg.Operator = "conformance"
	}
	if cfg.Parallelism == 0 {
		cfg.Parallelism = 1
	}
	if cfg.NumInputs == 0 {
		cfg.NumInputs = 1
	}
	cfg.State = h.state
	inst, err := m.NewInstance(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new instance: %v", err)
	}
	t.Cleanup(func() { inst.Close(context.Background()) })
	s := &sub{t: t, inst: inst}
	if err := inst.Open(context.Background()); err != nil {
		t.Fatalf("open: %v", err)
	}
	return s
}

func (s *sub) process(input int, recs ...abi.Record) {
	s.t.Helper()
	if err := s.inst.Process(context.Background(), input, recs, s.emit); err != nil {
		s.t.Fatalf("process: %v", err)
	}
}

// replace swaps the failed instance for the one Replace opens, and drops
// what was emitted so far.
func (s *sub) replace() {
	s.t.Helper()
	ctx := context.Background()
	n, err := s.inst.Replace(ctx)
	if err != nil {
		s.t.Fatalf("replace: %v", err)
	}
	s.inst.Close(ctx)
	s.inst = n
	s.t.Cleanup(func() { n.Close(ctx) })
	s.take()
}

func (s *sub) watermark(ts int64) {
	s.t.Helper()
	if err := s.inst.AdvanceWatermark(context.Background(), ts, s.emit); err != nil {
		s.t.Fatalf("watermark %d: %v", ts, err)
	}
}

func (s *sub) endInput(i int) {
	s.t.Helper()
	if err := s.inst.EndInput(context.Background(), i, s.emit); err != nil {
		s.t.Fatalf("end_input %d: %v", i, err)
	}
}

func (s *sub) finish() {
	s.t.Helper()
	if err := s.inst.Finish(context.Background(), s.emit); err != nil {
		s.t.Fatalf("finish: %v", err)
	}
}

func (s *sub) snapshot(id int64) *host.Snapshot {
	s.t.Helper()
	snap, err := s.inst.SnapshotState(context.Background(), id)
	if err != nil {
		s.t.Fatalf("snapshot_state %d: %v", id, err)
	}
	if err := snap.Load(); err != nil { // a pebble cut: read it now
		s.t.Fatalf("snapshot_state %d: load: %v", id, err)
	}
	return snap
}

// --- record helpers --------------------------------------------------------

func rec(key, value string, ts int64) abi.Record {
	r := abi.Record{Value: []byte(value), Timestamp: ts}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

func u64(n uint64) string { return string(binary.LittleEndian.AppendUint64(nil, n)) }

// counted is what process emits for a counted record.
func counted(key, value string, input byte, count uint64, ts int64) abi.Record {
	return rec(key, value+string([]byte{input})+u64(count), ts)
}

func show(recs []abi.Record) string {
	var b strings.Builder
	for _, r := range recs {
		ts := fmt.Sprint(r.Timestamp)
		switch r.Timestamp {
		case abi.NoTimestamp:
			ts = "none"
		case abi.MaxWatermark:
			ts = "max"
		}
		fmt.Fprintf(&b, "\n\t(%q, %q, %s)", r.Key, r.Value, ts)
	}
	return b.String()
}

func expect(t *testing.T, what string, got []abi.Record, want ...abi.Record) {
	t.Helper()
	if show(got) != show(want) {
		t.Errorf("%s: got records%s\nwant%s", what, show(got), show(want))
	}
}

// keysIn returns n keys whose key groups belong to subtask of parallelism.
func keysIn(subtask, parallelism, n int) []string {
	r := abi.RangeForSubtask(subtask, abi.DefaultMaxParallelism, parallelism)
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		if r.Contains(abi.KeyGroup([]byte(k), abi.DefaultMaxParallelism)) {
			keys = append(keys, k)
		}
	}
	return keys
}

func countState(t *testing.T, snap *host.Snapshot, key string) (uint64, bool) {
	t.Helper()
	kg := abi.KeyGroup([]byte(key), abi.DefaultMaxParallelism)
	g := snap.KeyGroups[kg]
	if g == nil {
		return 0, false
	}
	v, ok := g.Entries["count"][key]
	if !ok {
		return 0, false
	}
	if len(v) != 8 {
		t.Fatalf("count state of %q is %d bytes, want 8", key, len(v))
	}
	return binary.LittleEndian.Uint64(v), true
}

// --- scenarios ------------------------------------------------------------

func testBasic(t *testing.T, h *harness) {
	s := h.start(t, h.plain, host.InstanceConfig{})
	s.process(0, rec("a", "x", 1), rec("b", "y", 2), rec("a", "zz", 3))
	expect(t, "process", s.take(),
		counted("a", "x", 0, 1, 1), counted("b", "y", 0, 1, 2), counted("a", "zz", 0, 2, 3))
	s.process(0) // an empty batch is legal
	s.process(0, rec("b", "", abi.NoTimestamp))
	expect(t, "process", s.take(), counted("b", "", 0, 2, abi.NoTimestamp))

	snap := s.snapshot(1)
	for key, want := range map[string]uint64{"a": 2, "b": 2} {
		if got, ok := countState(t, snap, key); !ok || got != want {
			t.Errorf("keyed state count[%q] = %d (present %v), want %d", key, got, ok, want)
		}
	}
	if l := snap.Lists["total"]; l == nil || l.Mode != abi.ListSplit || len(l.Entries) != 1 || string(l.Entries[0]) != u64(4) {
		t.Errorf("list state total = %+v, want split [u64(4)]", l)
	}
	if l := snap.Lists["ckpt"]; l == nil || l.Mode != abi.ListUnion || len(l.Entries) != 1 || string(l.Entries[0]) != u64(1) {
		t.Errorf("list state ckpt = %+v, want union [u64(1)]", l)
	}
	if len(s.take()) != 0 {
		t.Error("snapshot_state emitted records")
	}
	s.endInput(0)
	s.finish()
	expect(t, "end_input+finish", s.take(), rec("", "end\x00", abi.NoTimestamp), rec("", "finish"+u64(4), abi.NoTimestamp))
}

func testDelete(t *testing.T, h *harness) {
	s := h.start(t, h.plain, host.InstanceConfig{})
	s.process(0, rec("a", "x", 1), rec("a", "del", 2), rec("a", "y", 3), rec("b", "del", 4))
	expect(t, "process", s.take(),
		counted("a", "x", 0, 1, 1), rec("a", "del", 2), counted("a", "y", 0, 1, 3), rec("b", "del", 4))
	snap := s.snapshot(1)
	if _, ok := countState(t, snap, "b"); ok {
		t.Error("deleted key b still has count state")
	}
	s.finish()
	expect(t, "finish", s.take(), rec("", "finish"+u64(2), abi.NoTimestamp))
}

func testTwoInputs(t *testing.T, h *harness) {
	s := h.start(t, h.plain, host.InstanceConfig{NumInputs: 2})
	s.process(0, rec("a", "left", 10))
	s.process(1, rec("a", "right", 11), rec("c", "right", 12))
	s.process(0, rec("c", "left", 13))
	expect(t, "process", s.take(),
		counted("a", "left", 0, 1, 10), counted("a", "right", 1, 2, 11),
		counted("c", "right", 1, 1, 12), counted("c", "left", 0, 2, 13))
	s.endInput(1)
	s.endInput(0)
	s.finish()
	expect(t, "end", s.take(),
		rec("", "end\x01", abi.NoTimestamp), rec("", "end\x00", abi.NoTimestamp), rec("", "finish"+u64(4), abi.NoTimestamp))
}

func testTimers(t *testing.T, h *harness) {
	s := h.start(t, h.plain, host.InstanceConfig{})
	if w := s.inst.Watermark(); w != abi.MinWatermark {
		t.Errorf("initial watermark %d, want MinWatermark", w)
	}
	s.process(0, rec("k1", "timer", 100), rec("k2", "timer", 50), rec("k3", "timer", 100), rec("k1", "timer", 100))
	expect(t, "process", s.take(),
		counted("k1", "timer", 0, 1, 100), counted("k2", "timer", 0, 1, 50),
		counted("k3", "timer", 0, 1, 100), counted("k1", "timer", 0, 2, 100))

	s.watermark(59)
	expect(t, "watermark 59", s.take(), rec("", "wm", 59))
	s.watermark(60)
	expect(t, "watermark 60", s.take(), rec("k2", "timer", 60), rec("", "wm", 60))
	s.watermark(60)
	s.watermark(10)
	expect(t, "watermark not advancing", s.take())
	if w := s.inst.Watermark(); w != 60 {
		t.Errorf("watermark %d, want 60", w)
	}

	// a timer registered below the watermark fires at the next advance
	s.process(0, rec("k2", "timer", 20))
	expect(t, "late timer", s.take(), counted("k2", "timer", 0, 2, 20))
	snap := s.snapshot(1)
	var timers []string
	for _, g := range snap.KeyGroups {
		for _, tm := range g.Timers {
			timers = append(timers, fmt.Sprintf("%s@%d", tm.Key, tm.TS))
		}
	}
	slices.Sort(timers)
	if want := []string{"k1@110", "k2@30", "k3@110"}; !slices.Equal(timers, want) {
		t.Errorf("snapshot timers %v, want %v (one per (key, ts))", timers, want)
	}

	s.watermark(abi.MaxWatermark)
	expect(t, "MAX watermark", s.take(),
		rec("k2", "timer", 30), rec("k1", "timer", 110), rec("k3", "timer", 110), rec("", "wm", abi.MaxWatermark))
	s.finish()
	expect(t, "finish", s.take(), rec("", "finish"+u64(5), abi.NoTimestamp))
}

func testSnapshotRestore(t *testing.T, h *harness) {
	a := h.start(t, h.plain, host.InstanceConfig{Attempt: 0})
	a.process(0, rec("a", "x", 1), rec("a", "x", 2), rec("b", "timer", 5))
	a.take()
	snap := a.snapshot(42)
	// the snapshot travels through its binary form, as in a checkpoint
	data, err := snap.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var restored host.Snapshot
	if err := restored.UnmarshalBinary(data); err != nil {
		t.Fatal(err)
	}
	// work after the snapshot is lost on restore
	a.process(0, rec("a", "lost", 6))
	if err := a.inst.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}

	b := h.start(t, h.plain, host.InstanceConfig{Attempt: 1, Restore: &restored})
	b.process(0, rec("a", "x", 7), rec("b", "x", 8))
	expect(t, "after restore", b.take(), counted("a", "x", 0, 3, 7), counted("b", "x", 0, 2, 8))
	b.watermark(100)
	expect(t, "restored timer", b.take(), rec("b", "timer", 15), rec("", "wm", 100))
	b.finish()
	expect(t, "finish", b.take(), rec("", "finish"+u64(5), abi.NoTimestamp))
}

// testRescale restores a parallelism-1 snapshot into two subtasks, split the
// way the runtime redistributes: key groups by range, split list state round robin.
func testRescale(t *testing.T, h *harness) {
	keys := append(keysIn(0, 2, 2), keysIn(1, 2, 2)...)
	a := h.start(t, h.plain, host.InstanceConfig{})
	for _, k := range keys {
		a.process(0, rec(k, "v", 1))
	}
	a.take()
	snap := a.snapshot(1)

	totals := uint64(0)
	for sub := 0; sub < 2; sub++ {
		r := abi.RangeForSubtask(sub, abi.DefaultMaxParallelism, 2)
		part := &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}, Lists: map[string]*host.ListState{}}
		for kg, g := range snap.KeyGroups {
			if r.Contains(kg) {
				part.KeyGroups[kg] = g
			}
		}
		if sub == 0 { // one split entry: goes to subtask 0
			part.Lists["total"] = snap.Lists["total"]
		}
		part.Lists["ckpt"] = snap.Lists["ckpt"]
		s := h.start(t, h.plain, host.InstanceConfig{Subtask: sub, Parallelism: 2, Restore: part})
		mine := keysIn(sub, 2, 2)
		s.process(0, rec(mine[0], "v", 2))
		expect(t, fmt.Sprintf("subtask %d", sub), s.take(), counted(mine[0], "v", 0, 2, 2))
		s.finish()
		out := s.take()
		if len(out) != 1 || !strings.HasPrefix(string(out[0].Value), "finish") || len(out[0].Value) != 14 {
			t.Fatalf("subtask %d finish: %s", sub, show(out))
		}
		totals += binary.LittleEndian.Uint64(out[0].Value[6:])
	}
	if totals != 6 {
		t.Errorf("sum of finish totals after rescale = %d, want 6 (4 restored + 2 new)", totals)
	}
}

func testFinalCheckpointAndLogs(t *testing.T, h *harness) {
	job := "logs-" + h.guest
	s := h.start(t, h.plain, host.InstanceConfig{Job: job, Operator: "op", Subtask: 1, Parallelism: 2})
	k := keysIn(1, 2, 1)[0]
	s.process(0, rec(k, "x", 1))
	s.endInput(0)
	s.finish()
	s.take()
	// the final checkpoint after finish
	snap := s.snapshot(9)
	if got, ok := countState(t, snap, k); !ok || got != 1 {
		t.Errorf("final snapshot count = %d, %v", got, ok)
	}
	if err := s.inst.NotifyCheckpointComplete(context.Background(), 9); err != nil {
		t.Fatalf("notify: %v", err)
	}
	if err := s.inst.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := s.inst.Close(context.Background()); err != nil {
		t.Fatalf("second close: %v", err)
	}
	var got []string
	for _, r := range h.logs.Matching("job", job) {
		got = append(got, r.Msg)
		if r.Attrs["operator"] != "op" || r.Attrs["subtask"] != "1" {
			t.Errorf("log %q has labels %v", r.Msg, r.Attrs)
		}
	}
	for _, want := range []string{"open", "notify", "close"} {
		if !slices.Contains(got, want) {
			t.Errorf("guest log lines %q lack %q", got, want)
		}
	}
	if len(s.take()) != 0 {
		t.Error("records emitted after finish")
	}
}

func testFailInOpen(t *testing.T, h *harness) {
	inst, err := h.plain.NewInstance(context.Background(), host.InstanceConfig{
		Job: "conf", Operator: "failer", Subtask: 0, Parallelism: 1, NumInputs: 1,
		Config: map[string]string{"fail_in": "open", "other": "x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(context.Background())
	err = inst.Open(context.Background())
	he := checkError(t, err, host.ErrGuestFailed, "failer", 0, 1, abi.PhaseOpen)
	if he != nil && !strings.Contains(he.Message, "conformance: fail in open") {
		t.Errorf("message %q lacks the guest's fail text", he.Message)
	}
	checkDiscarded(t, inst)
}

// trap starts a subtask 2/4 and sends one record with value v to it.
func (h *harness) trap(t *testing.T, m *host.Module, v string) (*host.Instance, error) {
	s := h.start(t, m, host.InstanceConfig{Operator: "trapper", Subtask: 2, Parallelism: 4})
	k := keysIn(2, 4, 1)[0]
	s.process(0, rec(k, "ok", 1))
	err := s.inst.Process(context.Background(), 0, []abi.Record{rec(k, v, 2)}, s.emit)
	t.Logf("%s guest, %q: %v", h.guest, v, err)
	return s.inst, err
}

func checkError(t *testing.T, err error, kind error, op string, subtask, par int, phase abi.Phase) *host.Error {
	t.Helper()
	var he *host.Error
	if !errors.As(err, &he) {
		t.Fatalf("got %v (%T), want *host.Error", err, err)
	}
	if !errors.Is(err, kind) {
		t.Errorf("kind %v, want %v; error: %v", he.Kind, kind, err)
	}
	if he.Operator != op || he.Subtask != subtask || he.Parallelism != par || he.Phase != phase {
		t.Errorf("error names operator %q subtask %d/%d phase %s, want %q %d/%d %s",
			he.Operator, he.Subtask, he.Parallelism, he.Phase, op, subtask, par, phase)
	}
	if want := fmt.Sprintf("operator %q subtask %d/%d phase %s", op, subtask, par, phase); !strings.Contains(err.Error(), want) {
		t.Errorf("error text %q lacks %q", err.Error(), want)
	}
	return he
}

// checkDiscarded: a failed instance is never called again.
func checkDiscarded(t *testing.T, inst *host.Instance) {
	t.Helper()
	err := inst.Process(context.Background(), 0, []abi.Record{rec("a", "x", 1)}, nil)
	if !errors.Is(err, host.ErrInstanceDiscarded) {
		t.Errorf("call after failure: %v, want ErrInstanceDiscarded", err)
	}
	if err := inst.Close(context.Background()); err != nil {
		t.Errorf("close after failure: %v", err)
	}
}

func testPanic(t *testing.T, h *harness) {
	inst, err := h.trap(t, h.plain, "panic")
	// WAT fails with fail(); the SDKs may report a panic through fail, a trap or proc_exit.
	var he *host.Error
	if !errors.As(err, &he) {
		t.Fatalf("got %v, want *host.Error", err)
	}
	kind := host.ErrGuestFailed
	if h.guest != "wat" && !errors.Is(err, host.ErrGuestFailed) {
		kind = he.Kind
		if kind != host.ErrTrap && kind != host.ErrExit {
			t.Errorf("panic reported as %v", kind)
		}
	}
	checkError(t, err, kind, "trapper", 2, 4, abi.PhaseProcess)
	if !strings.Contains(he.Message, "conformance panic") {
		t.Errorf("message %q lacks the panic text; error:\n%v", he.Message, err)
	}
	checkDiscarded(t, inst)
}

func testOOB(t *testing.T, h *harness) {
	inst, err := h.trap(t, h.plain, "oob")
	he := checkError(t, err, host.ErrTrap, "trapper", 2, 4, abi.PhaseProcess)
	if he != nil {
		if !strings.Contains(he.Message, "out of bounds memory access") {
			t.Errorf("message %q, want out of bounds memory access", he.Message)
		}
		if he.Stack == "" || !strings.Contains(err.Error(), "wasm stack trace:") {
			t.Errorf("no wasm stack trace in %v", err)
		}
	}
	checkDiscarded(t, inst)
}

func testGrow(t *testing.T, h *harness) {
	inst, err := h.trap(t, h.small, "grow")
	checkError(t, err, host.ErrMemoryLimit, "trapper", 2, 4, abi.PhaseProcess)
	checkDiscarded(t, inst)
}

func testSpin(t *testing.T, h *harness) {
	start := time.Now()
	inst, err := h.trap(t, h.timed, "spin")
	checkError(t, err, host.ErrDeadline, "trapper", 2, 4, abi.PhaseProcess)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("spin took %v to stop with a 500ms deadline", d)
	}
	checkDiscarded(t, inst)
}

// testRejectAndReplace: a record rejected on purpose fails the call with
// ErrRejected and the guest's reason; with Isolate, Replace opens a fresh
// instance on the keyed state and timers as they were before the failed
// batch (the count written and the timer registered by the batch's first
// record are undone), also after a trap.
func testRejectAndReplace(t *testing.T, h *harness) {
	ctx := context.Background()
	s := h.start(t, h.plain, host.InstanceConfig{Operator: "rejecter", Isolate: true})
	k := keysIn(0, 1, 1)[0]
	s.process(0, rec(k, "ok", 1))
	s.take()
	err := s.inst.Process(ctx, 0, []abi.Record{rec(k, "timer", 2), rec(k, "reject", 3)}, s.emit)
	he := checkError(t, err, host.ErrRejected, "rejecter", 0, 1, abi.PhaseProcess)
	if he != nil && he.Message != "conformance reject" {
		t.Errorf("message %q, want the guest's reason %q", he.Message, "conformance reject")
	}
	replace := s.replace
	replace()
	want := func(v string, count uint64) {
		t.Helper()
		got := s.take()
		exp := append([]byte(v), 0)
		exp = binary.LittleEndian.AppendUint64(exp, count)
		if len(got) != 1 || !bytes.Equal(got[0].Value, exp) {
			t.Fatalf("emitted %v, want one record %q (count %d: the failed batch's write undone)", got, exp, count)
		}
	}
	s.process(0, rec(k, "b", 4))
	want("b", 2)
	s.watermark(100) // the timer registered by the failed batch is gone
	if got := s.take(); len(got) != 1 || string(got[0].Value) != "wm" {
		t.Fatalf("after the watermark: %v, want only wm (no timer of the undone batch)", got)
	}
	err = s.inst.Process(ctx, 0, []abi.Record{rec(k, "c", 5), rec(k, "oob", 6)}, s.emit)
	checkError(t, err, host.ErrTrap, "rejecter", 0, 1, abi.PhaseProcess)
	replace()
	s.process(0, rec(k, "d", 7))
	want("d", 3)
	if _, err := s.inst.Replace(ctx); err == nil {
		t.Error("Replace of a live instance succeeded")
	}
}
