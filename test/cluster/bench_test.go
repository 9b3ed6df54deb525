package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/testwasm"
)

const benchRecords = 200000

// benchGraph is a generator hash-partitioned into the uppercase module into a
// discard sink, at parallelism 2.
func benchGraph(b *testing.B) *control.JobGraph {
	wasm := testwasm.Path(b, "examples/wasm/uppercase/uppercase.wasm")
	path := filepath.Join(b.TempDir(), "bench.yaml")
	job := fmt.Sprintf(`name: bench
parallelism: 2
operators:
  - uid: gen
    source: {type: generator, count: %d, keys: 1000}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: discard}
    inputs: [{from: upper}]
`, benchRecords, wasm)
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		b.Fatal(err)
	}
	j, err := jobfile.LoadJob(path, jobfile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return j.Graph
}

func engine(b *testing.B) *host.Engine {
	eng, err := host.NewEngine(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close(context.Background()) })
	return eng
}

// timeRuns runs run b.N times and reports the records/s of benchGraph.
func timeRuns(b *testing.B, run func()) {
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		run()
	}
	b.ReportMetric(float64(benchRecords)*float64(b.N)/time.Since(start).Seconds(), "records/s")
}

// BenchmarkInProcess runs the job in one process, every channel in-process.
func BenchmarkInProcess(b *testing.B) { timeRuns(b, inProcessRunner(b)) }

func inProcessRunner(b *testing.B) func() {
	g, eng := benchGraph(b), engine(b)
	return func() {
		if _, err := runtime.Run(context.Background(), g, runtime.Options{Engine: eng}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTwoHostsNATS runs subtask 0 of every operator on one "host" and
// subtask 1 on another, each with its own NATS connection to a server on
// loopback: the hash edge's cross-host channels go over NATS.
func BenchmarkTwoHostsNATS(b *testing.B) { timeRuns(b, twoHostsNATSRunner(b)) }

func twoHostsNATSRunner(b *testing.B) func() {
	g, eng := benchGraph(b), engine(b)
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, NoJetStream: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	var trs [2]*natsch.Transport
	for h := range trs {
		nc, err := natsutil.Connect(natsutil.URLs(srv.URL()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		if trs[h], err = natsch.NewTransport(nc); err != nil {
			b.Fatal(err)
		}
	}
	attempt := 0
	return func() {
		var atts [2]*runtime.Attempt
		for h := range atts {
			var err error
			atts[h], err = runtime.StartAttempt(context.Background(), g, runtime.Options{Engine: eng, Attempt: attempt}, runtime.Remote{
				JobID: "bench", Local: func(id control.SubtaskID) bool { return id.Index == h }, Channels: trs[h]})
			if err != nil {
				b.Fatal(err)
			}
		}
		attempt++
		for _, a := range atts {
			if _, err := a.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkTwoHostsVsInProcess alternates the job of BenchmarkInProcess
// and of BenchmarkTwoHostsNATS (generator -hash-> uppercase wasm -> discard
// at parallelism 2; across the two "hosts" half of the hash edge's records
// cross NATS), five turns each per iteration, and reports the two hosts'
// throughput as a percentage of one process's (issue 28: >= 70).
func BenchmarkTwoHostsVsInProcess(b *testing.B) {
	runs := []func(){inProcessRunner(b), twoHostsNATSRunner(b)}
	for _, r := range runs {
		r() // compile, fill the pools
	}
	names := []string{"inprocess", "twohosts"}
	const turns = 5
	spent := make([]time.Duration, len(runs))
	b.ResetTimer()
	for i := 0; i < b.N*turns; i++ {
		for k, r := range runs {
			start := time.Now()
			r()
			spent[k] += time.Since(start)
		}
	}
	b.StopTimer()
	rate := func(k int) float64 { return float64(benchRecords) * float64(b.N*turns) / spent[k].Seconds() }
	for k, name := range names {
		b.ReportMetric(rate(k), name+"-records/s")
	}
	b.ReportMetric(100*rate(1)/rate(0), "twohosts-%-of-inprocess")
}
