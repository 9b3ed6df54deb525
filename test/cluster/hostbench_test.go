package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/testwasm"
)

// The two-host throughput benchmarks move 100-byte records (no key) from a
// generator on host A to host B; bytes/s counts the records' values.
const (
	hostBenchRecords = 300000
	hostBenchValue   = 100
	rawBenchBytes    = 64 << 20 // per op of BenchmarkRawNATSPubSub
	rawBenchMsg      = 64 << 10
)

// BenchmarkRawNATSPubSub is the baseline of the two-host benchmarks: one
// connection publishes 64 MiB in 64 KiB messages to a subscriber on another
// connection, both on an embedded server on loopback (the same server setup
// as the two-host benchmarks).
func BenchmarkRawNATSPubSub(b *testing.B) {
	run := rawPubSubRunner(b)
	b.SetBytes(rawBenchBytes)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		run()
	}
	el := time.Since(start)
	b.ReportMetric(float64(rawBenchBytes)*float64(b.N)/el.Seconds(), "bytes/s")
}

// rawPubSubRunner returns a function that publishes rawBenchBytes in
// rawBenchMsg messages and waits until the subscriber has them all.
func rawPubSubRunner(b *testing.B) func() {
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, NoJetStream: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	pub, sub := connect(b, srv.URL()), connect(b, srv.URL())
	var got atomic.Int64
	done := make(chan struct{}, 1)
	target := int64(0)
	s, err := sub.Subscribe("raw.bench", func(m *nats.Msg) {
		if got.Add(int64(len(m.Data))) == atomic.LoadInt64(&target) {
			done <- struct{}{}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, rawBenchMsg)
	rounds := int64(0)
	return func() {
		rounds++
		atomic.StoreInt64(&target, rounds*rawBenchBytes)
		for n := 0; n < rawBenchBytes; n += rawBenchMsg {
			if err := pub.Publish("raw.bench", msg); err != nil {
				b.Fatal(err)
			}
		}
		if err := pub.Flush(); err != nil {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			b.Fatalf("subscriber got %d of %d bytes after 30s", got.Load(), rounds*rawBenchBytes)
		}
	}
}

// twoHostGraph is a generator of 100-byte records, optionally into the
// Rust uppercase map, into a discard sink, all at parallelism 1.
func twoHostGraph(b *testing.B, withMap bool) *control.JobGraph {
	from := "gen"
	mapOp := ""
	if withMap {
		wasm := testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")
		mapOp = fmt.Sprintf("  - uid: upper\n    wasm: %s\n    inputs: [{from: gen, partition: forward}]\n", wasm)
		from = "upper"
	}
	job := fmt.Sprintf(`name: twohost
parallelism: 1
operators:
  - uid: gen
    source: {type: generator, count: %d, key: "", value: "{n}", value_size: %d}
%s  - uid: out
    sink: {type: discard}
    inputs: [{from: %s, partition: forward}]
`, hostBenchRecords, hostBenchValue, mapOp, from)
	path := filepath.Join(b.TempDir(), "twohost.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		b.Fatal(err)
	}
	j, err := jobfile.LoadJob(path, jobfile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return j.Graph
}

// twoHosts runs the graph with the generator on host A and every other
// operator on host B, each host with its own NATS connection to a server on
// loopback, so every record crosses NATS once.
func twoHostRunner(b *testing.B, withMap bool, opts ...natsch.Option) func() {
	g, eng := twoHostGraph(b, withMap), engine(b)
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, NoJetStream: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	var trs [2]*natsch.Transport
	for h := range trs {
		if trs[h], err = natsch.NewTransport(connect(b, srv.URL()), opts...); err != nil {
			b.Fatal(err)
		}
	}
	run := func(attempt int) {
		var atts [2]*runtime.Attempt
		for h := range atts {
			onA := h == 0
			atts[h], err = runtime.StartAttempt(context.Background(), g, runtime.Options{Engine: eng, Attempt: attempt}, runtime.Remote{
				JobID: "twohost", Local: func(id control.SubtaskID) bool { return (id.Operator == "gen") == onA }, Channels: trs[h]})
			if err != nil {
				b.Fatal(err)
			}
		}
		var recs int64
		for h, a := range atts {
			st, err := a.Wait()
			if err != nil {
				b.Fatal(err)
			}
			if h == 1 {
				for _, op := range st.Operators {
					if op.UID == "out" {
						recs = op.RecordsIn
					}
				}
			}
		}
		if recs != hostBenchRecords {
			b.Fatalf("discard got %d records on host B, want %d", recs, hostBenchRecords)
		}
	}
	run(0) // compiles the module
	attempt := 0
	return func() {
		attempt++
		run(attempt)
	}
}

func twoHosts(b *testing.B, withMap bool) {
	run := twoHostRunner(b, withMap)
	b.SetBytes(hostBenchRecords * hostBenchValue)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		run()
	}
	el := time.Since(start)
	b.ReportMetric(float64(hostBenchRecords)*float64(b.N)/el.Seconds(), "records/s")
	b.ReportMetric(float64(hostBenchRecords*hostBenchValue)*float64(b.N)/el.Seconds(), "bytes/s")
}

// BenchmarkTwoHostsGeneratorDiscard: generator on host A, discard on host
// B, 100-byte records over NATS.
func BenchmarkTwoHostsGeneratorDiscard(b *testing.B) { twoHosts(b, false) }

// BenchmarkTwoHostsWasmMap: generator on host A, the Rust uppercase wasm
// map and the discard sink on host B.
func BenchmarkTwoHostsWasmMap(b *testing.B) { twoHosts(b, true) }

// BenchmarkHostKillToProcessing runs a `streamd controller` and three
// `streamd host` processes (two slots each; heartbeats every 100 ms, lost
// after 4 missed) and a checkpointing job of parallelism 4 spread over them
// (rate-limited generator -hash-> uppercase wasm -> nats sink), SIGKILLs a
// host of the job and measures the time until the new attempt produces
// output again: the first sink message that repeats a record index the
// sink had already published (the new attempt replays from the restored
// checkpoint; the old attempt never goes back). It includes noticing the
// lost host (about 400 ms here), canceling, scheduling, deploying the new
// attempt on the two other hosts and restoring.
func BenchmarkHostKillToProcessing(b *testing.B) {
	wasm := testwasm.Path(b, "examples/wasm/uppercase/uppercase.wasm")
	streamdBin(b)
	var total, attempt time.Duration
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		t, a := hostKillOnce(b, wasm)
		total, attempt = total+t, attempt+a
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/kill-to-processing")
	b.ReportMetric(float64(attempt.Milliseconds())/float64(b.N), "ms/kill-to-new-attempt")
}

// hostKillOnce returns the time from the kill to output of the new attempt
// and to the controller's status showing the new attempt.
func hostKillOnce(b *testing.B, wasm string) (time.Duration, time.Duration) {
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	url := srv.URL()
	hb := "--heartbeat-interval=100ms"
	procs := map[string]*proc{"controller": startProc(b, "controller", "controller", "--nats", url, hb, "--lost-after=4")}
	for h := 1; h <= 3; h++ {
		id := fmt.Sprintf("h%d", h)
		procs[id] = startProc(b, id, "host", "--nats", url, hb, "--host-id", id, "--slots", "2", "--data-dir", b.TempDir())
	}
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
		}
	}()
	nc := connect(b, url)
	client, err := client.NewClient(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		hs, err := client.Hosts(ctx)
		if err == nil && len(hs) == 3 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("3 hosts not registered after 20s: %v %v", hs, err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: 2 * time.Minute, AllowAtomicPublish: true}); err != nil {
		b.Fatal(err)
	}
	// The sink's commit markers carry the epoch (checkpoint id) they
	// commit; the new attempt's checkpoint ids come after every id the
	// failed one triggered, so the first marker more than one past the
	// highest seen at the kill is the new attempt's output.
	var mu sync.Mutex
	var maxEpoch, killEpoch int64 = 0, -1
	msgs := 0
	replay := make(chan time.Time, 1)
	sub, err := nc.Subscribe("out.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		msgs++
		if m.Header.Get("Streamd-Commit") == "" {
			return
		}
		ep, err := strconv.ParseInt(m.Header.Get("Streamd-Epoch"), 10, 64)
		if err != nil {
			return
		}
		if killEpoch >= 0 && ep > killEpoch+1 {
			select {
			case replay <- time.Now():
			default:
			}
		}
		maxEpoch = max(maxEpoch, ep)
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	sub.SetPendingLimits(-1, -1)
	dir := b.TempDir()
	job := fmt.Sprintf(`name: kill
parallelism: 4
checkpoint: {interval: 200ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, rate: 4000, keys: 1000}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: nats, subject: out.kill}
    inputs: [{from: upper}]
`, wasm)
	path := filepath.Join(dir, "kill.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		b.Fatal(err)
	}
	jf, err := jobfile.LoadJob(path, jobfile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	id, err := client.Deploy(ctx, jf, path)
	if err != nil {
		b.Fatal(err)
	}
	var st *wire.JobStatus
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err = client.Status(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		n := msgs
		mu.Unlock()
		if st.State == wire.JobRunning && len(st.Checkpoints) >= 2 && n > 1000 {
			break
		}
		if wire.TerminalJobState(st.State) || time.Now().After(deadline) {
			b.Fatalf("job %s (%s), %d messages: want running with 2 checkpoints", st.State, st.Reason, n)
		}
	}
	victim := st.Hosts[1]
	mu.Lock()
	killEpoch = maxEpoch
	mu.Unlock()
	b.StartTimer()
	killed := time.Now()
	if err := procs[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	newAttempt := make(chan time.Time, 1)
	go func() {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if st, err := client.Status(ctx, id); err == nil && st.Attempt >= 1 {
				newAttempt <- time.Now()
				return
			}
		}
		newAttempt <- time.Time{}
	}()
	var again time.Time
	select {
	case again = <-replay:
	case <-time.After(30 * time.Second):
		st, _ = client.Status(ctx, id)
		b.Fatalf("no output of a new attempt 30s after killing %s: job %s attempt %d (%s)", victim, st.State, st.Attempt, st.Reason)
	}
	b.StopTimer()
	if st, err = client.Status(ctx, id); err != nil || st.Attempt < 1 {
		b.Fatalf("output of a new attempt but the job is in attempt %d (%v)", st.Attempt, err)
	}
	seen := <-newAttempt
	if seen.IsZero() {
		b.Fatal("the status never showed a new attempt")
	}
	client.Cancel(ctx, id)
	return again.Sub(killed), seen.Sub(killed)
}

// BenchmarkTwoHostsVsRawNATS alternates raw NATS pub/sub, the two-host
// generator -> discard pipeline, the two-host pipeline with the Rust wasm
// map and that same pipeline in one process, so all four see the same
// machine, and reports each one's bytes/s, the two-host pipelines' as a
// percentage of raw NATS (issue 28: >= 75) and the two-host wasm
// pipeline's as a percentage of the one-process one (issue 28: >= 70).
func BenchmarkTwoHostsVsRawNATS(b *testing.B) {
	runs := []struct {
		name  string
		bytes float64
		run   func()
	}{
		{"raw", rawBenchBytes, rawPubSubRunner(b)},
		{"discard", hostBenchRecords * hostBenchValue, twoHostRunner(b, false)},
		{"wasm", hostBenchRecords * hostBenchValue, twoHostRunner(b, true)},
		{"inprocess", hostBenchRecords * hostBenchValue, oneHostRunner(b)},
	}
	spent := make([]time.Duration, len(runs))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, r := range runs {
			start := time.Now()
			r.run()
			spent[k] += time.Since(start)
		}
	}
	b.StopTimer()
	rate := func(k int) float64 { return runs[k].bytes * float64(b.N) / spent[k].Seconds() }
	for k, r := range runs {
		b.ReportMetric(rate(k), r.name+"-bytes/s")
		if k > 0 && r.name != "inprocess" {
			b.ReportMetric(100*rate(k)/rate(0), r.name+"-%-of-raw")
		}
	}
	b.ReportMetric(100*rate(2)/rate(3), "wasm-%-of-inprocess")
}

// oneHostRunner returns a function that runs the graph of the two-host
// wasm benchmark (generator -> Rust uppercase map -> discard) in one
// process, every channel in-process.
func oneHostRunner(b *testing.B) func() {
	g, eng := twoHostGraph(b, true), engine(b)
	run := func() {
		st, err := runtime.Run(context.Background(), g, runtime.Options{Engine: eng})
		if err != nil {
			b.Fatal(err)
		}
		if got := st.Operators[len(st.Operators)-1].RecordsIn; got != hostBenchRecords {
			b.Fatalf("discard got %d records, want %d", got, hostBenchRecords)
		}
	}
	run() // compiles the module
	return run
}
