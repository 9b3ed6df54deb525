package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestBackpressuredNATSSenderTakesCheckpoints (issue 24): a generator on h1
// whose every record goes (hash, one key) to the slow subtask on h2, over
// NATS, with a credit window of 8 KiB: the window is full within a tenth of
// a second, and a re-grant (a quarter of the window, 50 records at 100 ms
// a record) comes every 5 s. A sender that waited for credit inside its
// send took a trigger only then; the generator waits for credit in its
// loop (natsch.Sender.TrySend), takes each trigger at once and stores the
// batches it could not send as output buffers, and the slow subtask takes
// the barrier ahead of the credit window's records after its current batch
// of 2 records. Every checkpoint after the first completes within 3 s
// (trigger to complete; 0.6-1.8 s under a load of 14 on 2 cores, and 5.6-8
// s with the sender waiting inside its send), and they carry in-flight
// bytes.
func TestBackpressuredNATSSenderTakesCheckpoints(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	key := "" // a key pattern whose one key hashes to slow[1]
	for i := 0; key == ""; i++ {
		if dataplane.HashTarget(abi.Record{Key: fmt.Appendf(nil, "key%d-0", i)}, abi.DefaultMaxParallelism, 2) == 1 {
			key = fmt.Sprintf("key%d-{k}", i)
		}
	}
	job := fmt.Sprintf(`name: bpnats
parallelism: 2
checkpoint: {interval: 200ms, dir: chk, mode: unaligned}
operators:
  - uid: gen
    parallelism: 1
    source: {type: generator, rate: 2000, keys: 1, key: %q}
  - uid: slow
    wasm: %s
    allow_clock: true
    config: {sleep_us: 100000}
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: discard}
    inputs: [slow]
`, key, mod)
	path := filepath.Join(dir, "bpnats.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	// One slot each: gen and slow[0] on h1, slow[1] on h2. Credit requests
	// only every 10 s: credit comes back by the receiver's re-grants.
	tc := newCluster(t)
	execs := map[string]*agent.LocalExecutor{}
	for _, h := range []string{"h1", "h2"} {
		execs[h] = &agent.LocalExecutor{Engine: tc.engine, BatchSize: 2,
			ChannelOptions: []natsch.Option{natsch.Window(8 << 10), natsch.CreditRetry(10 * time.Second)}}
		tc.addHostWith(h, 1, execs[h])
	}
	tc.waitHosts(2)
	st := checkpointsOnTwoHosts(t, tc, path, 6)
	if ss := execs["h1"].SenderStats(); ss.CreditWaits == 0 {
		t.Fatalf("h1's senders %+v: the credit window was never full", ss)
	}
	var inFlight int64
	var durations []time.Duration
	for _, c := range st.Checkpoints[1:] {
		durations = append(durations, c.Duration)
		inFlight = max(inFlight, c.InFlight)
	}
	for _, d := range durations {
		if d >= 3*time.Second {
			t.Fatalf("checkpoint durations %v: want each under 3s (a re-grant comes every 5s)", durations)
		}
	}
	if inFlight == 0 {
		t.Fatalf("no checkpoint carries in-flight bytes: %+v", st.Checkpoints)
	}
	t.Logf("checkpoint durations %v, in-flight up to %d bytes; h1's senders %+v", durations, inFlight, execs["h1"].SenderStats())
}
