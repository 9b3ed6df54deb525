//go:build long

package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// The autoscaler's windows in TestAutoscaleOnBacklog: short for a test,
// the cooldown long enough to tell two rescales apart.
const (
	autoStabilization = 2 * time.Second
	autoWindow        = 3 * time.Second
	autoCooldown      = 8 * time.Second
	autoKeys          = 20
)

// autoscaleJob writes a job file: a nats source of stream IN (on the
// server at url), a slow stage
// (failonce counting per key, 2ms a record: some 500 records/s a subtask)
// hash-partitioned from it, and a file sink; autoscaling on, the slow stage
// between 1 and 4, the source and the sink at 1.
func autoscaleJob(t *testing.T, url string) string {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	job := fmt.Sprintf(`name: autoscale
checkpoint: {interval: 200ms, dir: chk}
autoscaler:
  enabled: true
  max_parallelism: 4
  operators: {in: {max_parallelism: 1}, out: {max_parallelism: 1}}
  stabilization: %s
  metrics_window: %s
  cooldown: %s
  catch_up: 10s
operators:
  - uid: in
    source: {type: nats, url: "%s", stream: IN, subject: "in.>", key_from: subject}
  - uid: slow
    wasm: %s
    allow_clock: true
    config: {mode: count, sleep_us: 2000}
    inputs: [{from: in, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: slow, partition: rebalance}]
`, autoStabilization, autoWindow, autoCooldown, url, mod)
	path := filepath.Join(t.TempDir(), "autoscale.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// publisher publishes to IN at a rate it can change, keys k0..k19 on the
// subjects in.k<i>, and counts what it published.
type publisher struct {
	js   jetstream.JetStream
	rate atomic.Int64 // records per second
	n    atomic.Int64 // published (acknowledged)
	err  atomic.Value
	stop chan struct{}
	wg   sync.WaitGroup
}

func startPublisher(t *testing.T, js jetstream.JetStream, rate int64) *publisher {
	p := &publisher{js: js, stop: make(chan struct{})}
	p.rate.Store(rate)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		last, owed := time.Now(), 0.0
		for {
			select {
			case <-p.stop:
				return
			case now := <-tick.C:
				owed += float64(p.rate.Load()) * now.Sub(last).Seconds()
				last = now
				for ; owed >= 1; owed-- {
					i := p.n.Load()
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					_, err := p.js.Publish(ctx, fmt.Sprintf("in.k%d", i%autoKeys), fmt.Appendf(nil, "v%d", i))
					cancel()
					if err != nil {
						p.err.Store(err)
						return
					}
					p.n.Add(1)
				}
			}
		}
	}()
	t.Cleanup(p.halt)
	return p
}

// halt stops publishing and waits for the publisher.
func (p *publisher) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
}

// slowParallelism is the slow stage's parallelism in st.
func slowParallelism(st *wire.JobStatus) int {
	for _, op := range st.Operators {
		if op.UID == "slow" {
			return op.Parallelism
		}
	}
	return 0
}

// slowIn is how many records the slow stage processed, as status shows it.
func slowIn(st *wire.JobStatus) int64 {
	for _, op := range st.Operators {
		if op.UID == "slow" {
			return op.RecordsIn
		}
	}
	return 0
}

// TestAutoscaleOnBacklog (issue 26; make test-long, since it takes 30 s on a
// quiet machine and over 2 min on a loaded one; the decisions themselves are
// tested in control and internal/cluster): a nats source -> a slow wasm stage ->
// a file sink with autoscaling on (the slow stage at most 4). 1000 records/s
// arrive where one slow subtask takes some 500: the source's backlog grows
// and the autoscaler scales the stage up; then only 30/s arrive and it
// scales it down. Decisions are at least a cooldown apart, each with its
// reason in the job's status; the output is every count of every key
// exactly once.
func TestAutoscaleOnBacklog(t *testing.T) {
	tc := newClusterOpts(t, cluster.ControllerOptions{SlotWait: time.Second, RescaleInterval: time.Second}, 4)
	js, err := jetstream.New(connect(t, tc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	path := autoscaleJob(t, tc.srv.URL())
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running", state(wire.JobRunning))
	if st.State != wire.JobRunning || st.Autoscaler == nil || slowParallelism(st) != 1 {
		t.Fatalf("job %s (%s), autoscaler %+v, slow stage at %d: want running, autoscaler on, at 1", st.State, st.Reason, st.Autoscaler, slowParallelism(st))
	}
	t.Logf("autoscaler: %s", st.Autoscaler.Settings)
	pub := startPublisher(t, js, 1000)
	start := time.Now()

	// The backlog: records published and not yet processed by the slow
	// stage (in the stream, or queued in the job's channels, where the
	// source's lag does not see them).
	var lags []int64
	st = tc.waitJobLoose(id, "slow stage scaled up", 2*time.Minute, func(st *wire.JobStatus) bool {
		if st.State == wire.JobRunning && slowParallelism(st) == 1 {
			lags = append(lags, pub.n.Load()-slowIn(st))
		}
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && slowParallelism(st) > 1)
	})
	if st.State != wire.JobRunning {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	up := slowParallelism(st)
	t.Logf("scaled up to %d after %s (%d records published)", up, time.Since(start).Round(time.Millisecond), pub.n.Load())
	if d := st.Autoscaler.Decisions; len(d) == 0 || d[0].Operator != "slow" || d[0].From != 1 || d[0].To != up || !strings.Contains(d[0].Reason, "scale up") {
		t.Fatalf("decisions %+v, want the first: slow 1 -> %d, scale up", d, up)
	} else {
		t.Logf("decision: %s %d -> %d: %s (%s)", d[0].Operator, d[0].From, d[0].To, d[0].Reason, d[0].Outcome)
	}
	if len(lags) < 2 || lags[len(lags)-1] <= lags[0] {
		t.Errorf("backlog while at 1: %v, want it growing", lags)
	} else {
		t.Logf("backlog while at 1: %d -> %d (%d readings)", lags[0], lags[len(lags)-1], len(lags))
	}

	pub.rate.Store(30)
	low := time.Now()
	st = tc.waitJobLoose(id, "slow stage scaled down", 2*time.Minute, func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && slowParallelism(st) < up)
	})
	if st.State != wire.JobRunning {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	t.Logf("scaled down to %d %s after the load dropped", slowParallelism(st), time.Since(low).Round(time.Millisecond))
	pub.halt()
	if err, _ := pub.err.Load().(error); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	n := pub.n.Load()

	// Every record counted, committed: then the job is canceled.
	out := filepath.Join(filepath.Dir(path), "out")
	deadline := time.Now().Add(2 * time.Minute)
	var lines []string
	for {
		lines = outputLines(t, out)
		if int64(len(lines)) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, err = tc.client.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tc.client.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkKeyCounts(t, lines, n)
	t.Logf("%d records, every count once", n)

	var prev time.Time
	for _, d := range st.Autoscaler.Decisions {
		t.Logf("decision at %s: %s %d -> %d: %s (%s)", d.Time.Sub(start).Round(time.Millisecond), d.Operator, d.From, d.To, d.Reason, d.Outcome)
		if !prev.IsZero() && !d.Time.Equal(prev) && d.Time.Sub(prev) < autoCooldown {
			t.Errorf("a decision %s after the one before, within the cooldown %s", d.Time.Sub(prev), autoCooldown)
		}
		prev = d.Time
	}
	for i, r := range st.Rescales {
		t.Logf("rescale at %s: %d -> %d: %s", r.Time.Sub(start).Round(time.Millisecond), r.From, r.To, r.Reason)
		if i > 0 && r.Time.Sub(st.Rescales[i-1].Time) < autoCooldown {
			t.Errorf("rescale %d %s after the one before, within the cooldown %s", i, r.Time.Sub(st.Rescales[i-1].Time), autoCooldown)
		}
	}
}

// checkKeyCounts checks that lines ("k<j>=<count>") are the counts of n
// records over autoKeys keys (record i has key k<i mod autoKeys>): every
// count of every key exactly once.
func checkKeyCounts(t *testing.T, lines []string, n int64) {
	t.Helper()
	seen := map[string]int{}
	for _, l := range lines {
		seen[l]++
	}
	lost, twice := 0, 0
	for k := int64(0); k < autoKeys; k++ {
		per := n / autoKeys
		if k < n%autoKeys {
			per++
		}
		for c := int64(1); c <= per; c++ {
			switch seen[fmt.Sprintf("k%d=%s", k, strconv.FormatInt(c, 10))] {
			case 0:
				lost++
			case 1:
			default:
				twice++
			}
		}
	}
	if lost > 0 || twice > 0 || int64(len(lines)) != n {
		t.Fatalf("output: %d lines for %d records: %d counts missing, %d more than once", len(lines), n, lost, twice)
	}
}
