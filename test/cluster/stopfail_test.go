package cluster_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/testwasm"
)

// nativeExecutor runs jobs like agent.LocalExecutor with the operator uid
// replaced by a native operator (runtime.NativeFactory): the host builds
// the graph afresh for every assignment, so the replacement holds for every
// attempt, on one host or spread over hosts.
type nativeExecutor struct {
	*agent.LocalExecutor
	uid string
	op  runtime.NativeFactory
}

func (e nativeExecutor) Start(ctx context.Context, r agent.ExecRequest) (agent.Execution, error) {
	if v := r.Graph.Vertex(e.uid); v != nil {
		v.Spec = e.op
	}
	return e.LocalExecutor.Start(ctx, r)
}

// failNotify passes records on; armed, the first notify_checkpoint_complete
// after that fails (and disarms it).
type failNotify struct{ armed *atomic.Bool }

func (failNotify) Open(context.Context, runtime.SubtaskInfo) error { return nil }
func (failNotify) Process(_ context.Context, _ int, recs []abi.Record, emit runtime.Emitter) error {
	emit(recs)
	return nil
}
func (failNotify) AdvanceWatermark(context.Context, int64, runtime.Emitter) error { return nil }
func (failNotify) EndInput(context.Context, int, runtime.Emitter) error           { return nil }
func (failNotify) Finish(context.Context, runtime.Emitter) error                  { return nil }
func (failNotify) Close(context.Context) error                                    { return nil }
func (failNotify) SnapshotState(context.Context, int64) error                     { return nil }
func (f failNotify) NotifyCheckpointComplete(_ context.Context, id int64) error {
	if f.armed.CompareAndSwap(true, false) {
		return fmt.Errorf("injected failure in notify_checkpoint_complete of checkpoint %d", id)
	}
	return nil
}

// TestStopWhoseSavepointFailsReturnsPromptly stops a job whose operator
// fails in notify_checkpoint_complete of the stop's savepoint, on one host
// (the host's runtime drives the stop) and spread over two (the controller
// drives it): the stop returns an error at once that names the savepoint and
// the failure, the job is not left stopping but restarts and runs on, and a
// second stop then stops it.
func TestStopWhoseSavepointFailsReturnsPromptly(t *testing.T) {
	for _, c := range []struct {
		name  string
		slots []int
		hosts int
	}{{"one-host", []int{2}, 1}, {"spread", []int{1, 1}, 2}} {
		t.Run(c.name, func(t *testing.T) {
			var armed atomic.Bool
			tc := newCluster(t)
			for i, n := range c.slots {
				exec := nativeExecutor{LocalExecutor: &agent.LocalExecutor{Engine: tc.engine}, uid: "op",
					op: func(runtime.SubtaskInfo) runtime.NativeOperator { return failNotify{&armed} }}
				tc.addHostExec(fmt.Sprintf("h%d", i+1), n, exec)
			}
			tc.waitHosts(len(c.slots))
			path := stopFailJob(t)
			id := deploy(t, tc, path, jobfile.Options{})
			st := tc.waitJob(id, "running", func(st *wire.JobStatus) bool {
				return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[1].RecordsIn > 0)
			})
			if st.State != wire.JobRunning || len(st.Hosts) != c.hosts {
				t.Fatalf("job %s on %v (%s): want running on %d hosts", st.State, st.Hosts, st.Reason, c.hosts)
			}

			armed.Store(true)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			start := time.Now()
			sp, err := tc.client.Stop(ctx, id, "", false)
			took := time.Since(start)
			t.Logf("stop returned after %s: %v", took.Round(time.Millisecond), err)
			if err == nil {
				t.Fatalf("stop returned savepoint %s, want an error (the operator failed in notify)", sp)
			}
			if took > 15*time.Second {
				t.Errorf("stop returned after %s: want it soon after the failure", took)
			}
			for _, want := range []string{"injected failure in notify_checkpoint_complete", "savepoint " + filepath.Join(filepath.Dir(path), "chk")} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("stop error %q: want it to name %q", err, want)
				}
			}
			if armed.Load() {
				t.Fatal("the operator was never notified of the stop's savepoint")
			}
			st, err = tc.client.Status(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != wire.JobRunning && st.State != wire.JobRestarting {
				t.Fatalf("after the failed stop the job is %s (%s), want running or restarting", st.State, st.Reason)
			}

			// It runs on and stops with a second stop.
			tc.waitJob(id, "running again", func(st *wire.JobStatus) bool {
				return wire.TerminalJobState(st.State) || st.State == wire.JobRunning
			})
			sp, err = tc.client.Stop(ctx, id, "", false)
			if err != nil {
				t.Fatalf("second stop: %v", err)
			}
			st = tc.waitJob(id, "stopped", state(wire.JobStopped))
			if st.State != wire.JobStopped || st.Savepoint != sp {
				t.Fatalf("after the second stop: %s savepoint %q (%s), want stopped with %s", st.State, st.Savepoint, st.Reason, sp)
			}
		})
	}
}

// stopFailJob writes a job file: a slow generator, hash-partitioned into the
// operator "op" (uppercase.wasm, replaced by nativeExecutor), into a discard
// sink, at parallelism 2; checkpoints only on request (the interval is an
// hour), so the stop's savepoint is the only checkpoint an armed failNotify
// hears of.
func stopFailJob(t *testing.T) string {
	wasm := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	dir := t.TempDir()
	job := fmt.Sprintf(`name: stopfail
parallelism: 2
checkpoint: {interval: 1h, dir: chk}
restart: {strategy: fixed-delay, attempts: 3, delay: 100ms}
operators:
  - uid: gen
    source: {type: generator, count: 10000000, rate: 2000, keys: 100}
  - uid: op
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: discard}
    inputs: [{from: op}]
`, wasm)
	path := filepath.Join(dir, "stopfail.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// addHostExec starts host id with any executor.
func (tc *testCluster) addHostExec(id string, slots int, exec agent.Executor) *agent.Host {
	t := tc.t
	h, err := agent.StartHost(connect(t, tc.srv.URL()), agent.HostOptions{
		ID: id, Slots: slots, DataDir: t.TempDir(), HeartbeatInterval: cmp.Or(tc.hb, hbInterval),
		Executor: exec, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	tc.hosts[id] = h
	return h
}
