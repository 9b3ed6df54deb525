package host_test

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
)

// signal is a slog handler that closes ch at the first record with message msg.
type signal struct {
	msg string
	ch  chan struct{}
}

func newSignal(msg string) *signal { return &signal{msg: msg, ch: make(chan struct{})} }

func (s *signal) Enabled(context.Context, slog.Level) bool { return true }
func (s *signal) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *signal) WithGroup(string) slog.Handler            { return s }
func (s *signal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == s.msg {
		select {
		case <-s.ch:
		default:
			close(s.ch)
		}
	}
	return nil
}

// spinning starts host/testdata/spin.wasm's never-ending process call and
// returns once the guest logged that it is spinning; the call's error
// arrives on the channel.
func spinning(t *testing.T, ctx context.Context, opts ...host.Option) (<-chan error, time.Time) {
	t.Helper()
	sig := newSignal("spinning")
	e := newEngine(t, append([]host.Option{host.WithLogger(slog.New(sig))}, opts...)...)
	inst := instance(t, load(t, e, fixture(t, "spin")), host.InstanceConfig{NumInputs: 1, Operator: "spinner"})
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- inst.Process(ctx, 0, []abi.Record{{Value: []byte("x")}}, func([]abi.Record) {}) }()
	select {
	case <-sig.ch:
	case err := <-done:
		t.Fatalf("process returned before spinning: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the guest did not start spinning")
	}
	return done, start
}

// gcReturns forces a garbage collection (a stop-the-world, which waits for
// every goroutine, the spinning guest's too) and fails the test if it does
// not come back. Without the guard it never does: the whole process freezes.
func gcReturns(t *testing.T) {
	t.Helper()
	gc := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		runtime.GC()
		gc <- time.Since(start)
	}()
	select {
	case d := <-gc:
		t.Logf("runtime.GC() while the guest spins took %v", d)
	case <-time.After(20 * time.Second):
		t.Fatal("runtime.GC() did not return while the guest spins")
	}
}

// TestSpinningGuestIsCanceled: with default settings (and with no call
// deadline), a guest that never returns lets the Go runtime collect
// garbage, and canceling the call's context stops it promptly with
// ErrCanceled. (Without the guard, host.WithGuard(false) and no deadline,
// the first runtime.GC() never returns and the test process freezes.)
func TestSpinningGuestIsCanceled(t *testing.T) {
	t.Run("default", func(t *testing.T) { testSpinCanceled(t) })
	t.Run("no-deadline", func(t *testing.T) { testSpinCanceled(t, host.WithCallDeadline(0)) })
}

func testSpinCanceled(t *testing.T, opts ...host.Option) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, _ := spinning(t, ctx, opts...)
	for range 3 {
		gcReturns(t)
	}
	canceled := time.Now()
	cancel()
	select {
	case err := <-done:
		if took := time.Since(canceled); took > time.Second {
			t.Errorf("the call stopped %v after the cancel", took)
		}
		var he *host.Error
		if !errors.As(err, &he) || !errors.Is(err, host.ErrCanceled) || he.Operator != "spinner" || he.Phase != abi.PhaseProcess {
			t.Fatalf("err = %v, want ErrCanceled in phase process of operator spinner", err)
		}
		if strings.Contains(he.Stack, "streamd_guard") || he.Stack == "" {
			t.Errorf("stack trace %q: want the guest's frames only", he.Stack)
		}
		t.Log(err)
	case <-time.After(20 * time.Second):
		t.Fatal("the spinning guest was not stopped by the cancel")
	}
}

// TestSpinningGuestMeetsTheDeadline: with a call deadline, the spinning
// call fails with ErrDeadline naming operator, subtask, phase and the bound,
// soon after the bound.
func TestSpinningGuestMeetsTheDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	done, start := spinning(t, context.Background(), host.WithCallDeadline(deadline))
	gcReturns(t)
	select {
	case err := <-done:
		took := time.Since(start)
		if took < deadline || took > deadline+2*time.Second {
			t.Errorf("the call failed after %v, want just after %v", took, deadline)
		}
		if !errors.Is(err, host.ErrDeadline) {
			t.Fatalf("err = %v, want ErrDeadline", err)
		}
		for _, s := range []string{`operator "spinner" subtask 0/1 phase process`, "call deadline exceeded", "300ms"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
		t.Logf("after %v: %v", took, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the spinning guest outlived its deadline")
	}
}

// TestDefaultCallDeadline: the deadline a default engine applies.
func TestDefaultCallDeadline(t *testing.T) {
	if host.DefaultCallDeadline != time.Minute {
		t.Fatalf("DefaultCallDeadline = %v", host.DefaultCallDeadline)
	}
}

// TestGuardRefuses: what the guard cannot rewrite, and a module importing
// the guard's own module, are refused with the place.
func TestGuardRefuses(t *testing.T) {
	e := newEngine(t)
	name := func(s string) []byte { return append(appendLEB(nil, uint32(len(s))), s...) }
	types := []byte{1, 1, 0x60, 0, 0}
	own := append(append(append([]byte{2, 1}, name("streamd_guard")...), name("yield")...), 0, 0)
	atomic := []byte{10, 1, 6, 0, 0x03, 0x40, 0xfe, 0x00, 0x0b} // loop; an atomic op (threads are off)
	for what, c := range map[string]struct {
		wasm []byte
		want string
	}{
		"own import": {module(types, own), "import 0 at byte 17 is from streamd_guard, a module reserved for the host"},
		"opcode":     {module(types, []byte{3, 1, 0}, atomic), "function 0 (body at byte 21): instruction 0xfe at byte 25: unknown or unsupported opcode 0xfe"},
	} {
		_, err := e.Load(context.Background(), "guard.wasm", c.wasm)
		if !errors.Is(err, host.ErrBadModule) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want a bad-module error containing %q", what, err, c.want)
		}
	}
}
