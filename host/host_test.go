package host_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testlog"
	"github.com/streamd/streamd/internal/testwasm"
)

const (
	watConformance = "internal/conformance/guests/wat/conformance.wasm"
	goConformance  = "internal/conformance/guests/go/conformance.wasm"
)

func fixture(t testing.TB, name string) string {
	return testwasm.Path(t, "host/testdata/"+name+".wasm")
}

func newEngine(t testing.TB, opts ...host.Option) *host.Engine {
	t.Helper()
	opts = append([]host.Option{host.WithCacheDir("")}, opts...)
	e, err := host.NewEngine(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

func load(t testing.TB, e *host.Engine, path string) *host.Module {
	t.Helper()
	m, err := e.LoadFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func instance(t testing.TB, m *host.Module, cfg host.InstanceConfig) *host.Instance {
	t.Helper()
	if cfg.Parallelism == 0 {
		cfg.Parallelism = 1
	}
	if cfg.Job == "" {
		cfg.Job = "job"
	}
	if cfg.Operator == "" {
		cfg.Operator = "op"
	}
	i, err := m.NewInstance(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { i.Close(context.Background()) })
	if err := i.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	return i
}

func TestLoadRefusesBadModules(t *testing.T) {
	e := newEngine(t)
	dir := t.TempDir()
	good, err := os.ReadFile(testwasm.Path(t, watConformance))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		path string
		want string
	}{
		{write("text.wasm", []byte("(module)\n")), "not a wasm module"},
		{write("empty.wasm", nil), "not a wasm module"},
		{write("elf.wasm", []byte("\x7fELF\x02\x01\x01\x00rest")), "not a wasm module"},
		{write("header.wasm", good[:6]), "truncated"},
		{write("half.wasm", good[:len(good)/2]), "truncated"},
		{write("cut.wasm", good[:len(good)-3]), "truncated"},
		{fixture(t, "missing_export"), "missing export streamd_process"},
		{fixture(t, "abi_v2"), "ABI version 2, host supports 1"},
		{fixture(t, "wrong_signature"), "export streamd_process has signature (i32, i32) -> (i32), want (i32, i32, i32) -> (i32)"},
		{fixture(t, "wrong_optional_signature"), "export streamd_on_watermark has signature (i32) -> (i32), want (i64) -> (i32)"},
		{fixture(t, "unknown_import"), "imports unknown function streamd_v1.emit_all"},
		{fixture(t, "foreign_import"), "imports env.abort: only streamd_v1 and wasi_snapshot_preview1 imports are allowed"},
		{fixture(t, "wrong_import_signature"), "import streamd_v1.emit has signature (i32) -> (), want (i32, i32) -> ()"},
		{fixture(t, "wrong_watermark_import"), "import streamd_v1.emit_watermark has signature (i32) -> (), want (i64) -> ()"},
		{fixture(t, "wrong_mstate_signature"), "import streamd_v1.mstate_get has signature (i32, i32, i32, i32, i32, i32, i32, i32) -> (i32), want (i32, i32, i32, i32, i32, i32, i32, i32, i32, i32) -> (i32)"},
		{fixture(t, "wrong_ptime_signature"), "export streamd_on_processing_time has signature (i32, i32, i32) -> (i32), want (i64, i32, i32) -> (i32)"},
		{filepath.Join(dir, "absent.wasm"), "no such file"},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			_, err := e.LoadFile(context.Background(), c.path)
			if err == nil {
				t.Fatalf("loaded %s, want refusal %q", c.path, c.want)
			}
			if !errors.Is(err, host.ErrBadModule) {
				t.Errorf("error does not wrap ErrBadModule: %v", err)
			}
			if !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q, want it to name %s and say %q", err, c.path, c.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	ctx := context.Background()
	for _, o := range []host.Option{host.WithMemoryLimitMiB(0), host.WithMemoryLimitMiB(5000), host.WithCallDeadline(-time.Second), host.WithLogger(nil)} {
		if e, err := host.NewEngine(ctx, host.WithCacheDir(""), o); err == nil {
			e.Close(ctx)
			t.Errorf("option accepted, want an error")
		}
	}
	// A deadline below what the guard can enforce is refused, naming the minimum.
	_, err := host.NewEngine(ctx, host.WithCacheDir(""), host.WithCallDeadline(100*time.Microsecond))
	if err == nil || !strings.Contains(err.Error(), host.MinCallDeadline.String()) {
		t.Errorf("deadline of 100µs: %v, want an error naming the minimum %v", err, host.MinCallDeadline)
	}
}

// TestCompilationCache: a second engine (a new wazero cache object, as in a
// new process) on the same cache directory loads from disk without compiling.
func TestCompilationCache(t *testing.T) {
	target := watConformance
	if ok, _ := testwasm.HasTarget(goConformance); ok {
		target = goConformance // big enough for compile time to show
	}
	path := testwasm.Path(t, target)
	dir := t.TempDir()
	ctx := context.Background()
	timeLoad := func(opts ...host.Option) time.Duration {
		e, err := host.NewEngine(ctx, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close(ctx)
		start := time.Now()
		if _, err := e.LoadFile(ctx, path); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	cold := timeLoad(host.WithCacheDir(dir))
	files := cacheFiles(t, dir)
	if len(files) == 0 {
		t.Fatalf("cache dir %s has no files after a load", dir)
	}
	warm := timeLoad(host.WithCacheDir(dir))
	if after := cacheFiles(t, dir); !slices.Equal(after, files) {
		t.Errorf("second load changed the cache (recompiled?): %v -> %v", files, after)
	}
	uncached := timeLoad(host.WithCacheDir(""))
	t.Logf("%s: load cold %v, from disk cache %v, without cache %v", filepath.Base(path), cold, warm, uncached)
	if target == goConformance && warm*2 > uncached {
		t.Errorf("cached load %v is not clearly faster than compiling (%v)", warm, uncached)
	}
}

func cacheFiles(t *testing.T, dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			info, _ := d.Info()
			out = append(out, fmt.Sprintf("%s:%d:%d", p, info.Size(), info.ModTime().UnixNano()))
		}
		return nil
	})
	return out
}

func TestSandbox(t *testing.T) {
	t.Setenv("STREAMD_SECRET", "do-not-leak")
	path := fixture(t, "sandbox")
	for _, allowClock := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_clock=%v", allowClock), func(t *testing.T) {
			logs, guestLog := testlog.New(), testlog.New()
			e := newEngine(t, host.WithLogger(slog.New(logs)), host.WithAllowClock(allowClock))
			i := instance(t, load(t, e, path), host.InstanceConfig{Job: "sb", Operator: "probe", Subtask: 0, Parallelism: 1, GuestLog: guestLog})
			var out []abi.Record
			if err := i.Process(context.Background(), 0, []abi.Record{{Value: []byte("go")}}, func(r []abi.Record) { out = append(out, r...) }); err != nil {
				t.Fatal(err)
			}
			if len(out) != 1 || len(out[0].Value) < 20 {
				t.Fatalf("probe emitted %v", out)
			}
			v := out[0].Value
			envc, argc, prestat := binary.LittleEndian.Uint32(v), binary.LittleEndian.Uint32(v[4:]), binary.LittleEndian.Uint32(v[8:])
			now := time.Unix(0, int64(binary.LittleEndian.Uint64(v[12:])))
			argv := string(v[20:])
			if envc != 0 {
				t.Errorf("guest sees %d environment variables, want 0", envc)
			}
			if argc != 1 || argv != "probe\x00" {
				t.Errorf("guest args: %d %q, want [probe]", argc, argv)
			}
			if prestat != 8 { // EBADF: no preopened directory at fd 3
				t.Errorf("fd_prestat_get(3) = errno %d, want 8 (EBADF, no preopens)", prestat)
			}
			if real := time.Since(now).Abs() < time.Hour; real != allowClock {
				t.Errorf("guest wall clock %v (allow_clock %v)", now, allowClock)
			}
			want := []string{"stdout|hello stdout|INFO", "stderr|hello stderr|WARN", "stderr|second line|WARN"}
			var got []string
			for _, r := range logs.Records() {
				if r.Attrs["stream"] == "" {
					continue
				}
				if r.Attrs["job"] != "sb" || r.Attrs["operator"] != "probe" || r.Attrs["subtask"] != "0" {
					t.Errorf("line %q labelled %v", r.Msg, r.Attrs)
				}
				got = append(got, r.Attrs["stream"]+"|"+r.Msg+"|"+r.Level)
			}
			if !slices.Equal(got, want) {
				t.Errorf("guest output lines %q, want %q", got, want)
			}
			// GuestLog gets the same lines, labelled with the subtask.
			got = nil
			for _, r := range guestLog.Records() {
				if r.Attrs["stream"] == "" {
					continue
				}
				if r.Attrs["operator"] != "probe" || r.Attrs["subtask"] != "0" {
					t.Errorf("GuestLog line %q labelled %v", r.Msg, r.Attrs)
				}
				got = append(got, r.Attrs["stream"]+"|"+r.Msg+"|"+r.Level)
			}
			if !slices.Equal(got, want) {
				t.Errorf("GuestLog lines %q, want %q", got, want)
			}
		})
	}
}

func TestHostCallMisuse(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, fixture(t, "misuse"))
	// a key outside subtask 0 of 2
	outside := ""
	for n := 0; outside == ""; n++ {
		k := fmt.Sprint("k", n)
		if !abi.RangeForSubtask(0, 128, 2).Contains(abi.KeyGroup([]byte(k), 128)) {
			outside = k
		}
	}
	cases := []struct {
		value string
		kind  error
		want  string
	}{
		{"nokey", host.ErrHostCall, "state_put: empty key"},
		{"list", host.ErrHostCall, "list_state_add not allowed in phase process"},
		{"frame", host.ErrHostCall, "emit: abi: malformed frame"},
		{"ptr", host.ErrHostCall, "emit: batch [0xffffff00, +1000) is outside memory"},
		{"status2", host.ErrGuestFailed, "status 2 (invalid input)"},
		{"key:" + outside, host.ErrHostCall, "outside this subtask's key groups [0,63]"},
	}
	for _, c := range cases {
		t.Run(c.value, func(t *testing.T) {
			i := instance(t, m, host.InstanceConfig{Subtask: 0, Parallelism: 2})
			err := i.Process(context.Background(), 0, []abi.Record{{Value: []byte(c.value)}}, nil)
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v\nwant %v containing %q", err, c.kind, c.want)
			}
		})
	}
	t.Run("emit_in_snapshot", func(t *testing.T) {
		i := instance(t, m, host.InstanceConfig{})
		_, err := i.SnapshotState(context.Background(), 1)
		var he *host.Error
		if !errors.As(err, &he) || he.Kind != host.ErrHostCall || he.Phase != abi.PhaseSnapshot || !strings.Contains(he.Message, "emit not allowed in phase snapshot_state") {
			t.Errorf("got %v", err)
		}
	})
}

// TestEmittedRecordsAreOwned: the guest reuses its emit buffer; the host must
// have copied every record out of guest memory.
func TestEmittedRecordsAreOwned(t *testing.T) {
	e := newEngine(t)
	i := instance(t, load(t, e, testwasm.Path(t, watConformance)), host.InstanceConfig{})
	var got []abi.Record
	var in []abi.Record
	for n := range 5000 {
		in = append(in, abi.Record{Key: []byte(fmt.Sprint("key", n%7)), Value: []byte(fmt.Sprint("value-", n)), Timestamp: int64(n)})
	}
	for b := 0; b < len(in); b += 500 {
		if err := i.Process(context.Background(), 0, in[b:b+500], func(r []abi.Record) { got = append(got, r...) }); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != len(in) {
		t.Fatalf("%d records out, want %d", len(got), len(in))
	}
	counts := map[string]uint64{}
	for n, r := range got {
		counts[string(in[n].Key)]++
		want := string(in[n].Value) + "\x00" + string(binary.LittleEndian.AppendUint64(nil, counts[string(in[n].Key)]))
		if string(r.Key) != string(in[n].Key) || string(r.Value) != want || r.Timestamp != int64(n) {
			t.Fatalf("record %d = (%q, %q, %d), want (%q, %q, %d)", n, r.Key, r.Value, r.Timestamp, in[n].Key, want, n)
		}
	}
}

// TestProcessDoesNotAllocate: the Process path reuses its buffers.
func TestProcessDoesNotAllocate(t *testing.T) {
	e := newEngine(t)
	i := instance(t, load(t, e, fixture(t, "noop")), host.InstanceConfig{})
	recs := makeRecords(1000, 100)
	ctx := context.Background()
	if err := i.Process(ctx, 0, recs, nil); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { i.Process(ctx, 0, recs, nil) }); n != 0 {
		t.Errorf("Process of 1000 records allocates %v times, want 0", n)
	}
	// with emits, allocation is amortized over arena chunks
	c := instance(t, load(t, e, testwasm.Path(t, watConformance)), host.InstanceConfig{})
	keyed := makeRecords(1000, 100)
	for n := range keyed {
		keyed[n].Key = []byte{'k', byte(n % 10)}
	}
	c.Process(ctx, 0, keyed, func([]abi.Record) {})
	if n := testing.AllocsPerRun(20, func() { c.Process(ctx, 0, keyed, func([]abi.Record) {}) }); n > 100 {
		t.Errorf("Process of 1000 counted records allocates %v times, want amortized (<100)", n)
	}
}

func TestCallsAfterCloseAreRefused(t *testing.T) {
	e := newEngine(t)
	i := instance(t, load(t, e, testwasm.Path(t, watConformance)), host.InstanceConfig{})
	if err := i.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := i.Process(context.Background(), 0, nil, nil); !errors.Is(err, host.ErrInstanceDiscarded) {
		t.Errorf("process after close: %v", err)
	}
}

func TestSnapshotBinary(t *testing.T) {
	s := &host.Snapshot{
		KeyGroups: map[int]*host.KeyGroupState{
			3:  {Entries: map[string]map[string][]byte{"count": {"a": {1, 0}, "b": {}}}, Timers: []host.Timer{{Key: []byte("a"), TS: 5}, {Key: []byte("a"), TS: -1}}},
			90: {Entries: map[string]map[string][]byte{}, Timers: []host.Timer{{Key: []byte("z"), TS: abi.MaxWatermark}}},
		},
		Lists: map[string]*host.ListState{"total": {Mode: abi.ListSplit, Entries: [][]byte{{9}, {}}}, "u": {Mode: abi.ListUnion}},
	}
	b1, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var r host.Snapshot
	if err := r.UnmarshalBinary(b1); err != nil {
		t.Fatal(err)
	}
	b2, _ := r.Clone().MarshalBinary()
	if !bytes.Equal(b1, b2) {
		t.Error("marshal(unmarshal(marshal(s))) differs")
	}
	if got := r.KeyGroups[3].Timers; len(got) != 2 || got[0].TS != -1 {
		t.Errorf("timers not sorted by ts: %v", got)
	}
	if v := r.KeyGroups[3].Entries["count"]["a"]; !bytes.Equal(v, []byte{1, 0}) {
		t.Errorf("value %v", v)
	}
	if v := binary.LittleEndian.Uint32(b1[4:]); v != 1 {
		t.Errorf("a snapshot without processing-time timers is written as version %d, want 1", v)
	}
	// With processing-time timers: version 2, which reads back.
	s.KeyGroups[90].ProcTimers = []host.Timer{{Key: []byte("z"), TS: 7}, {Key: []byte("y"), TS: 7}}
	v2, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint32(v2[4:]); v != 2 {
		t.Errorf("a snapshot with processing-time timers is written as version %d, want 2", v)
	}
	if s.Size() != int64(len(v2)) {
		t.Errorf("Size() = %d, MarshalBinary of version 2 gives %d bytes", s.Size(), len(v2))
	}
	var r2 host.Snapshot
	if err := r2.UnmarshalBinary(v2); err != nil {
		t.Fatal(err)
	}
	if got := r2.KeyGroups[90].ProcTimers; len(got) != 2 || string(got[0].Key) != "y" || len(r2.KeyGroups[3].ProcTimers) != 0 {
		t.Errorf("processing-time timers read back as %v", got)
	}
	if b, _ := r2.Clone().MarshalBinary(); !bytes.Equal(b, v2) {
		t.Error("version 2: marshal(clone(unmarshal(b))) differs")
	}
	bad := slices.Clone(b1)
	bad[len(bad)/2] ^= 1
	for name, data := range map[string][]byte{"flipped": bad, "truncated": b1[:len(b1)-1], "empty": nil, "short": b1[:10]} {
		if err := new(host.Snapshot).UnmarshalBinary(data); !errors.Is(err, host.ErrSnapshotFormat) {
			t.Errorf("%s snapshot: %v, want ErrSnapshotFormat", name, err)
		}
	}
}

var backends = []string{host.BackendMemory, host.BackendPebble}

func TestRestoreRejectsForeignKeyGroups(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, testwasm.Path(t, watConformance))
	for _, backend := range backends {
		dir := t.TempDir()
		snap := &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{100: {}}}
		_, err := m.NewInstance(context.Background(), host.InstanceConfig{Job: "j", Operator: "o", Subtask: 0, Parallelism: 2, Restore: snap,
			State: host.StateConfig{Backend: backend, DataDir: dir}})
		if err == nil || !strings.Contains(err.Error(), "key group 100 is outside") {
			t.Errorf("%s: got %v", backend, err)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%s: the refused instance left %d files in its data directory", backend, len(left))
		}
	}
}

func makeRecords(n, size int) []abi.Record {
	recs := make([]abi.Record, n)
	payload := bytes.Repeat([]byte("x"), size)
	for i := range recs {
		recs[i] = abi.Record{Value: payload, Timestamp: int64(i)}
	}
	return recs
}

// Keyed state and timers may be written in snapshot_state and
// notify_checkpoint_complete until finish has returned; after it they fail
// the subtask (ABI.md, "Host imports").
func TestStateWritesAroundCheckpoints(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, fixture(t, "phasewrites"))
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) { testStateWritesAroundCheckpoints(t, m, backend) })
	}
}

func testStateWritesAroundCheckpoints(t *testing.T, m *host.Module, backend string) {
	ctx := context.Background()
	i := instance(t, m, host.InstanceConfig{State: host.StateConfig{Backend: backend, DataDir: t.TempDir()}})
	kg := abi.KeyGroup([]byte("k"), abi.DefaultMaxParallelism)
	snap, err := i.SnapshotState(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Load(); err != nil {
		t.Fatal(err)
	}
	// The snapshot is taken after the guest's snapshot_state: its write is in it.
	g := snap.KeyGroups[kg]
	if g == nil || string(g.Entries["s"]["k"]) != "v" || len(g.Timers) != 1 || g.Timers[0].TS != 5 {
		t.Fatalf("snapshot 1 key group %d = %+v, want s/k=v and a timer at 5", kg, g)
	}
	if err := i.NotifyCheckpointComplete(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := i.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	_, err = i.SnapshotState(ctx, 2)
	var he *host.Error
	if !errors.As(err, &he) || he.Kind != host.ErrHostCall || he.Phase != abi.PhaseSnapshot || !strings.Contains(he.Message, "state_put not allowed after finish") {
		t.Fatalf("state_put in snapshot_state after finish: got %v", err)
	}
}
