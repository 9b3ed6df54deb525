package runtime

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/testwasm"
)

// spinSignal is a slog handler that sends on ch each time a guest logs "spinning".
type spinSignal struct{ ch chan struct{} }

func (s spinSignal) Enabled(context.Context, slog.Level) bool { return true }
func (s spinSignal) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s spinSignal) WithGroup(string) slog.Handler            { return s }
func (s spinSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "spinning" {
		s.ch <- struct{}{}
	}
	return nil
}

// TestSpinningGuestFailsOnlyItsJob: in one process with an embedded NATS
// server, a job whose guest never returns (host/testdata/spin.wasm) fails
// with ErrDeadline naming its operator and phase; while it spins, garbage
// collection runs, the NATS server answers requests, a second job (through
// the Rust uppercase guest) runs to its end, and a third job with the
// spinning guest is canceled promptly.
func TestSpinningGuestFailsOnlyItsJob(t *testing.T) {
	spin := testwasm.Path(t, "host/testdata/spin.wasm")
	upper := testwasm.Path(t, "examples/wasm/uppercase-rust/uppercase_rust.wasm")
	srv := natstest.Server(t)
	responder := natstest.Connect(t, srv.URL())
	if _, err := responder.Subscribe("ping", func(m *nats.Msg) { m.Respond([]byte("pong")) }); err != nil {
		t.Fatal(err)
	}
	client := natstest.Connect(t, srv.URL())
	ping := func() {
		t.Helper()
		if m, err := client.Request("ping", nil, 5*time.Second); err != nil || string(m.Data) != "pong" {
			t.Fatalf("NATS request while the guest spins: %v", err)
		}
	}

	const deadline = 3 * time.Second
	sig := spinSignal{ch: make(chan struct{}, 4)}
	eng, err := host.NewEngine(context.Background(), host.WithCacheDir(""), host.WithCallDeadline(deadline), host.WithLogger(slog.New(sig)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	spinJob := func() *control.JobGraph {
		return graph(t,
			src("gen", 1, unbounded()),
			op("spin", 1, &jobfile.WasmSpec{Path: spin}, in("gen", control.Forward)),
			sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("spin", control.Forward)),
		)
	}
	waitSpin := func() {
		t.Helper()
		select {
		case <-sig.ch:
		case <-time.After(30 * time.Second):
			t.Fatal("the guest did not start spinning")
		}
	}

	spun := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), spinJob(), Options{Engine: eng})
		spun <- err
	}()
	waitSpin()
	spinStart := time.Now()

	gc := make(chan struct{})
	go func() { runtime.GC(); close(gc) }()
	select {
	case <-gc:
	case <-time.After(20 * time.Second):
		t.Fatal("runtime.GC() did not return while the guest spins")
	}
	ping()

	const n = 20000
	c := newCollector()
	_, err = Run(context.Background(), graph(t,
		src("gen", 1, genSpec(n)),
		op("upper", 1, &jobfile.WasmSpec{Path: upper}, in("gen", control.Forward)),
		sink("out", 1, NativeFactory(c.factory), in("upper", control.Forward)),
	), Options{Engine: eng, BatchSize: 256})
	if err != nil {
		t.Fatalf("the other job: %v", err)
	}
	if got := c.subs[0].records; got != n || !strings.Contains(c.subs[0].recs[n-1], "|VALUE-") {
		t.Fatalf("the other job delivered %d records (last %q), want %d upper-cased", got, c.subs[0].recs[n-1], n)
	}
	select {
	case err := <-spun:
		t.Fatalf("the spinning job ended before the other job finished (%v after it began spinning): %v", time.Since(spinStart), err)
	default:
	}

	ctx, cancel := context.WithCancel(context.Background())
	canceled := make(chan error, 1)
	go func() {
		_, err := Run(ctx, spinJob(), Options{Engine: eng})
		canceled <- err
	}()
	waitSpin()
	cancel()
	at := time.Now()
	select {
	case err := <-canceled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled job: %v, want context.Canceled", err)
		}
		if d := time.Since(at); d > 2*time.Second {
			t.Errorf("the canceled job ended %v after the cancel", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cancel did not stop the job with the spinning guest")
	}
	ping()

	select {
	case err := <-spun:
		if !errors.Is(err, host.ErrDeadline) || !strings.Contains(err.Error(), `operator "spin" subtask 0/1 phase process`) || !strings.Contains(err.Error(), deadline.String()) {
			t.Fatalf("spinning job: %v, want ErrDeadline naming operator spin, phase process and %v", err, deadline)
		}
		t.Logf("after %v: %v", time.Since(spinStart), err)
	case <-time.After(30 * time.Second):
		t.Fatal("the spinning job did not fail")
	}
	ping()
}
