//go:build long

package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	_ "github.com/streamd/streamd/internal/connector/all" // the kafka connector, for deploy's job file
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestKafkaExactlyOnceAcrossHostKill: a Kafka topic of 4 partitions (kfake
// in the test process) -> hash -> a keyed running count (wasm) -> the
// exactly-once Kafka sink, deployed on a cluster of two host processes
// over embedded NATS, at parallelism 2. Once the job has checkpointed, the
// host process with most of it is killed (SIGKILL); the job fails over to
// the other host and restores its checkpoint. A read_committed consumer
// sees every count of every key exactly once.
func TestKafkaExactlyOnceAcrossHostKill(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 4)
	c.CreateTopic(t, "out", 4)
	const n = 6000
	recs, want := kafkatest.KeyedInput("in", n, 13, 4)
	c.Produce(t, "in", recs...)

	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	url := srv.URL()
	hb := "--heartbeat-interval=100ms"
	startLogged(t, "controller", "controller", "--nats", url, hb, "--lost-after="+procLostAfter)
	hosts := map[string]*loggedProc{}
	for _, id := range []string{"h1", "h2"} {
		hosts[id] = startLogged(t, id, "host", "--nats", url, hb, "--host-id", id, "--slots", "6", "--data-dir", t.TempDir())
	}
	tc := &testCluster{t: t, srv: srv}
	tc.client, err = client.NewClient(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	tc.waitHosts(2)

	dir := t.TempDir()
	job := fmt.Sprintf(`name: kafka-eo-cluster
parallelism: 2
checkpoint: {interval: 200ms, dir: chk}
operators:
  - uid: in
    source: {type: kafka, brokers: [%s], topics: [in]}
  - uid: count
    wasm: %s
    allow_clock: true
    config: {mode: count, sleep_us: 500}
    inputs: [{from: in, partition: hash}]
  - uid: out
    sink: {type: kafka, brokers: [%s], topic: out, transaction_timeout: 30s}
    inputs: [count]
`, c.Brokers[0], testwasm.Path(t, "internal/testguests/failonce/failonce.wasm"), c.Brokers[0])
	path := filepath.Join(dir, "kafka.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running with two checkpoints", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && len(st.Checkpoints) >= 2)
	})
	if st.State != wire.JobRunning {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	// The victim: the host with the most subtasks of the job.
	on := map[string]int{}
	for _, op := range st.Operators {
		for _, s := range op.Subtasks {
			on[s.Host]++
		}
	}
	victim := "h1"
	if on["h2"] > on["h1"] {
		victim = "h2"
	}
	attempt := st.Attempt
	if err := hosts[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-hosts[victim].done
	st = tc.waitJob(id, "running again after the host kill", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.Attempt > attempt && st.State == wire.JobRunning)
	})
	if st.State != wire.JobRunning {
		t.Fatalf("after killing %s: job %s: %s", victim, st.State, st.Reason)
	}
	t.Logf("killed %s (%d subtasks) after checkpoint %d; attempt %d runs on %v", victim, on[victim],
		st.Checkpoints[len(st.Checkpoints)-1].ID, st.Attempt, st.Hosts)

	// The source never ends: wait for every count, then cancel.
	var got []string
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got = got[:0]
		for _, r := range c.ReadCommitted(t, "out") {
			got = append(got, string(r.Value))
		}
		if len(got) >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3 min the output has %d of %d counts", len(got), n)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if _, err := tc.client.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, r := range c.ReadCommitted(t, "out") {
		got = append(got, string(r.Value))
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		lost, twice := kafkatest.Diff(got, want)
		t.Fatalf("read_committed output: %d records, want %d: %d lost, %d more than once", len(got), n, lost, twice)
	}
	t.Logf("%d counts exactly once across the host kill", n)
}
