package cluster_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestDeadLetterAcrossHostLoss: a deployed job of 100 000 records through
// an operator with on_error dead_letter, with three poison records, loses
// its host mid-run and fails over to the other one. The poison records are
// in the dead-letter directory once each, with their error, and every
// other record is committed exactly once (failonce's per-key counts skip
// the poison records: their state writes were undone).
func TestDeadLetterAcrossHostLoss(t *testing.T) {
	wasm := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	tc := newCluster(t, 1, 1)
	const n, keys = 100000, 13
	poison := map[int]bool{3000: true, 50000: true, 99999: true}
	dir := t.TempDir()
	job := fmt.Sprintf(`name: dlq
checkpoint: {interval: 100ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: 25000, keys: %d}
  - uid: count
    wasm: %s
    config: {mode: count, poison: "value-3000,value-50000,value-99999"}
    on_error: dead_letter
    dead_letter: {type: file, path: dead/}
    max_dead_letters: 10
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: count}]
`, n, keys, wasm)
	path := filepath.Join(dir, "dlq.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running with a checkpoint past the first poison record", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) ||
			(st.State == wire.JobRunning && len(st.Checkpoints) > 0 && st.Operators[0].RecordsOut > 10000)
	})
	if st.State != wire.JobRunning {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	tc.hosts[st.Hosts[0]].Close() // a crash
	st = tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished || st.Attempt != 1 {
		t.Fatalf("job %s in attempt %d (%s): want finished after one failover", st.State, st.Attempt, st.Reason)
	}
	var want []string
	per := map[int]int{}
	for i := 0; i < n; i++ {
		if !poison[i] {
			per[i%keys]++
			want = append(want, fmt.Sprintf("key-%d=%d", i%keys, per[i%keys]))
		}
	}
	slices.Sort(want)
	sameLines(t, outputLines(t, filepath.Join(dir, "out")), want)
	var got []string
	for _, l := range outputLinesOf(t, filepath.Join(dir, "dead"), "part-"+id+"-") {
		var d struct{ Operator, Error, Value, Job string }
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("dead letter %q: %v", l, err)
		}
		if d.Operator != "count" || d.Job != "dlq" || d.Error != "guest failed: ProcessElement: failonce: poison record "+d.Value {
			t.Errorf("dead letter %s: want operator count and the guest's error", l)
		}
		got = append(got, d.Value)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"value-3000", "value-50000", "value-99999"}) {
		t.Fatalf("dead letters of %v, want each poison record once", got)
	}
	if !strings.Contains(st.Attempts[0].Reason, "lost") {
		t.Errorf("attempt 0 ended %q, want the lost host", st.Attempts[0].Reason)
	}
}
