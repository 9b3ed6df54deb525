package webapi_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/testwasm"
	"github.com/streamd/streamd/internal/webapi"
)

// BenchmarkConsolePolledVsNone: the same job (generator -> uppercase wasm
// -> discard, p=2, a checkpoint every second) with the REST API served and
// polled every second as the console polls it (the job list, the job, its
// plan and its checkpoints), and without any listener, alternating in one
// benchmark. Reported: polled as % of none (target >= 95).
func BenchmarkConsolePolledVsNone(b *testing.B) {
	const n = 6_000_000
	mod := testwasm.Path(b, "examples/wasm/uppercase/uppercase.wasm")
	eng, err := host.NewEngine(context.Background(), host.WithCacheDir(filepath.Join(b.TempDir(), "cache")))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close(context.Background()) })
	graph := func(count int) *control.JobGraph {
		g, err := control.NewJobGraph("console-bench", []*control.Vertex{
			{UID: "gen", Parallelism: 2, Kind: control.KindSource, Spec: &jobfile.SourceSpec{Type: "generator", Count: int64(count), KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 1000, TSStep: 1}},
			{UID: "upper", Parallelism: 2, Kind: control.KindOperator, Spec: &jobfile.WasmSpec{Path: mod}, Inputs: []control.Edge{{From: "gen", Partition: control.Forward}}},
			{UID: "out", Parallelism: 2, Kind: control.KindSink, Spec: &jobfile.SinkSpec{Type: "discard"}, Inputs: []control.Edge{{From: "upper", Partition: control.Forward}}},
		})
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	run := func(count int, polled bool) {
		g := graph(count)
		store, err := checkpoint.OpenDir(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		opts := runtime.Options{Engine: eng, Checkpoint: &runtime.CheckpointOptions{Store: store, Interval: time.Second}}
		var wg sync.WaitGroup
		stopPoll := make(chan struct{})
		if polled {
			l := webapi.NewLocal(webapi.LocalJob{Graph: g, CheckpointMode: "aligned", Cancel: cancel})
			srv, err := webapi.Listen("127.0.0.1:0", webapi.New(l, webapi.Options{}))
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close(context.Background())
			opts.Progress = l.Update
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.NewTicker(time.Second)
				defer t.Stop()
				for {
					for _, p := range []string{"/jobs", "/jobs/" + l.ID(), "/jobs/" + l.ID() + "/plan", "/jobs/" + l.ID() + "/checkpoints"} {
						resp, err := http.Get(srv.URL() + p)
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							b.Errorf("GET %s: %s", p, resp.Status)
							return
						}
					}
					select {
					case <-t.C:
					case <-stopPoll:
						return
					}
				}
			}()
		}
		stats, err := runtime.Run(ctx, g, opts)
		close(stopPoll)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		if got := stats.Operators[2].RecordsIn; got != int64(count) {
			b.Fatalf("discard got %d records, want %d", got, count)
		}
	}
	run(10000, true)
	spent := [2]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, polled := range []bool{false, true} {
			start := time.Now()
			run(n, polled)
			spent[k] += time.Since(start)
		}
	}
	b.StopTimer()
	rate := func(d time.Duration) float64 { return float64(b.N) * n / d.Seconds() }
	b.ReportMetric(rate(spent[0]), "none-records/s")
	b.ReportMetric(rate(spent[1]), "polled-records/s")
	b.ReportMetric(100*rate(spent[1])/rate(spent[0]), "polled-%-of-none")
}
