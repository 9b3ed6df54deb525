package cluster_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// lockedBuffer is a process's output, read while the process writes it.
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

// loggedProc is a streamd process whose output the test reads.
type loggedProc struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

// startLogged runs `streamd args...` until it is killed or the test ends
// (SIGINT, then kill).
func startLogged(t *testing.T, name string, args ...string) *loggedProc {
	t.Helper()
	cmd := exec.Command(streamdBin(t), args...)
	cmd.Dir = t.TempDir()
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &loggedProc{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return p
}

// keyGroupError is how a keyed record that reached the wrong subtask shows
// (host: "key ... is in key group N, outside this subtask's key groups
// [a,b]"; a restore of misplaced state says "restored key group").
const keyGroupError = "outside this subtask's key groups"

// TestKeyedJobSurvivesRepeatedFailovers runs a keyed job of parallelism 12
// (generator -hash-> wordcount's count, which keeps per-key counts in keyed
// state and emits them at the end, -> file sink) over three `streamd host`
// processes of six slots, and kills a different host with SIGKILL three
// times, each time restarting it once the job has failed over to the other
// two (6+6 slots). Every attempt must route every key to the subtask that
// owns its key group (a record of another subtask's key group fails the
// count operator with a key-group error), and the committed output must be
// exactly that of `streamd run`: every key's count, once.
//
// The pebble variant keeps the keyed state in pebble with incremental
// checkpoints in the JetStream object store: each failover restores the
// shared files on another host.
func TestKeyedJobSurvivesRepeatedFailovers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs streamd processes")
	}
	t.Run("memory", func(t *testing.T) { testKeyedFailovers(t, "") })
	t.Run("pebble-jetstream", func(t *testing.T) {
		testKeyedFailovers(t, "state: {backend: pebble, cache_mib: 16}\ncheckpoint: {interval: 200ms, storage: jetstream, bucket: KEYED}\n")
	})
}

func testKeyedFailovers(t *testing.T, section string) {
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	url := srv.URL()
	hb := "--heartbeat-interval=100ms"
	procs := map[string][]*loggedProc{} // every process of each name, the killed ones too
	procs["controller"] = append(procs["controller"], startLogged(t, "controller", "controller", "--nats", url, hb, "--lost-after="+procLostAfter))
	startHost := func(id string) {
		procs[id] = append(procs[id], startLogged(t, fmt.Sprintf("%s (run %d)", id, len(procs[id])+1),
			"host", "--nats", url, hb, "--host-id", id, "--slots", "6", "--data-dir", t.TempDir()))
	}
	hosts := []string{"h1", "h2", "h3"}
	for _, id := range hosts {
		startHost(id)
	}
	tc := &testCluster{t: t, srv: srv}
	tc.client, err = client.NewClient(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	tc.waitHosts(3)

	const n, rate, failovers = 75000, 2500, 3
	path := keyedJob(t, n, rate, section)
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running with a checkpoint", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && len(st.Checkpoints) > 0)
	})
	if st.State != wire.JobRunning || len(st.Hosts) != 3 {
		t.Fatalf("job %s on %v (%s): want running on 3 hosts", st.State, st.Hosts, st.Reason)
	}
	lastCheckpoint := func(st *wire.JobStatus) int64 {
		if len(st.Checkpoints) == 0 {
			return 0
		}
		return st.Checkpoints[len(st.Checkpoints)-1].ID
	}
	for i := 0; i < failovers; i++ {
		victim := hosts[i%len(hosts)]
		attempt, chk := st.Attempt, lastCheckpoint(st)
		victimProc := procs[victim][len(procs[victim])-1]
		if err := victimProc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-victimProc.done
		killed := time.Now()
		// The job fails over to the two other hosts (6 slots each), which
		// must first have ended the failed attempt.
		st = tc.waitJob(id, "running on the other hosts", func(st *wire.JobStatus) bool {
			return wire.TerminalJobState(st.State) || (st.Attempt > attempt && st.State == wire.JobRunning)
		})
		if st.State != wire.JobRunning {
			t.Fatalf("failover %d (killed %s): job %s: %s", i+1, victim, st.State, st.Reason)
		}
		for _, h := range st.Hosts {
			if h == victim {
				t.Fatalf("failover %d: attempt %d runs on the killed host %s: %v", i+1, st.Attempt, victim, st.Hosts)
			}
		}
		t.Logf("failover %d: killed %s; attempt %d running on %v after %s", i+1, victim, st.Attempt, st.Hosts, time.Since(killed).Round(time.Millisecond))
		startHost(victim)
		tc.waitHosts(3)
		// A checkpoint of the new attempt completes before the next kill,
		// so each failover restores from a later checkpoint.
		st = tc.waitJob(id, "a checkpoint after the failover", func(st *wire.JobStatus) bool {
			return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && lastCheckpoint(st) > chk && st.Attempt > attempt)
		})
		if st.State != wire.JobRunning {
			if st.State == wire.JobFinished && i < failovers-1 {
				t.Fatalf("the job finished after %d of %d failovers: make it longer", i+1, failovers)
			}
			t.Fatalf("after failover %d: job %s: %s", i+1, st.State, st.Reason)
		}
	}
	st = tc.waitJob(id, "finished", state(wire.JobFinished))
	t.Logf("finished in attempt %d on %v", st.Attempt, st.Hosts)
	for _, a := range st.Attempts {
		t.Logf("attempt %d on %v: %s %s", a.Attempt, a.Hosts, a.State, a.Reason)
		if strings.Contains(a.Reason, keyGroupError) {
			t.Errorf("attempt %d failed with a key-group error: %s", a.Attempt, a.Reason)
		}
		if strings.Contains(a.Reason, "assign to host") {
			t.Errorf("attempt %d failed on a refused assignment (slots not free yet?): %s", a.Attempt, a.Reason)
		}
	}
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	if st.Attempt < failovers {
		t.Errorf("finished in attempt %d after %d host kills", st.Attempt, failovers)
	}
	for name, ps := range procs {
		for run, p := range ps {
			if out := p.out.String(); strings.Contains(out, keyGroupError) {
				i := strings.Index(out, keyGroupError)
				t.Errorf("%s (run %d) logged a key-group error: ...%s...", name, run+1, out[max(0, i-300):min(len(out), i+100)])
			}
		}
	}
	got := outputLines(t, filepath.Join(filepath.Dir(path), "out"))
	sameLines(t, got, runLocally(t, keyedJob(t, n, rate, "")))
	t.Logf("%d keys counted exactly once", len(got))
}

// keyedJob writes a job file: a generator of n records (keys key-0 ...
// key-499) at rate per second, hash-partitioned into wordcount's count
// module, into a file sink, all at parallelism 12, checkpointing every
// 200ms.
//
// section, when set, replaces the checkpoint section (and may add others).
func keyedJob(t *testing.T, n, rate int, section string) string {
	wasm := testwasm.Path(t, "examples/wasm/wordcount/count.wasm")
	dir := t.TempDir()
	if section == "" {
		section = "checkpoint: {interval: 200ms, dir: chk}\n"
	}
	job := fmt.Sprintf(`name: keyed
parallelism: 12
%soperators:
  - uid: gen
    source: {type: generator, count: %d, rate: %d, keys: 500}
  - uid: count
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: count}]
`, section, n, rate, wasm)
	path := filepath.Join(dir, "keyed.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
