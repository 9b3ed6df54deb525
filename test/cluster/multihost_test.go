package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// startProcesses starts a `streamd controller` process connected to ctlURL
// and one `streamd host` process h1, h2, ... per entry of hostURLs (each
// connected to that URL) with slots slots, and a client on clientURL. The
// URLs may name different servers of one NATS cluster.
func startProcesses(t *testing.T, clientURL, ctlURL string, hostURLs []string, slots int) *processCluster {
	return startProcessesLost(t, clientURL, ctlURL, hostURLs, slots, procLostAfter)
}

// startProcessesLost is startProcesses with the controller's --lost-after.
func startProcessesLost(t *testing.T, clientURL, ctlURL string, hostURLs []string, slots int, lostAfter string) *processCluster {
	t.Helper()
	pc := &processCluster{testCluster: &testCluster{t: t}, url: clientURL, hosts: map[string]*proc{}}
	hb := "--heartbeat-interval=100ms"
	pc.controller = startProc(t, "controller", "controller", "--nats", ctlURL, hb, "--lost-after="+lostAfter)
	for i, u := range hostURLs {
		id := fmt.Sprintf("h%d", i+1)
		pc.hosts[id] = startProc(t, id, "host", "--nats", u, hb, "--host-id", id, "--slots", fmt.Sprint(slots), "--data-dir", t.TempDir())
	}
	var err error
	pc.client, err = client.NewClient(connect(t, clientURL))
	if err != nil {
		t.Fatal(err)
	}
	pc.waitHosts(len(hostURLs))
	return pc
}

// cliStatus is `streamd status --json id`.
func cliStatus(t *testing.T, url, id string) *wire.JobStatus {
	t.Helper()
	out, errs, code := streamd(t, nil, "status", "--json", "--nats", url, id)
	if code != 0 {
		t.Fatalf("streamd status --json %s: exit %d: %s", id, code, errs)
	}
	var st wire.JobStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("streamd status --json: %v\n%s", err, out)
	}
	return &st
}

// checkSpread checks that the status places the job's subtasks on exactly
// the hosts want, one slot each: subtask i of every operator with
// parallelism > i on the same host, a different one per i.
func checkSpread(t *testing.T, st *wire.JobStatus, want int) {
	t.Helper()
	hosts := slices.Clone(st.Hosts)
	slices.Sort(hosts)
	if len(slices.Compact(hosts)) != want {
		t.Fatalf("job on hosts %v, want %d different hosts", st.Hosts, want)
	}
	bySlot := map[int]string{}
	used := map[string]bool{}
	for _, op := range st.Operators {
		for _, s := range op.Subtasks {
			if s.Host == "" {
				t.Fatalf("operator %s subtask %d has no host in the status", op.UID, s.Index)
			}
			if h, ok := bySlot[s.Index]; ok && h != s.Host {
				t.Errorf("operator %s subtask %d on %s, but other subtasks %d on %s", op.UID, s.Index, s.Host, s.Index, h)
			}
			bySlot[s.Index] = s.Host
			used[s.Host] = true
		}
	}
	if len(used) != want {
		t.Errorf("subtasks run on %d hosts (%v), want %d", len(used), used, want)
	}
}

// TestThreeHostProcessesSameAsRun deploys a job of parallelism 3 onto three
// `streamd host` processes of one slot each (so it must be spread over all
// three) with the streamd binary, and compares its output with `streamd run`
// of the same job file. Nothing fails here: this is the plain spread path.
func TestThreeHostProcessesSameAsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs streamd processes")
	}
	threeHostsSameAsRun(t, newProcessCluster(t, 3, 1))
}

// threeHostsSameAsRun deploys a job of parallelism 3 onto pc's three hosts
// of one slot each.
func threeHostsSameAsRun(t *testing.T, pc *processCluster) {
	path := spreadJob(t, 30000, 15000, 3, "checkpoint: {interval: 100ms, dir: chk}\n")
	out, errs, code := streamd(t, nil, "deploy", "--nats", pc.url, path)
	if code != 0 {
		t.Fatalf("streamd deploy: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	// The placement, from `streamd status --json` while the job runs.
	for {
		st := cliStatus(t, pc.url, id)
		if st.State == wire.JobRunning {
			checkSpread(t, st, 3)
			break
		}
		if wire.TerminalJobState(st.State) {
			t.Fatalf("job %s before it was seen running (%s): make it longer", st.State, st.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pc.waitJob(id, "finished", state(wire.JobFinished))
	st := cliStatus(t, pc.url, id)
	if st.State != wire.JobFinished || st.Attempt != 0 || len(st.Attempts) != 1 {
		t.Fatalf("streamd status: %s attempt %d (%s), want finished in attempt 0", st.State, st.Attempt, st.Reason)
	}
	if hs := st.Attempts[0].Hosts; len(hs) != 3 {
		t.Errorf("attempt 0 ran on %v, want 3 hosts", hs)
	}
	checkSpread(t, st, 3) // a finished job's status still says where each subtask ran
	if st.Operators[1].RecordsIn != 30000 {
		t.Errorf("upper read %d records over three hosts, want 30000", st.Operators[1].RecordsIn)
	}
	sameLines(t, outputLines(t, filepath.Join(filepath.Dir(path), "out")), runLocally(t, path))
}

// waitJobLoose polls the status like waitJob, but takes a failed request
// (NATS down) as "not yet".
func (tc *testCluster) waitJobLoose(id, what string, d time.Duration, cond func(*wire.JobStatus) bool) *wire.JobStatus {
	tc.t.Helper()
	deadline := time.Now().Add(d)
	var last *wire.JobStatus
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := tc.client.Status(ctx, id)
		cancel()
		if err == nil {
			last = st
			if cond(st) {
				return st
			}
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	tc.t.Fatalf("job %s: %s: not reached in %s; last status: %+v (last error %v)", id, what, d, last, lastErr)
	return nil
}

// TestNATSRestartFailsOverExactlyOnce restarts the NATS server (same port,
// same JetStream store) in the middle of a checkpointing job spread over
// three host processes while the controller and hosts keep running: they
// reconnect, the hosts heartbeat again, the attempt that lost messages
// fails over and restores from the latest checkpoint, and the committed
// output holds every record exactly once (as `streamd run`).
func TestNATSRestartFailsOverExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs streamd processes")
	}
	for _, storage := range []string{"dir", "jetstream"} {
		t.Run(storage, func(t *testing.T) { natsRestart(t, storage) })
	}
}

func natsRestart(t *testing.T, storage string) {
	port, store := freePort(t), t.TempDir()
	start := func() *natsutil.Server {
		srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: port, NoLog: true, StoreDir: store})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	srv := start()
	t.Cleanup(func() { srv.Shutdown() })
	url := srv.URL()
	// Hosts are lost after 400ms of silence: a host declared lost by
	// mistake under load costs a failover this test expects anyway.
	pc := startProcessesLost(t, url, url, []string{url, url, url}, 1, "4")
	const n = 7000
	path := spreadJob(t, n, 2000, 3, "checkpoint: {interval: 200ms, dir: chk, storage: "+storage+"}\n")
	id := deploy(t, pc.testCluster, path, jobfile.Options{})
	st := pc.waitJob(id, "running with a checkpoint", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) ||
			(st.State == wire.JobRunning && len(st.Checkpoints) > 0 && st.Operators[2].RecordsIn > n/4)
	})
	if st.State != wire.JobRunning || len(st.Hosts) != 3 {
		t.Fatalf("job %s on %v (%s): want running on 3 hosts", st.State, st.Hosts, st.Reason)
	}
	srv.Shutdown()
	down := time.Now()
	// NATS stays down until the controller noticed: it declared a host
	// lost (it checks heartbeats on its own clock, NATS or not), or its
	// lease, unrenewable without NATS, ran out first and it stood down (a
	// leader that cannot reach the bucket stops acting before a standby
	// could take over; it leads again once NATS is back).
	pc.controller.waitAnyOutput(t, 60*time.Second, "host lost", "controller deposed")
	srv = start()
	t.Logf("NATS server down for %s", time.Since(down).Round(time.Millisecond))
	st = pc.waitJobLoose(id, "a later attempt", 60*time.Second, func(st *wire.JobStatus) bool {
		return st.Attempt >= 1 || wire.TerminalJobState(st.State)
	})
	st = pc.waitJobLoose(id, "finished", 90*time.Second, state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s (attempts %+v)", st.State, st.Reason, st.Attempts)
	}
	if st.Attempt < 1 {
		t.Errorf("the job finished in attempt 0 although NATS restarted under it")
	}
	t.Logf("finished in attempt %d on %v; attempts: %+v", st.Attempt, st.Hosts, st.Attempts)
	hs, err := pc.client.Hosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.State != "alive" {
			t.Errorf("host %s is %s after the restart, want alive", h.ID, h.State)
		}
	}
	sameLines(t, outputLines(t, filepath.Join(filepath.Dir(path), "out")), runLocally(t, path))
}

// windowJob writes the window-count example as a job over a rate-limited
// generator of n lines "u<k>,<n>" (7 keys, event time n ms) into a fresh
// directory, with windows of size 10^9 ms: every window fires only on the
// MAX watermark, at the end of the input or on a drain.
func windowJob(t *testing.T, n, rate int) string {
	keyby := testwasm.Path(t, "examples/wasm/window-count/keyby.wasm")
	windows := testwasm.Path(t, "examples/wasm/window-count/window-count.wasm")
	dir := t.TempDir()
	job := fmt.Sprintf(`name: window-drain
parallelism: 2
checkpoint: {interval: 200ms, dir: chk}
operators:
  - uid: lines
    parallelism: 1
    source: {type: generator, count: %d, rate: %d, key: "", value: "u{k},{n}", keys: 7}
  - uid: keyby
    parallelism: 1
    wasm: %s
    inputs: [{from: lines, partition: forward}]
  - uid: windows
    wasm: %s
    config: {size_ms: 1000000000}
    inputs: [{from: keyby, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: windows, partition: forward}]
`, n, rate, keyby, windows)
	path := filepath.Join(dir, "window.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// windowCounts parses lines "key,start,end,count" into count per key.
func windowCounts(t *testing.T, lines []string) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) != 4 || f[1] != "0" || f[2] != "1000000000" {
			t.Fatalf("window line %q: want key,0,1000000000,count", l)
		}
		c, err := strconv.Atoi(f[3])
		if err != nil {
			t.Fatalf("window line %q: %v", l, err)
		}
		if _, dup := m[f[0]]; dup {
			t.Fatalf("window of key %s emitted twice", f[0])
		}
		m[f[0]] = c
	}
	return m
}

// TestStopDrainAcrossHosts stops the window-count job spread over two host
// processes with `streamd stop JOB --drain` and with `streamd stop JOB`
// (FLIP-147). With drain the sources end, the MAX watermark fires every
// window and the counts of the records read so far come out before the
// savepoint; without, nothing comes out, the windows stay in the savepoint's
// state, and `streamd run --from` the savepoint gives the counts of an
// uninterrupted run.
func TestStopDrainAcrossHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs streamd processes")
	}
	const n, rate, keys = 8000, 2000, 7
	for _, drain := range []bool{true, false} {
		t.Run(map[bool]string{true: "drain", false: "no-drain"}[drain], func(t *testing.T) {
			pc := newProcessCluster(t, 2, 1)
			path := windowJob(t, n, rate)
			out, errs, code := streamd(t, nil, "deploy", "--nats", pc.url, path)
			if code != 0 {
				t.Fatalf("streamd deploy: exit %d: %s", code, errs)
			}
			id := strings.TrimSpace(out)
			pc.waitJob(id, "running with a checkpoint", func(st *wire.JobStatus) bool {
				return wire.TerminalJobState(st.State) ||
					(st.State == wire.JobRunning && len(st.Checkpoints) > 0 && st.Operators[2].RecordsIn > 1000)
			})
			checkSpread(t, cliStatus(t, pc.url, id), 2)
			args := []string{"stop", "--nats", pc.url, id}
			if drain {
				args = append(args, "--drain")
			}
			out, errs, code = streamd(t, nil, args...)
			if code != 0 {
				t.Fatalf("streamd %s: exit %d: %s", strings.Join(args, " "), code, errs)
			}
			sp := strings.TrimSpace(out)
			st := cliStatus(t, pc.url, id)
			if st.State != wire.JobStopped || st.Savepoint != sp {
				t.Fatalf("after stop: %s savepoint %q (%s), want stopped with %s", st.State, st.Savepoint, st.Reason, sp)
			}
			if _, err := os.Stat(filepath.Join(sp, "_metadata")); err != nil {
				t.Fatalf("savepoint: %v", err)
			}
			outDir := filepath.Join(filepath.Dir(path), "out")
			got := windowCounts(t, outputLines(t, outDir))
			if !drain {
				if len(got) != 0 {
					t.Fatalf("stop without drain emitted windows: %v", got)
				}
				if out, errs, code := streamd(t, nil, "run", "--progress", "off", path, "--from", sp); code != 0 {
					t.Fatalf("streamd run --from %s: exit %d\n%s\n%s", sp, code, out, errs)
				}
				sameLines(t, outputLines(t, outDir), runLocally(t, path))
				return
			}
			// Drained: one window per key with the counts of the first m
			// records, m the records the generator made before it stopped.
			m := 0
			for _, c := range got {
				m += c
			}
			if m == 0 || m >= n {
				t.Fatalf("drained windows count %d records, want some but fewer than %d: %v", m, n, got)
			}
			for k := 0; k < keys; k++ {
				want := (m - k + keys - 1) / keys
				if got[fmt.Sprintf("u%d", k)] != want {
					t.Errorf("key u%d: count %d, want %d (of the first %d records)", k, got[fmt.Sprintf("u%d", k)], want, m)
				}
			}
			if int64(m) != st.Operators[0].RecordsOut {
				t.Errorf("windows count %d records, the generator sent %d", m, st.Operators[0].RecordsOut)
			}
			t.Logf("drained after %d of %d records: %v", m, n, got)
		})
	}
}
