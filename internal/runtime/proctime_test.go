package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// chanSink sends every record it gets to a channel.
type chanSink struct {
	noop
	out chan<- abi.Record
}

func (s chanSink) Process(ctx context.Context, _ int, recs []abi.Record, _ Emitter) error {
	for _, r := range recs {
		select {
		case s.out <- abi.Record{Key: append([]byte(nil), r.Key...), Value: append([]byte(nil), r.Value...), Timestamp: r.Timestamp}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// TestProcessingTimersFireInJob: a running job's wasm operator (the mstate
// conformance guest) registers a processing-time timer per key at ts 5000
// of the engine's injected clock, which stands 200 ms before it when the
// job starts; the task loop wakes for it and fires it once per key, while
// the unbounded source goes on (ptimer_register of a fired (key, ts) again
// fires at once: each key fires at least once).
func TestProcessingTimersFireInJob(t *testing.T) {
	mod := testwasm.Path(t, "internal/conformance/guests/wat/mstate.wasm")
	start := time.Now()
	clock := func() time.Time { return time.UnixMilli(4800).Add(time.Since(start)) }
	eng, err := host.NewEngine(context.Background(), host.WithCacheDir(filepath.Join(os.TempDir(), "streamd-runtime-test-cache")), host.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	// The command 'P' with field i64le(5000): ptimer_register(key, 5000).
	value := []byte{'P', 8, 0, 0, 0}
	value = binary.LittleEndian.AppendUint64(value, 5000)
	gen := &jobfile.SourceSpec{Type: "generator", Rate: 20, KeyPattern: "key-{k}", ValuePattern: string(value), Keys: 4, TSStep: 1}
	out := make(chan abi.Record, 64)
	g := graph(t,
		src("src", 1, gen),
		op("op", 2, &jobfile.WasmSpec{Path: mod}, in("src", control.Hash)),
		sink("out", 1, NativeFactory(func(SubtaskInfo) NativeOperator { return chanSink{out: out} }), in("op", control.Rebalance)),
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, g, Options{Engine: eng, BatchSize: 16})
		done <- err
	}()
	fired := map[string]bool{}
	deadline := time.After(30 * time.Second)
	for len(fired) < 4 {
		select {
		case r := <-out:
			if string(r.Value[:2]) != "pt" || r.Timestamp != 5000 || int64(binary.LittleEndian.Uint64(r.Value[2:])) != 5000 {
				t.Fatalf("emitted %q %q at %d, want a fired timer at 5000", r.Key, r.Value, r.Timestamp)
			}
			if now := clock().UnixMilli(); now < 5000 {
				t.Fatalf("a timer at 5000 fired at %d", now)
			}
			fired[string(r.Key)] = true
		case err := <-done:
			t.Fatalf("the job ended before every key's timer fired (%v): %v", fired, err)
		case <-deadline:
			t.Fatalf("only %v fired in 30 s", fired)
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("job: %v", err)
	}
}
