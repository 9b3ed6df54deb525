//go:build long

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/connector/kafka"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestKafkaExactlyOnceThroughKills: a Kafka topic of 4 partitions -> hash
// -> a keyed running count (wasm) -> the exactly-once Kafka sink, run with
// `streamd run` (a child process) against an in-process Kafka (kfake, in
// the test process). The run is killed with SIGKILL 20 times and resumed
// --from its checkpoint directory each time, at parallelism 2, then 3, then
// 1; a twenty-first of the input arrives before each run. The kills come
// at random checkpoints, and at the points of the sink's commit that the
// sink's test hook (kafka.EnvTestStall) stops at: after a checkpoint
// completed and before its transaction began, with the records produced,
// with the marker committed in the open transaction, and after the
// transaction committed (the entry still in the checkpoint). A
// read_committed consumer then sees every count of every key exactly once.
func TestKafkaExactlyOnceThroughKills(t *testing.T) {
	got, want, kills := runKafkaKills(t, false)
	lost, twice := kafkatest.Diff(got, want)
	if lost > 0 || twice > 0 || len(got) != len(want) {
		t.Fatalf("read_committed output: %d records, want %d: %d lost, %d more than once (kills %v)", len(got), len(want), lost, twice, kills)
	}
	t.Logf("%d records exactly once through kills %v", len(got), kills)
}

// TestKafkaWithoutMarkerDuplicates runs the same test with the sinks'
// marker check turned off (kafka.EnvTestSkipMarker): a restore then
// produces again entries a killed run had committed, and the output has
// duplicates, so the test above can tell a sink that is not exactly once.
func TestKafkaWithoutMarkerDuplicates(t *testing.T) {
	got, want, kills := runKafkaKills(t, true)
	// (The output is read once it has as many records as the input, which
	// with duplicates is before every count is in: counts may be missing.)
	_, twice := kafkatest.Diff(got, want)
	if twice == 0 {
		t.Fatalf("without the marker check: %d records for %d, none more than once (kills %v)", len(got), len(want), kills)
	}
	t.Logf("without the marker check: %d records for %d, %d more than once (kills %v)", len(got), len(want), twice, kills)
}

// watchOpenTransactions logs, every 5 s until stopped, the transactions
// of the cluster open for more than 10 s (what a read_committed reader
// would wait behind).
func watchOpenTransactions(t *testing.T, c *kafkatest.Cluster) (stop func()) {
	adm := kadm.NewClient(c.Client(t))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ds, err := adm.DescribeTransactions(ctx)
			cancel()
			if err != nil {
				t.Logf("describe transactions: %v", err)
				continue
			}
			for _, d := range ds.Sorted() {
				open := d.State == "Ongoing" || d.State == "PrepareCommit" || d.State == "PrepareAbort"
				if open && time.Since(time.UnixMilli(d.StartTimestamp)) > 10*time.Second {
					t.Logf("open transaction %s: %s pid %d epoch %d since %v, %v", d.TxnID, d.State, d.ProducerID, d.ProducerEpoch,
						time.UnixMilli(d.StartTimestamp).Format("15:04:05.000"), d.Topics)
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// logProducers logs the active producers of topic's partitions and their
// open transactions, and the partitions' end and last stable offsets.
func logProducers(t *testing.T, c *kafkatest.Cluster, topic string) {
	adm := kadm.NewClient(c.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps, err := adm.DescribeProducers(ctx, kadm.TopicsSet{topic: {0: {}, 1: {}, 2: {}, 3: {}}})
	if err != nil {
		t.Logf("describe producers: %v", err)
	}
	ps.EachProducer(func(p kadm.DescribedProducer) {
		if p.Topic == topic {
			t.Logf("producer %s/%d: pid %d epoch %d txn start %d", p.Topic, p.Partition, p.ProducerID, p.ProducerEpoch, p.CurrentTxnStartOffset)
		}
	})
	ends, _ := adm.ListEndOffsets(ctx, topic)
	stable, _ := adm.ListCommittedOffsets(ctx, topic)
	ends.Each(func(o kadm.ListedOffset) {
		so, _ := stable.Lookup(o.Topic, o.Partition)
		t.Logf("%s/%d: end %d, last stable %d", o.Topic, o.Partition, o.Offset, so.Offset)
	})
}

// lockedBuffer is a process's stderr, read while it writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startEnv starts `streamd args...` in dir with env added.
func startEnv(t *testing.T, dir string, env []string, args ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(streamd(t), args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "STREAMD_WASM_CACHE_DIR="+cacheDir(t)), env...)
	errb := &lockedBuffer{}
	cmd.Stderr = errb
	must(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, errb
}

// waitUntil polls cond for up to 90s, failing with the process's stderr.
func waitUntil(t *testing.T, what string, errb *lockedBuffer, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s\nstderr:\n%s", what, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runKafkaKills is the test of TestKafkaExactlyOnceThroughKills (with
// skipMarker, the sinks' marker check off); it returns the output a
// read_committed consumer sees, the counts it must see once each, and how
// many kills came at each point.
func runKafkaKills(t *testing.T, skipMarker bool) (got, want []string, kills map[string]int) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 4)
	c.CreateTopic(t, "out", 4)
	stopWatch := watchOpenTransactions(t, c)
	defer stopWatch()
	const kills20 = 20
	const n = (kills20 + 1) * 120
	recs, want := kafkatest.KeyedInput("in", n, 13, 4)
	chunk := func(i int) []*kgo.Record { return recs[i*n/(kills20+1) : (i+1)*n/(kills20+1)] }

	dir := t.TempDir()
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	brokers := strings.Join(c.Brokers, ", ")
	job := fmt.Sprintf(`name: kafka-eo
checkpoint: {interval: 100ms, dir: chk}
operators:
  - uid: in
    source: {type: kafka, brokers: [%s], topics: [in], group: streamd-e2e}
  - uid: count
    wasm: %s
    allow_clock: true
    config: {mode: count, sleep_us: 1000}
    inputs: [{from: in, partition: hash}]
  - uid: out
    sink: {type: kafka, brokers: [%s], topic: out, transaction_timeout: 30s}
    inputs: [count]
`, brokers, mod, brokers)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	chk := filepath.Join(dir, "chk")
	var env []string
	if skipMarker {
		env = append(env, kafka.EnvTestSkipMarker+"=1")
	}
	args := func(p int, from bool) []string {
		// Small batches and channels: a barrier waits behind few records,
		// so checkpoints complete (and the kills come) while it works.
		a := []string{"run", "--progress", "off", "--batch-size", "8", "--channel-capacity", "2", "-p", fmt.Sprint(p), "job.yaml"}
		if from {
			a = append(a, "--from", "chk")
		}
		return a
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 25))
	// Where each run is killed: after some checkpoints, or at one of the
	// sink's commit points (the stall hook stops a subtask there).
	where := append([]string{"checkpoints"}, kafka.TestStallPoints...)
	kills = map[string]int{}
	for round := range kills20 {
		p := 2
		switch {
		case round >= 14:
			p = 1
		case round >= 7:
			p = 3
		}
		c.Produce(t, "in", chunk(round)...)
		point := where[round%len(where)]
		renv := env
		if point != "checkpoints" {
			// The first commit of the run to reach the point: a restore's
			// commit of what the killed run left, or the first of this
			// run's new records (it has some, so it always comes; a later
			// one might not).
			renv = append(slices.Clone(env), fmt.Sprintf("%s=%s:1", kafka.EnvTestStall, point))
		}
		before := newestCheckpointID(chk)
		cmd, errb := startEnv(t, dir, renv, args(p, round > 0)...)
		if point == "checkpoints" {
			more := int64(1 + rng.IntN(3))
			waitUntil(t, fmt.Sprintf("%d more checkpoints in round %d", more, round), errb, func() bool { return newestCheckpointID(chk) >= before+more })
			time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond) // somewhere between checkpoints
		} else {
			waitUntil(t, fmt.Sprintf("the sink's stall at %s in round %d", point, round), errb, func() bool {
				return strings.Contains(errb.String(), "kafka sink: test stall at "+point)
			})
		}
		must(t, cmd.Process.Signal(syscall.SIGKILL))
		cmd.Wait()
		kills[point]++
		t.Logf("round %d (p=%d): killed at %s, newest checkpoint %d", round, p, point, newestCheckpointID(chk))
	}
	// The last run resumes and goes on until every count is committed,
	// then stops with a savepoint.
	c.Produce(t, "in", chunk(kills20)...)
	cmd, errb := startEnv(t, dir, env, args(1, true)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stderr of the last run:\n%s", errb.String())
		}
	})
	read := func() []string {
		var out []string
		for _, r := range c.ReadCommitted(t, "out") {
			out = append(out, string(r.Value))
		}
		return out
	}
	// A run that makes no progress for a minute shows where it is stuck
	// (SIGQUIT: its goroutines on stderr, which the failure prints) and
	// what the partitions' producers are.
	stuck := time.AfterFunc(60*time.Second, func() {
		logProducers(t, c, "out")
		cmd.Process.Signal(syscall.SIGQUIT)
	})
	// Distinct counts: without the marker check the output holds
	// duplicates, and as many records as n may be in it before the last
	// run has written anything (its SIGINT would then come before it
	// handles signals).
	waitUntil(t, fmt.Sprintf("%d distinct counts in the output", n), errb, func() bool {
		got = read()
		distinct := map[string]bool{}
		for _, v := range got {
			distinct[v] = true
		}
		return len(distinct) >= n
	})
	stuck.Stop()
	// Everything is in: the job is idle, and stops with a savepoint.
	must(t, cmd.Process.Signal(syscall.SIGINT))
	if err := cmd.Wait(); cmd.ProcessState.ExitCode() != 130 {
		t.Errorf("SIGINT: exit %d (%v), want 130 (stopped with a savepoint)\nstderr:\n%s", cmd.ProcessState.ExitCode(), err, errb.String())
	}
	got = read()
	slices.Sort(got)
	return got, want, kills
}
