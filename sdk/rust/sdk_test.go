// Tests of the Rust SDK through the real host, with the Rust conformance
// guest (internal/conformance/guests/rust) as the operator under test: panic
// messages, traps, buffer growth, emit framing and lifecycle glue.
package rustsdk_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

const guest = "internal/conformance/guests/rust/conformance.wasm"

type logBuf struct{ bytes.Buffer }

func newInstance(t *testing.T, cfg host.InstanceConfig, opts ...host.Option) (*host.Instance, *logBuf) {
	t.Helper()
	ctx := context.Background()
	logs := &logBuf{}
	opts = append([]host.Option{host.WithCacheDir(""), host.WithLogger(slog.New(slog.NewTextHandler(io.Writer(logs), nil)))}, opts...)
	eng, err := host.NewEngine(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	mod, err := eng.LoadFile(ctx, testwasm.Path(t, guest))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Parallelism == 0 {
		cfg.Parallelism = 1
	}
	cfg.Job, cfg.Operator, cfg.NumInputs = "sdk", "conf", 2
	inst, err := mod.NewInstance(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close(ctx) })
	if err := inst.Open(ctx); err != nil {
		t.Fatal(err)
	}
	return inst, logs
}

type collector struct {
	frames int
	recs   []abi.Record
}

func (c *collector) emit(recs []abi.Record) { c.frames++; c.recs = append(c.recs, recs...) }

func u64le(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }

func rec(k, v string, ts int64) abi.Record {
	return abi.Record{Key: []byte(k), Value: []byte(v), Timestamp: ts}
}

func same(a, b abi.Record) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) && a.Timestamp == b.Timestamp
}

func wantRecords(t *testing.T, what string, got []abi.Record, want ...abi.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d records %v, want %d %v", what, len(got), got, len(want), want)
	}
	for i := range want {
		if !same(got[i], want[i]) {
			t.Fatalf("%s: record %d: got %q/%q/%d, want %q/%q/%d", what, i,
				got[i].Key, got[i].Value, got[i].Timestamp, want[i].Key, want[i].Value, want[i].Timestamp)
		}
	}
}

// TestLifecycle drives every export once, from a restored state, and checks
// what the SDK passed through: records, state, timers, list state, logs.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	restore := &host.Snapshot{Lists: map[string]*host.ListState{
		"total": {Mode: abi.ListSplit, Entries: [][]byte{u64le(5), u64le(7)}},
	}}
	inst, logs := newInstance(t, host.InstanceConfig{Restore: restore})
	c := &collector{}
	if err := inst.Process(ctx, 1, []abi.Record{rec("a", "x", 1), rec("a", "y", 2), rec("b", "timer", 3)}, c.emit); err != nil {
		t.Fatal(err)
	}
	if c.frames != 1 {
		t.Errorf("one call made %d emit frames, want 1", c.frames)
	}
	val := func(v string, input byte, n uint64) string { return v + string([]byte{input}) + string(u64le(n)) }
	wantRecords(t, "process", c.recs, rec("a", val("x", 1, 1), 1), rec("a", val("y", 1, 2), 2), rec("b", val("timer", 1, 1), 3))

	*c = collector{}
	if err := inst.Process(ctx, 0, []abi.Record{rec("a", "del", 4), rec("a", "z", 5)}, c.emit); err != nil {
		t.Fatal(err)
	}
	wantRecords(t, "del", c.recs, rec("a", "del", 4), rec("a", val("z", 0, 1), 5))

	snap, err := inst.SnapshotState(ctx, 9)
	if err != nil {
		t.Fatal(err)
	}
	if l := snap.Lists["total"]; l == nil || l.Mode != abi.ListSplit || len(l.Entries) != 1 || !bytes.Equal(l.Entries[0], u64le(5+7+4)) {
		t.Errorf("list state total = %+v, want one split entry %d", l, 5+7+4)
	}
	if l := snap.Lists["ckpt"]; l == nil || l.Mode != abi.ListUnion || len(l.Entries) != 1 || !bytes.Equal(l.Entries[0], u64le(9)) {
		t.Errorf("list state ckpt = %+v, want one union entry 9", l)
	}
	if err := inst.NotifyCheckpointComplete(ctx, 9); err != nil {
		t.Fatal(err)
	}

	*c = collector{}
	if err := inst.AdvanceWatermark(ctx, 100, c.emit); err != nil {
		t.Fatal(err)
	}
	wantRecords(t, "watermark", c.recs, rec("b", "timer", 13), rec("", "wm", 100))

	*c = collector{}
	for in := 0; in < 2; in++ {
		if err := inst.EndInput(ctx, in, c.emit); err != nil {
			t.Fatal(err)
		}
	}
	if err := inst.Finish(ctx, c.emit); err != nil {
		t.Fatal(err)
	}
	wantRecords(t, "end", c.recs, rec("", "end\x00", abi.NoTimestamp), rec("", "end\x01", abi.NoTimestamp),
		rec("", "finish"+string(u64le(16)), abi.NoTimestamp))
	if err := inst.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"msg=open", "msg=notify", "msg=close"} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("host log lacks %q:\n%s", line, logs.String())
		}
	}
}

// TestLargeBatches: batches far bigger than the first input buffer make the
// SDK grow it; output bigger than 64 KiB leaves in several frames, in order.
func TestLargeBatches(t *testing.T) {
	ctx := context.Background()
	inst, _ := newInstance(t, host.InstanceConfig{})
	for _, size := range []int{10, 1000, 100_000, 3 << 20} {
		var in []abi.Record
		for total := 0; total < 4<<20; total += size {
			in = append(in, abi.Record{Key: []byte(fmt.Sprint(len(in))), Value: bytes.Repeat([]byte{'v'}, size), Timestamp: int64(len(in))})
		}
		c := &collector{}
		if err := inst.Process(ctx, 0, in, c.emit); err != nil {
			t.Fatalf("values of %d bytes: %v", size, err)
		}
		if len(c.recs) != len(in) {
			t.Fatalf("values of %d bytes: %d records out, want %d", size, len(c.recs), len(in))
		}
		for i, r := range c.recs {
			if !bytes.Equal(r.Key, in[i].Key) || len(r.Value) != size+9 || r.Timestamp != in[i].Timestamp {
				t.Fatalf("values of %d bytes: record %d out of order or damaged", size, i)
			}
		}
		// A frame is flushed once it holds 64 KiB, so it holds at most 64 KiB plus one record.
		if want := min(len(in), (4<<20)/(64<<10+size+64)); c.frames < want {
			t.Errorf("values of %d bytes: %d emit frames for 4 MiB, want at least %d", size, c.frames, want)
		}
	}
}

// TestPanicMessage: a Rust panic reaches the host through fail, with its text and location.
func TestPanicMessage(t *testing.T) {
	inst, _ := newInstance(t, host.InstanceConfig{})
	err := inst.Process(context.Background(), 0, []abi.Record{rec("k", "ok", 1), rec("k", "panic", 2)}, func([]abi.Record) {})
	var he *host.Error
	if !errors.As(err, &he) || !errors.Is(err, host.ErrGuestFailed) {
		t.Fatalf("got %v, want a guest failure", err)
	}
	if !strings.Contains(he.Message, "conformance panic") || !strings.Contains(he.Message, "src/lib.rs:") {
		t.Fatalf("message %q lacks the panic text or its location", he.Message)
	}
	t.Logf("%v", err)
	if he.Phase != abi.PhaseProcess {
		t.Errorf("phase %s, want process", he.Phase)
	}
}

// TestFailInOpen: a config-driven fail in open carries its message.
func TestFailInOpen(t *testing.T) {
	ctx := context.Background()
	eng, err := host.NewEngine(ctx, host.WithCacheDir(""), host.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	mod, err := eng.LoadFile(ctx, testwasm.Path(t, guest))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mod.NewInstance(ctx, host.InstanceConfig{Job: "sdk", Operator: "conf", Parallelism: 1, NumInputs: 1,
		Config: map[string]string{"fail_in": "open"}})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	err = inst.Open(ctx)
	var he *host.Error
	if !errors.As(err, &he) || !errors.Is(err, host.ErrGuestFailed) || he.Message != "conformance: fail in open" || he.Phase != abi.PhaseOpen {
		t.Fatalf("got %v, want the guest's fail message in phase open", err)
	}
}

// TestTraps: out-of-bounds reads, memory exhaustion and endless loops become typed host errors.
func TestTraps(t *testing.T) {
	for _, tc := range []struct {
		value string
		kind  error
		opts  []host.Option
	}{
		{"oob", host.ErrTrap, nil},
		{"grow", host.ErrMemoryLimit, []host.Option{host.WithMemoryLimitMiB(32)}},
		{"spin", host.ErrDeadline, []host.Option{host.WithCallDeadline(300 * time.Millisecond)}},
	} {
		t.Run(tc.value, func(t *testing.T) {
			inst, _ := newInstance(t, host.InstanceConfig{}, tc.opts...)
			err := inst.Process(context.Background(), 0, []abi.Record{rec("k", tc.value, 1)}, func([]abi.Record) {})
			if !errors.Is(err, tc.kind) {
				t.Fatalf("got %v, want %v", err, tc.kind)
			}
			t.Logf("%v", err)
			// A trapped instance is discarded.
			if err := inst.Process(context.Background(), 0, []abi.Record{rec("k", "x", 2)}, func([]abi.Record) {}); !errors.Is(err, host.ErrInstanceDiscarded) {
				t.Fatalf("after the trap: got %v, want ErrInstanceDiscarded", err)
			}
		})
	}
}

// TestNativeUnitTests runs the crate's own unit tests (codecs, emit buffer,
// keyed state, timers, windows and the harness against the simulated host of
// streamd::testing) natively with Debian's cargo.
func TestNativeUnitTests(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping cargo test")
	}
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/cargo", "test", "--quiet", "--offline", "--manifest-path", filepath.Join(root, "sdk", "rust", "Cargo.toml"))
	cmd.Env = append(os.Environ(), "RUSTC=/usr/bin/rustc", "CARGO_NET_OFFLINE=true", "CARGO_TARGET_DIR="+filepath.Join(root, "target", "rust"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cargo test in sdk/rust: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "test result: ok") {
		t.Fatalf("cargo test printed no result:\n%s", out)
	}
}
