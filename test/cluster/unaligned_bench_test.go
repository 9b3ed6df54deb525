package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/testwasm"
)

// The back-pressured unaligned checkpoint across two hosts (issue 24): a
// generator (parallelism 1) at bp2SourceRate records/s, rebalanced over two
// subtasks of a slow wasm stage (failonce with sleep_us: bp2SleepUS a
// record, and more under load: the stage keeps up with a third of the
// source at most), then a
// discard sink (one-process-slow-records/s shows the pace). Batches of
// bp2Batch records: an unaligned barrier waits for about two batches at the
// slow pace (the sender's blocked send, the receiver's current batch). On two hosts of one slot each, slot 0 (the
// generator, slow[0], out[0]) is on one host and slot 1 (slow[1], out[1]) on
// the other: the channel to slow[1] crosses NATS, where the barrier
// overtakes the credit window's records.
const (
	bp2SourceRate = 12000
	bp2SleepUS    = 500
	bp2Batch      = 25
	bp2Interval   = 500 * time.Millisecond
	bp2PerRun     = 5 // completed periodic checkpoints per run; the first is not counted
)

func bp2Job(b *testing.B) (string, *jobfile.Job) {
	mod := testwasm.Path(b, "internal/testguests/failonce/failonce.wasm")
	dir := b.TempDir()
	job := fmt.Sprintf(`name: bp2
parallelism: 2
checkpoint: {interval: %s, dir: chk, mode: unaligned}
operators:
  - uid: gen
    parallelism: 1
    source: {type: generator, rate: %d, keys: 1000}
  - uid: slow
    wasm: %s
    allow_clock: true
    config: {sleep_us: %d}
    inputs: [{from: gen, partition: rebalance}]
  - uid: out
    sink: {type: discard}
    inputs: [slow]
`, bp2Interval, bp2SourceRate, mod, bp2SleepUS)
	path := filepath.Join(dir, "bp2.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		b.Fatal(err)
	}
	j, err := jobfile.LoadJob(path, jobfile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return path, j
}

// bp2InProcess runs the job in this process (in-process channels, as
// streamd run does) until bp2PerRun checkpoints are complete, and returns
// them with the slow stage's records/s.
func bp2InProcess(b *testing.B, j *jobfile.Job) ([]runtime.CheckpointStats, float64) {
	store, err := checkpoint.OpenDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	n := 0
	onComplete := func(*checkpoint.Metadata) {
		mu.Lock()
		defer mu.Unlock()
		if n++; n == bp2PerRun {
			cancel()
		}
	}
	st, err := runtime.Run(ctx, j.Graph, runtime.Options{Engine: engine(b), BatchSize: bp2Batch, Checkpoint: &runtime.CheckpointOptions{
		Store: store, Interval: bp2Interval, Mode: control.AlignUnaligned, OnComplete: onComplete}})
	if !errors.Is(err, context.Canceled) {
		b.Fatalf("in-process run: %v", err)
	}
	if len(st.Recent) < bp2PerRun {
		b.Fatalf("in-process run: %d checkpoints, want %d", len(st.Recent), bp2PerRun)
	}
	return st.Recent[1:bp2PerRun], float64(st.Operators[1].RecordsIn) / st.Elapsed.Seconds()
}

// bp2TwoHosts deploys the job on two hosts of one slot each and cancels it
// once bp2PerRun checkpoints are complete.
func bp2TwoHosts(b *testing.B, tc *testCluster, path string) []runtime.CheckpointStats {
	return checkpointsOnTwoHosts(b, tc, path, bp2PerRun).Checkpoints[1:bp2PerRun]
}

// checkpointsOnTwoHosts deploys the job at path, waits for n completed
// checkpoints, cancels it and returns its status; it fails unless the job
// had n checkpoints and ran on h1 and h2.
func checkpointsOnTwoHosts(tb testing.TB, tc *testCluster, path string, n int) *wire.JobStatus {
	tb.Helper()
	id := deploy(tb, tc, path, jobfile.Options{})
	st := tc.waitJob(id, fmt.Sprintf("%d checkpoints", n), func(st *wire.JobStatus) bool {
		return len(st.Checkpoints) >= n || wire.TerminalJobState(st.State)
	})
	if _, err := tc.client.Cancel(context.Background(), id); err != nil {
		tb.Fatal(err)
	}
	tc.waitJob(id, "canceled", func(st *wire.JobStatus) bool { return wire.TerminalJobState(st.State) })
	if len(st.Checkpoints) < n {
		tb.Fatalf("two hosts: %s (%s) with %d checkpoints, want %d", st.State, st.Reason, len(st.Checkpoints), n)
	}
	if !slices.Equal(st.Hosts, []string{"h1", "h2"}) {
		tb.Fatalf("two hosts: the job ran on %v, want [h1 h2]", st.Hosts)
	}
	return st
}

// BenchmarkUnalignedBackpressureTwoHosts alternates the back-pressured job
// in one process and spread over two hosts (embedded NATS, in-process
// hosts), unaligned, and reports each side's median and slowest checkpoint
// duration (trigger to complete), the in-flight bytes the two-host
// checkpoints carry (median), two hosts' median as a multiple of one
// process's (target <= 2, and under 1 s), and the slow stage's records/s in
// one process (the source makes bp2SourceRate).
func BenchmarkUnalignedBackpressureTwoHosts(b *testing.B) {
	path, j := bp2Job(b)
	tc := newCluster(b)
	for _, h := range []string{"h1", "h2"} {
		tc.addHostWith(h, 1, &agent.LocalExecutor{Engine: tc.engine, BatchSize: bp2Batch})
	}
	tc.waitHosts(2)
	var one, two []runtime.CheckpointStats
	var rate float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cs, r := bp2InProcess(b, j)
		one, rate = append(one, cs...), rate+r
		two = append(two, bp2TwoHosts(b, tc, path)...)
	}
	b.StopTimer()
	ms := func(cs []runtime.CheckpointStats) (med, slowest float64) {
		d := make([]float64, len(cs))
		for i, c := range cs {
			d[i] = float64(c.Duration.Microseconds()) / 1000
		}
		slices.Sort(d)
		return d[len(d)/2], d[len(d)-1]
	}
	var inflight []int64
	for _, c := range two {
		inflight = append(inflight, c.InFlight)
	}
	slices.Sort(inflight)
	oneMed, oneMax := ms(one)
	twoMed, twoMax := ms(two)
	b.ReportMetric(oneMed, "one-process-ms-median")
	b.ReportMetric(oneMax, "one-process-ms-max")
	b.ReportMetric(twoMed, "two-hosts-ms-median")
	b.ReportMetric(twoMax, "two-hosts-ms-max")
	b.ReportMetric(float64(inflight[len(inflight)/2]), "two-hosts-inflight-B-median")
	b.ReportMetric(twoMed/oneMed, "two-hosts-x-one-process")
	b.ReportMetric(rate/float64(b.N), "one-process-slow-records/s")
}
