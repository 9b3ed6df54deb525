// Package cluster_test runs the multi-host control plane for real: an
// embedded NATS server with JetStream on a random port, a controller and host
// agents in this process (each on its own NATS connection), real wasm
// modules, and the streamd binary (cli_test.go).
package cluster_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// Heartbeats are frequent so that a host a test kills is noticed soon, but a
// host is declared lost only after two seconds of silence: on a loaded machine
// (CI, two CPU-bound processes beside the suite) a live host's heartbeat can
// be late by a few hundred milliseconds, and a live host declared lost fails
// a test that does not expect it.
const (
	hbInterval = 50 * time.Millisecond
	lostAfter  = 40
	// procLostAfter is the controller's --lost-after in the tests of
	// streamd processes (heartbeats every 100ms): two seconds.
	procLostAfter = "20"
)

type testCluster struct {
	t      testing.TB
	srv    *natsutil.Server
	client *client.Client
	engine *host.Engine
	hosts  map[string]*agent.Host
	hb     time.Duration // heartbeat interval of the controller and the hosts
	// beforeFatal, if set, runs when waitJob's status request fails,
	// before the test does: the chaos test has its controllers dump their
	// goroutines then, while the request is still unanswered.
	beforeFatal func()
}

func logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, url)
}

// newCluster starts a NATS server, a controller and one host per slot count.
func newCluster(t testing.TB, slots ...int) *testCluster {
	t.Helper()
	return newClusterHB(t, hbInterval, slots...)
}

// newClusterHB is newCluster with heartbeats (of the hosts, and the
// controller's lease renewals) every hb: a test whose process stalls for
// longer than the short default (a guest call on tens of MiB keeps the Go
// runtime from stopping the world) would otherwise see hosts declared lost
// and the leader step down.
func newClusterHB(t testing.TB, hb time.Duration, slots ...int) *testCluster {
	t.Helper()
	return newClusterOpts(t, cluster.ControllerOptions{HeartbeatInterval: hb}, slots...)
}

// newClusterOpts is newCluster with the controller's options opts (its
// heartbeat interval is the hosts' too; LostAfter and Logger as
// startController's when not set).
func newClusterOpts(t testing.TB, opts cluster.ControllerOptions, slots ...int) *testCluster {
	t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	tc := startControllerOpts(t, srv, connect(t, srv.URL()), opts)
	for i, n := range slots {
		tc.addHost(fmt.Sprintf("h%d", i+1), n)
	}
	tc.client, err = client.NewClient(connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	tc.waitHosts(len(slots))
	return tc
}

// startController starts a controller on nc and an engine for the hosts.
func startController(t testing.TB, srv *natsutil.Server, nc *nats.Conn) *testCluster {
	return startControllerOpts(t, srv, nc, cluster.ControllerOptions{})
}

// startControllerOpts is startController with opts: a heartbeat interval
// (default hbInterval), LostAfter (default lostAfter), a Logger (default
// logger(t)).
func startControllerOpts(t testing.TB, srv *natsutil.Server, nc *nats.Conn, opts cluster.ControllerOptions) *testCluster {
	t.Helper()
	opts.HeartbeatInterval = cmp.Or(opts.HeartbeatInterval, hbInterval)
	opts.LostAfter = cmp.Or(opts.LostAfter, lostAfter)
	if opts.Logger == nil {
		opts.Logger = logger(t)
	}
	tc := &testCluster{t: t, srv: srv, hosts: map[string]*agent.Host{}, hb: opts.HeartbeatInterval}
	var err error
	// As streamd controller does: a controller deposed under load (a
	// renewal too late) stands by again and can lead again.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- cluster.RunController(ctx, nc, opts)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	tc.engine, err = host.NewEngine(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.engine.Close(context.Background()) })
	return tc
}

func (tc *testCluster) addHost(id string, slots int) *agent.Host {
	return tc.addHostWith(id, slots, &agent.LocalExecutor{Engine: tc.engine})
}

// addHostWith starts host id with its own executor.
func (tc *testCluster) addHostWith(id string, slots int, exec *agent.LocalExecutor) *agent.Host {
	return tc.addHostExec(id, slots, exec)
}

func (tc *testCluster) waitHosts(n int) {
	tc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		hs, err := tc.client.Hosts(context.Background())
		alive := 0
		for _, h := range hs {
			if h.State == "alive" {
				alive++
			}
		}
		if err == nil && alive >= n {
			return
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("%d hosts registered after 60s, want %d (err %v)", alive, n, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitJob polls the job's status until cond holds.
func (tc *testCluster) waitJob(id string, what string, cond func(*wire.JobStatus) bool) *wire.JobStatus {
	tc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last *wire.JobStatus
	for time.Now().Before(deadline) {
		st, err := tc.client.Status(context.Background(), id)
		if err != nil {
			if tc.beforeFatal != nil {
				tc.beforeFatal()
			}
			tc.t.Fatal(err)
		}
		last = st
		if cond(st) {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
	tc.t.Fatalf("job %s: %s: not reached in 60s; last status: %+v", id, what, last)
	return nil
}

func state(s string) func(*wire.JobStatus) bool {
	return func(st *wire.JobStatus) bool { return st.State == s || wire.TerminalJobState(st.State) }
}

// uppercaseJob copies the uppercase example into a fresh directory (so its
// out/ lands there) and returns the job file's path.
func uppercaseJob(t *testing.T) string {
	wasm := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	src := filepath.Dir(wasm)
	dir := t.TempDir()
	for _, f := range []string{"uppercase.yaml", "input.txt", "uppercase.wasm"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "uppercase.yaml")
}

func expected(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")), "expected.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func deploy(t testing.TB, tc *testCluster, path string, opts jobfile.Options) string {
	t.Helper()
	job, err := jobfile.LoadJob(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	id, err := tc.client.Deploy(context.Background(), job, path)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestDeployRunsOnAHostAndFinishes(t *testing.T) {
	tc := newCluster(t, 2)
	path := uppercaseJob(t)
	id := deploy(t, tc, path, jobfile.Options{})
	if !strings.HasPrefix(id, "uppercase-") {
		t.Errorf("job id %q: want it to start with the job name", id)
	}
	st := tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job ended %s: %s", st.State, st.Reason)
	}
	if got, want := readFile(t, filepath.Join(filepath.Dir(path), "out", "part-"+id+"-0")), expected(t); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
	if len(st.Hosts) != 1 || st.Hosts[0] != "h1" || st.Attempt != 0 {
		t.Errorf("hosts %v attempt %d: want [h1], 0", st.Hosts, st.Attempt)
	}
	for _, op := range st.Operators {
		for _, s := range op.Subtasks {
			if s.State != wire.SubtaskFinished || s.Host != "h1" {
				t.Errorf("operator %s subtask %d: %s on %q, want finished on h1", op.UID, s.Index, s.State, s.Host)
			}
		}
	}
	if st.Operators[1].UID != "upper" || st.Operators[1].RecordsIn != 4 || st.Operators[1].RecordsOut != 4 {
		t.Errorf("upper stats: %+v, want 4 in and out", st.Operators[1])
	}
	jobs, err := tc.client.List(context.Background(), false)
	if err != nil || len(jobs) != 1 || jobs[0].ID != id {
		t.Fatalf("list: %v %v", jobs, err)
	}
	// The artifacts came through the object store: the host's cache has the module.
	if _, err := tc.client.Cancel(context.Background(), id); err == nil || !strings.Contains(err.Error(), "already finished") {
		t.Errorf("cancel of a finished job: %v", err)
	}
	if _, err := tc.client.Status(context.Background(), "nope"); err == nil || !strings.Contains(err.Error(), `no job "nope"`) {
		t.Errorf("status of an unknown job: %v", err)
	}
}

// slowJob writes a job file: a generator of n records at rate per second
// through the uppercase module into dir/out.
func slowJob(t *testing.T, n, rate, parallelism int) string {
	wasm := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	dir := t.TempDir()
	job := fmt.Sprintf(`name: slow
parallelism: %d
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: %d}
  - uid: upper
    wasm: %s
    inputs: [{from: gen}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: upper}]
`, parallelism, n, rate, wasm)
	path := filepath.Join(dir, "slow.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLostHostFailsOver(t *testing.T) {
	tc := newCluster(t, 1, 1)
	const n = 1500
	path := slowJob(t, n, 1000, 1)
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running", func(st *wire.JobStatus) bool {
		return st.State == wire.JobRunning && st.Operators[0].RecordsOut > 0
	})
	first := st.Hosts[0]
	other := map[string]string{"h1": "h2", "h2": "h1"}[first]
	lostAt := time.Now()
	tc.hosts[first].Close() // stops heartbeats and its runs, reports nothing: a crash
	st = tc.waitJob(id, "restarted on the other host", func(st *wire.JobStatus) bool { return st.Attempt == 1 })
	detect := time.Since(lostAt)
	if st.State != wire.JobRestarting && st.State != wire.JobRunning {
		t.Fatalf("after the host was lost: state %s (%s), want restarting or running", st.State, st.Reason)
	}
	if !strings.Contains(st.Attempts[0].Reason, "host "+first+" lost") {
		t.Errorf("attempt 0 reason %q: want it to say host %s was lost", st.Attempts[0].Reason, first)
	}
	t.Logf("lost host detected and job restarted after %s (heartbeat %s, lost after %d)", detect.Round(time.Millisecond), hbInterval, lostAfter)
	st = tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished || len(st.Hosts) != 1 || st.Hosts[0] != other {
		t.Fatalf("job %s on %v (%s), want finished on %s", st.State, st.Hosts, st.Reason, other)
	}
	out := readFile(t, filepath.Join(filepath.Dir(path), "out", "part-"+id+"-0"))
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != n || lines[0] != "VALUE-0" || lines[n-1] != fmt.Sprintf("VALUE-%d", n-1) {
		t.Fatalf("output: %d lines, first %q last %q; want %d from VALUE-0", len(lines), lines[0], lines[len(lines)-1], n)
	}
	hs, err := tc.client.Hosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if want := map[bool]string{true: "lost", false: "alive"}[h.ID == first]; h.State != want {
			t.Errorf("host %s: %s, want %s", h.ID, h.State, want)
		}
	}
}

func TestJobWaitsForSlotsThenRuns(t *testing.T) {
	tc := newCluster(t, 1)
	long := deploy(t, tc, slowJob(t, 100000, 1000, 1), jobfile.Options{})
	tc.waitJob(long, "running", state(wire.JobRunning))
	short := deploy(t, tc, uppercaseJob(t), jobfile.Options{})
	st := tc.waitJob(short, "waiting", func(st *wire.JobStatus) bool { return strings.Contains(st.Reason, "waiting for slots") })
	if st.State != wire.JobCreated {
		t.Fatalf("second job: %s, want created while it waits", st.State)
	}
	sp, err := tc.client.Savepoint(context.Background(), long, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "needs checkpointing") {
		t.Errorf("savepoint of a job without checkpointing: %q, %v; want a needs checkpointing error", sp, err)
	}
	if _, err := tc.client.Stop(context.Background(), long, "", true); err == nil || !strings.Contains(err.Error(), "needs checkpointing") {
		t.Errorf("stop of a job without checkpointing: %v; want a needs checkpointing error", err)
	}
	if st, _ := tc.client.Status(context.Background(), long); st.State != wire.JobRunning {
		t.Errorf("after a refused stop the job is %s, want running", st.State)
	}
	cst, err := tc.client.Cancel(context.Background(), long)
	if err != nil || cst.State != wire.JobCanceled {
		t.Fatalf("cancel: %v %v", cst, err)
	}
	if len(tc.hosts["h1"].Running()) != 0 && tc.hosts["h1"].Running()[0].JobID == long {
		t.Errorf("host still runs the canceled job: %v", tc.hosts["h1"].Running())
	}
	st = tc.waitJob(short, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("second job after the first was canceled: %s (%s)", st.State, st.Reason)
	}
}

func TestStopWithSavepoint(t *testing.T) {
	tc := newCluster(t, 1)
	path := slowJob(t, 1000000, 2000, 1)
	dir := filepath.Dir(path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, []byte("checkpoint: {interval: 200ms, dir: chk}\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	id := deploy(t, tc, path, jobfile.Options{})
	tc.waitJob(id, "running", func(st *wire.JobStatus) bool {
		return st.State == wire.JobRunning && st.Operators[0].RecordsOut > 0
	})
	// A savepoint while the job runs on, copied into another directory.
	spDir := t.TempDir()
	sp, err := tc.client.Savepoint(context.Background(), id, spDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sp, spDir) {
		t.Errorf("savepoint %q: want it under %s", sp, spDir)
	}
	if _, err := os.Stat(filepath.Join(sp, "_metadata")); err != nil {
		t.Errorf("savepoint has no metadata: %v", err)
	}
	if st, _ := tc.client.Status(context.Background(), id); st.State != wire.JobRunning {
		t.Errorf("after a savepoint the job is %s, want running", st.State)
	}
	// Stop with a savepoint in the job's checkpoint directory.
	sp, err = tc.client.Stop(context.Background(), id, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sp, filepath.Join(dir, "chk")) {
		t.Errorf("savepoint %q: want it under %s", sp, filepath.Join(dir, "chk"))
	}
	if _, err := os.Stat(filepath.Join(sp, "_metadata")); err != nil {
		t.Errorf("savepoint has no metadata: %v", err)
	}
	st := tc.waitJob(id, "stopped", state(wire.JobStopped))
	if st.State != wire.JobStopped || st.Savepoint != sp {
		t.Fatalf("after stop: state %s savepoint %q (%s); want stopped, %s", st.State, st.Savepoint, st.Reason, sp)
	}
}
