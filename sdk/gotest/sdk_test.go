//go:build !wasip1

package gotest

// These tests build real guests with the SDK (GOOS=wasip1, c-shared, through
// the Makefile) and run them through the streamd host.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// Guests built by the repository's Makefile (mk/go-guests.mk).
const (
	uppercaseWasm   = "examples/wasm/uppercase/uppercase.wasm"
	keybyWasm       = "examples/wasm/window-count/keyby.wasm"
	windowCountWasm = "examples/wasm/window-count/window-count.wasm"
	conformanceWasm = "internal/conformance/guests/go/conformance.wasm"
)

func newInstance(t testing.TB, eng *host.Engine, path string, cfg host.InstanceConfig) *host.Instance {
	t.Helper()
	ctx := context.Background()
	mod, err := eng.LoadFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Job == "" {
		cfg.Job = "test"
	}
	if cfg.Parallelism == 0 {
		cfg.Parallelism = 1
	}
	if cfg.NumInputs == 0 {
		cfg.NumInputs = 1
	}
	inst, err := mod.NewInstance(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close(context.Background()) })
	if err := inst.Open(ctx); err != nil {
		t.Fatal(err)
	}
	return inst
}

// logBuffer collects what guests log, for assertions and quiet test output.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newEngine(t testing.TB, opts ...host.Option) *host.Engine {
	return newEngineLog(t, &logBuffer{}, opts...)
}

func newEngineLog(t testing.TB, log *logBuffer, opts ...host.Option) *host.Engine {
	t.Helper()
	opts = append([]host.Option{host.WithLogger(slog.New(slog.NewTextHandler(log, nil)))}, opts...)
	eng, err := host.NewEngine(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	return eng
}

// collector gathers emitted records.
type collector struct{ recs []abi.Record }

func (c *collector) emit(recs []abi.Record) { c.recs = append(c.recs, recs...) }

func (c *collector) values() []string {
	var vs []string
	for _, r := range c.recs {
		vs = append(vs, string(r.Value))
	}
	return vs
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func TestUppercaseGuest(t *testing.T) {
	ctx := context.Background()
	inst := newInstance(t, newEngine(t), testwasm.Path(t, uppercaseWasm), host.InstanceConfig{Operator: "upper"})
	var c collector
	in := readLines(t, "../../examples/wasm/uppercase/input.txt")
	recs := make([]abi.Record, len(in))
	for i, l := range in {
		recs[i] = abi.Record{Value: []byte(l), Timestamp: abi.NoTimestamp}
	}
	recs = append(recs, abi.Record{Key: []byte("k"), Value: []byte("keyed"), Timestamp: 42})
	if err := inst.Process(ctx, 0, recs, c.emit); err != nil {
		t.Fatal(err)
	}
	want := append(readLines(t, "../../examples/wasm/uppercase/expected.txt"), "KEYED")
	if got := c.values(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("uppercase emitted\n%q\nwant\n%q", got, want)
	}
	last := c.recs[len(c.recs)-1]
	if string(last.Key) != "k" || last.Timestamp != 42 || c.recs[0].Key != nil || c.recs[0].Timestamp != abi.NoTimestamp {
		t.Fatalf("keys or timestamps not kept: first %+v, last %+v", c.recs[0], last)
	}

	// A batch large enough to make the SDK flush mid-call and the host grow
	// the input buffer.
	c.recs = nil
	big := make([]abi.Record, 5000)
	for i := range big {
		big[i] = abi.Record{Value: bytes.Repeat([]byte("ab"), 20), Timestamp: int64(i)}
	}
	if err := inst.Process(ctx, 0, big, c.emit); err != nil {
		t.Fatal(err)
	}
	if len(c.recs) != len(big) || string(c.recs[4999].Value) != strings.Repeat("AB", 20) || c.recs[4999].Timestamp != 4999 {
		t.Fatalf("big batch: %d records out", len(c.recs))
	}
	if err := inst.Finish(ctx, c.emit); err != nil {
		t.Fatal(err)
	}
}

func TestWindowCountGuest(t *testing.T) {
	keyby := testwasm.Path(t, keybyWasm)
	windows := testwasm.Path(t, windowCountWasm)
	eng := newEngine(t)
	ctx := context.Background()
	in := readLines(t, "../../examples/wasm/window-count/input.txt")
	want := readLines(t, "../../examples/wasm/window-count/expected.txt")

	for _, par := range []int{1, 3} {
		// keyby at parallelism 1, then hash partitioning by key group.
		kb := newInstance(t, eng, keyby, host.InstanceConfig{Operator: "keyby"})
		var keyed collector
		lines := make([]abi.Record, len(in))
		for i, l := range in {
			lines[i] = abi.Record{Value: []byte(l), Timestamp: abi.NoTimestamp}
		}
		if err := kb.Process(ctx, 0, lines, keyed.emit); err != nil {
			t.Fatal(err)
		}
		parts := make([][]abi.Record, par)
		for _, r := range keyed.recs {
			if len(r.Key) == 0 || r.Timestamp == abi.NoTimestamp {
				t.Fatalf("keyby emitted %+v without key or timestamp", r)
			}
			s := abi.SubtaskForKeyGroup(abi.KeyGroup(r.Key, abi.DefaultMaxParallelism), abi.DefaultMaxParallelism, par)
			parts[s] = append(parts[s], r)
		}
		var out collector
		for s := 0; s < par; s++ {
			w := newInstance(t, eng, windows, host.InstanceConfig{Operator: "windows", Subtask: s, Parallelism: par,
				Config: map[string]string{"size_ms": "10000"}})
			if err := w.Process(ctx, 0, parts[s], out.emit); err != nil {
				t.Fatal(err)
			}
			if err := w.AdvanceWatermark(ctx, abi.MaxWatermark, out.emit); err != nil {
				t.Fatal(err)
			}
		}
		got := out.values()
		sort.Strings(got)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("parallelism %d: windows\n%s\nwant\n%s", par, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		for _, r := range out.recs {
			if f := strings.Split(string(r.Value), ","); string(r.Key) != f[0] || r.Timestamp != atoi(t, f[2])-1 {
				t.Fatalf("window %q has key %q ts %d", r.Value, r.Key, r.Timestamp)
			}
		}
	}
}

func TestWindowCountLateAndConfig(t *testing.T) {
	eng := newEngine(t)
	ctx := context.Background()
	w := newInstance(t, eng, testwasm.Path(t, windowCountWasm), host.InstanceConfig{Operator: "windows",
		Config: map[string]string{"size_ms": "100"}})
	var out collector
	// Keyed as keyby keys them: the record's key is the line's.
	rec := func(line string) abi.Record {
		return abi.Record{Key: []byte(strings.SplitN(line, ",", 2)[0]), Value: []byte(line), Timestamp: abi.NoTimestamp}
	}
	if err := w.Process(ctx, 0, []abi.Record{rec("a,5"), rec("a,150"), rec("not a line"), rec("a,-1")}, out.emit); err != nil {
		t.Fatal(err)
	}
	if err := w.AdvanceWatermark(ctx, 99, out.emit); err != nil {
		t.Fatal(err)
	}
	// a,50 is late: its window [0,100) fired at watermark 99.
	if err := w.Process(ctx, 0, []abi.Record{rec("a,50"), rec("a,199")}, out.emit); err != nil {
		t.Fatal(err)
	}
	if err := w.AdvanceWatermark(ctx, abi.MaxWatermark, out.emit); err != nil {
		t.Fatal(err)
	}
	want := "a,-100,0,1|a,0,100,1|a,100,200,2"
	if got := strings.Join(out.values(), "|"); got != want {
		t.Fatalf("windows %s, want %s", got, want)
	}

	bad := newEngine(t)
	mod, err := bad.LoadFile(ctx, testwasm.Path(t, windowCountWasm))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mod.NewInstance(ctx, host.InstanceConfig{Job: "j", Operator: "windows", Parallelism: 1, NumInputs: 1,
		Config: map[string]string{"size_ms": "ten"}})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	err = inst.Open(ctx)
	if err == nil || !strings.Contains(err.Error(), `config "size_ms" is "ten", not an integer`) {
		t.Fatalf("open with a bad size_ms: %v", err)
	}
}

func atoi(t *testing.T, s string) int64 {
	var n int64
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a number: %q", s)
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// TestConformanceGuestLifecycle runs the Go conformance operator through one
// whole life, a checkpoint and a restore.
func TestConformanceGuestLifecycle(t *testing.T) {
	path := testwasm.Path(t, conformanceWasm)
	log := &logBuffer{}
	eng := newEngineLog(t, log)
	ctx := context.Background()
	inst := newInstance(t, eng, path, host.InstanceConfig{Operator: "conf", NumInputs: 2})
	var c collector
	recs := []abi.Record{
		{Key: []byte("a"), Value: []byte("x"), Timestamp: 1},
		{Key: []byte("a"), Value: []byte("timer"), Timestamp: 5},
		{Key: []byte("b"), Value: []byte("y"), Timestamp: 7},
	}
	if err := inst.Process(ctx, 1, recs, c.emit); err != nil {
		t.Fatal(err)
	}
	if err := inst.Process(ctx, 0, []abi.Record{{Key: []byte("b"), Value: []byte("del"), Timestamp: 8}}, c.emit); err != nil {
		t.Fatal(err)
	}
	snap, err := inst.SnapshotState(ctx, 9)
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.NotifyCheckpointComplete(ctx, 9); err != nil {
		t.Fatal(err)
	}
	if err := inst.AdvanceWatermark(ctx, 20, c.emit); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} {
		if err := inst.EndInput(ctx, i, c.emit); err != nil {
			t.Fatal(err)
		}
	}
	if err := inst.Finish(ctx, c.emit); err != nil {
		t.Fatal(err)
	}
	want := []abi.Record{
		{Key: []byte("a"), Value: append([]byte("x\x01"), u64(1)...), Timestamp: 1},
		{Key: []byte("a"), Value: append([]byte("timer\x01"), u64(2)...), Timestamp: 5},
		{Key: []byte("b"), Value: append([]byte("y\x01"), u64(1)...), Timestamp: 7},
		{Key: []byte("b"), Value: []byte("del"), Timestamp: 8},
		{Key: []byte("a"), Value: []byte("timer"), Timestamp: 15},
		{Value: []byte("wm"), Timestamp: 20},
		{Value: []byte("end\x00"), Timestamp: abi.NoTimestamp},
		{Value: []byte("end\x01"), Timestamp: abi.NoTimestamp},
		{Value: append([]byte("finish"), u64(3)...), Timestamp: abi.NoTimestamp},
	}
	if len(c.recs) != len(want) {
		t.Fatalf("emitted %d records, want %d: %q", len(c.recs), len(want), c.values())
	}
	for i := range want {
		if g, w := c.recs[i], want[i]; !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || g.Timestamp != w.Timestamp {
			t.Fatalf("record %d: got key %q value %q ts %d, want key %q value %q ts %d", i, g.Key, g.Value, g.Timestamp, w.Key, w.Value, w.Timestamp)
		}
	}
	if l := snap.Lists["total"]; l == nil || l.Mode != abi.ListSplit || len(l.Entries) != 1 || !bytes.Equal(l.Entries[0], u64(3)) {
		t.Fatalf("snapshot list total = %+v", l)
	}
	if l := snap.Lists["ckpt"]; l == nil || l.Mode != abi.ListUnion || !bytes.Equal(l.Entries[0], u64(9)) {
		t.Fatalf("snapshot list ckpt = %+v", l)
	}

	if err := inst.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"msg=open", "msg=notify", "msg=close"} {
		if !strings.Contains(log.String(), msg) {
			t.Errorf("guest log lacks %s:\n%s", msg, log.String())
		}
	}

	// Restore: total continues from the list state, count from keyed state.
	re := newInstance(t, eng, path, host.InstanceConfig{Operator: "conf", Restore: snap})
	c.recs = nil
	if err := re.Process(ctx, 0, []abi.Record{{Key: []byte("a"), Value: []byte("z"), Timestamp: 30}}, c.emit); err != nil {
		t.Fatal(err)
	}
	if err := re.Finish(ctx, c.emit); err != nil {
		t.Fatal(err)
	}
	if got := c.values(); len(got) != 2 || got[0] != "z\x00"+string(u64(3)) || got[1] != "finish"+string(u64(4)) {
		t.Fatalf("after restore: %q", got)
	}
}

// TestGuestFailures checks that every way a Go guest can die reaches the host
// as an error of the right kind that carries the guest's own words.
func TestGuestFailures(t *testing.T) {
	path := testwasm.Path(t, conformanceWasm)
	ctx := context.Background()
	eng := newEngine(t, host.WithMemoryLimitMiB(64), host.WithCallDeadline(time.Second))
	for _, tc := range []struct {
		value string
		kind  error
		texts []string
	}{
		{"panic", host.ErrGuestFailed, []string{"conformance panic", "goroutine", "main.go"}},
		{"oob", host.ErrTrap, []string{"out of bounds memory access"}},
		// The Go runtime's "fatal error: out of memory" line is followed by a
		// dump of every goroutine, so only the kind is checked here.
		{"grow", host.ErrMemoryLimit, nil},
		{"spin", host.ErrDeadline, []string{"deadline"}},
	} {
		t.Run(tc.value, func(t *testing.T) {
			inst := newInstance(t, eng, path, host.InstanceConfig{Job: "j", Operator: "conf"})
			start := time.Now()
			err := inst.Process(ctx, 0, []abi.Record{{Key: []byte("k"), Value: []byte(tc.value)}}, func([]abi.Record) {})
			if err == nil {
				t.Fatal("no error")
			}
			var he *host.Error
			if !errors.As(err, &he) || !errors.Is(err, tc.kind) || he.Phase != abi.PhaseProcess {
				t.Fatalf("error %v (%T), want kind %v in phase process", err, err, tc.kind)
			}
			for _, s := range tc.texts {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q:\n%v", s, err)
				}
			}
			t.Logf("%s: %v after %v", tc.value, he.Message, time.Since(start).Round(time.Millisecond))
		})
	}
	// fail_in=open: the fail import's message is the error.
	mod, err := eng.LoadFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mod.NewInstance(ctx, host.InstanceConfig{Job: "j", Operator: "conf", Parallelism: 1, NumInputs: 1,
		Config: map[string]string{"fail_in": "open"}})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	if err := inst.Open(ctx); !errors.Is(err, host.ErrGuestFailed) || !strings.Contains(err.Error(), "conformance: fail in open") {
		t.Fatalf("fail in open: %v", err)
	}
}

// BenchmarkUppercaseGuest measures records per second through the uppercase
// guest in batches of 1024 records of 40 bytes.
func BenchmarkUppercaseGuest(b *testing.B) {
	inst := newInstance(b, newEngine(b), testwasm.Path(b, uppercaseWasm), host.InstanceConfig{Operator: "upper"})
	recs := make([]abi.Record, 1024)
	for i := range recs {
		recs[i] = abi.Record{Value: bytes.Repeat([]byte("abcd"), 10), Timestamp: int64(i)}
	}
	n := 0
	emit := func(out []abi.Record) { n += len(out) }
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := inst.Process(ctx, 0, recs, emit); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
	if n != b.N*len(recs) {
		b.Fatalf("%d records out, want %d", n, b.N*len(recs))
	}
}
