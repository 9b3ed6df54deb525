package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestNATSExactlyOnceUnderFailure runs a job file with a bounded nats source,
// the failonce guest (it fails once, on the first attempt), the uppercase
// example and a nats sink against an embedded JetStream server, with
// checkpointing. After the restart from the latest checkpoint (or from the
// beginning, if none completed before the failure) the sink commits the
// epochs its checkpoints hold and nothing of the failed attempt's last
// epoch: the output stream keeps every record exactly once.
func TestNATSExactlyOnceUnderFailure(t *testing.T) {
	failonce := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	eng := cachedEngine(t)
	const n = 6000
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprint("p", p), func(t *testing.T) {
			srv, js := jetStreamServer(t)
			ctx := context.Background()
			for _, sc := range []jetstream.StreamConfig{
				{Name: "IN", Subjects: []string{"in.>"}},
				{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: time.Minute, AllowAtomicPublish: true},
			} {
				if _, err := js.CreateStream(ctx, sc); err != nil {
					t.Fatal(err)
				}
			}
			publishValues(t, js, n)

			dir := t.TempDir()
			// The source names the server; the sink takes the runtime's default.
			job, err := jobfile.ParseJob([]byte(fmt.Sprintf(`
name: nats-upper
parallelism: %d
checkpoint: {interval: 20ms, dir: chk, retain: 2}
restart: {strategy: fixed-delay, attempts: 2, delay: 0}
operators:
  - uid: in
    source: {type: nats, url: %q, stream: IN, subject: "in.>", bounded: true, key_from: subject}
  - uid: fail
    wasm: %s
    config: {fail_at: %d}
    inputs: [in]
  - uid: upper
    wasm: %s
    inputs: [fail]
  - uid: out
    sink: {type: nats, subject: out.upper}
    inputs: [upper]
`, p, srv.URL(), failonce, n/p/2, upper)), dir, jobfile.Options{Filename: "nats-upper.yaml"})
			if err != nil {
				t.Fatal(err)
			}
			store, err := checkpoint.OpenDir(job.Checkpoint.Dir, checkpoint.WithRetain(job.Checkpoint.Retain))
			if err != nil {
				t.Fatal(err)
			}
			if job.Checkpoint.Dir != filepath.Join(dir, "chk") {
				t.Fatalf("checkpoint dir %s", job.Checkpoint.Dir)
			}
			var logs syncBuffer
			stats, err := Run(ctx, job.Graph, Options{
				Engine: eng, BatchSize: 16, ChannelCapacity: 2,
				Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
				NATS:       natsutil.ConnectOptions{URLs: []string{srv.URL()}},
				Checkpoint: &CheckpointOptions{Store: store, Interval: job.Checkpoint.Interval, Tick: 10 * time.Millisecond},
				Restart:    job.Restart,
			})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Restarts != 1 {
				t.Fatalf("restarts %d, want 1", stats.Restarts)
			}

			out, err := js.Stream(ctx, "OUT")
			if err != nil {
				t.Fatal(err)
			}
			got := streamValues(t, out, "out.upper", func(m *jetstream.RawStreamMsg) {
				if k := m.Header.Get("Streamd-Key"); !strings.HasPrefix(k, "k") {
					t.Fatalf("output message %d: key %q, want the input subject's last token", m.Sequence, k)
				}
			})
			var want []string
			for i := 0; i < n; i++ {
				want = append(want, fmt.Sprintf("VALUE-%d", i))
			}
			checkExactlyOnce(t, got, want)
			restart := ""
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "job failed, restarting") {
					restart, _, _ = strings.Cut(l[strings.Index(l, "from="):], " delay=")
				}
			}
			t.Logf("p%d: %d checkpoints, elapsed %v; restart %s", p, stats.Checkpoints, stats.Elapsed, restart)
		})
	}
}

// jetStreamServer starts an embedded JetStream server for the test.
// publishValues publishes value-0 .. value-(n-1) on in.k0 .. in.k6.
func publishValues(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := js.PublishAsync(fmt.Sprintf("in.k%d", i%7), fmt.Appendf(nil, "value-%d", i), jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(10 * time.Second):
		t.Fatal("publishing the input timed out")
	}
}

func jetStreamServer(t *testing.T) (*natsutil.Server, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Server(t)
	return srv, natstest.JetStream(t, srv)
}

// streamValues returns the sorted payloads of the messages on subject in
// stream st (not the sink's commit markers, which are on other subjects),
// calling check on each message.
func streamValues(t *testing.T, st jetstream.Stream, subject string, check func(*jetstream.RawStreamMsg)) []string {
	t.Helper()
	ctx := context.Background()
	var got []string
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			t.Fatalf("output message %d: %v", seq, err)
		}
		if check != nil {
			check(m)
		}
		got = append(got, string(m.Data))
		seq = m.Sequence + 1
	}
	sort.Strings(got)
	return got
}

// TestNATSSinkHashedExactlyOnce: generator -hash-> failonce (it fails once,
// mid-stream) -> uppercase -hash-> nats sink, p=2, with a tiny duplicate
// window: the records that reach each sink subtask are replayed in another
// interleaving after the restart, and the stream still holds each once.
// Then the job is run again from its last checkpoint with the sink at
// parallelism 3 (rescaled; the final epochs are committed, nothing new
// comes): still exactly once.
func TestNATSSinkHashedExactlyOnce(t *testing.T) {
	failonce := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	eng := cachedEngine(t)
	const n = 8000
	srv, js := jetStreamServer(t)
	ctx := context.Background()
	out, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: 100 * time.Millisecond, AllowAtomicPublish: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	jobText := func(sinkP int) string {
		return fmt.Sprintf(`
name: hashed
parallelism: 2
checkpoint: {interval: 20ms, dir: chk, retain: 3}
restart: {strategy: fixed-delay, attempts: 2, delay: 0}
operators:
  - uid: gen
    source: {type: generator, count: %d, keys: 50, value: "value-{n}"}
  - uid: fail
    wasm: %s
    config: {fail_at: %d}
    inputs: [{from: gen, partition: hash}]
  - uid: upper
    wasm: %s
    inputs: [fail]
  - uid: out
    parallelism: %d
    sink: {type: nats, subject: out.hashed}
    inputs: [{from: upper, partition: hash}]
`, n, failonce, n/2/2, upper, sinkP)
	}
	run := func(sinkP int, restore bool) Stats {
		job, err := jobfile.ParseJob([]byte(jobText(sinkP)), dir, jobfile.Options{Filename: "hashed.yaml"})
		if err != nil {
			t.Fatal(err)
		}
		store, err := checkpoint.OpenDir(job.Checkpoint.Dir, checkpoint.WithRetain(job.Checkpoint.Retain))
		if err != nil {
			t.Fatal(err)
		}
		opts := Options{
			Engine: eng, BatchSize: 16, ChannelCapacity: 2,
			NATS:       natsutil.ConnectOptions{URLs: []string{srv.URL()}},
			Checkpoint: &CheckpointOptions{Store: store, Interval: job.Checkpoint.Interval, Tick: 10 * time.Millisecond},
			Restart:    job.Restart,
		}
		if restore {
			md, err := store.Latest(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if opts.Restore, err = checkpoint.LoadRestoreFrom(ctx, store, md, job.Graph); err != nil {
				t.Fatal(err)
			}
		}
		stats, err := Run(ctx, job.Graph, opts)
		if err != nil {
			t.Fatal(err)
		}
		return stats
	}
	stats := run(2, false)
	if stats.Restarts != 1 {
		t.Fatalf("restarts %d, want 1", stats.Restarts)
	}
	var want []string
	for i := 0; i < n; i++ {
		want = append(want, fmt.Sprintf("VALUE-%d", i))
	}
	sort.Strings(want)
	checkExactlyOnce(t, streamValues(t, out, "out.hashed", nil), want)
	run(3, true)
	checkExactlyOnce(t, streamValues(t, out, "out.hashed", nil), want)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes (a log handler's).
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
