package cluster_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
)

// proc is a streamd process of a test.
type proc struct {
	cmd *exec.Cmd
	out *lockedBuffer // stdout and stderr, read while the process runs
}

// waitOutput waits until the process has printed want, or fails the test
// after d.
func (p *proc) waitOutput(t testing.TB, want string, d time.Duration) {
	t.Helper()
	p.waitAnyOutput(t, d, want)
}

// waitAnyOutput waits until the process has printed one of wants, or
// fails the test after d.
func (p *proc) waitAnyOutput(t testing.TB, d time.Duration, wants ...string) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		out := p.out.String()
		for _, w := range wants {
			if strings.Contains(out, w) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process printed none of %q within %s", wants, d)
		}
	}
}

// startProc runs `streamd args...` until the test ends (SIGINT, then kill).
func startProc(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(streamdBin(t), args...)
	cmd.Dir = t.TempDir()
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: out}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return p
}

// processCluster is an embedded NATS server in the test, and a `streamd
// controller` and `streamd host` processes on it.
type processCluster struct {
	*testCluster
	url        string
	hosts      map[string]*proc
	controller *proc // set by startProcesses
}

func newProcessCluster(t *testing.T, hosts, slots int, hostArgs ...string) *processCluster {
	t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	pc := &processCluster{testCluster: &testCluster{t: t, srv: srv}, url: srv.URL(), hosts: map[string]*proc{}}
	hb := "--heartbeat-interval=100ms"
	startProc(t, "controller", "controller", "--nats", pc.url, hb, "--lost-after="+procLostAfter)
	for i := 1; i <= hosts; i++ {
		id := fmt.Sprintf("h%d", i)
		args := append([]string{"host", "--nats", pc.url, hb, "--host-id", id, "--slots", fmt.Sprint(slots), "--data-dir", t.TempDir()}, hostArgs...)
		pc.hosts[id] = startProc(t, id, args...)
	}
	pc.client, err = client.NewClient(connect(t, pc.url))
	if err != nil {
		t.Fatal(err)
	}
	pc.waitHosts(hosts)
	return pc
}

// TestKillHostFailsOverExactlyOnce spreads a checkpointing job over three
// host processes, kills one with SIGKILL mid-job and checks that the job
// fails over to the two others and its output is exactly that of
// `streamd run`: nothing lost, nothing twice. With storage jetstream the
// checkpoints live in the NATS object store, so the hosts (each with its own
// data directory) share no checkpoint directory.
func TestKillHostFailsOverExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs streamd processes")
	}
	for _, storage := range []string{"dir", "jetstream"} {
		t.Run(storage, func(t *testing.T) { killHostFailsOver(t, storage) })
	}
}

func killHostFailsOver(t *testing.T, storage string) {
	killHostFailsOverOn(t, newProcessCluster(t, 3, 2), storage)
}

// killHostFailsOverOn runs the scenario on the processes of pc (three hosts
// of two slots).
func killHostFailsOverOn(t *testing.T, pc *processCluster, storage string) {
	const n = 8000
	path := spreadJob(t, n, 2000, 4, "checkpoint: {interval: 200ms, dir: chk, storage: "+storage+"}\nrestart: {strategy: fixed-delay, attempts: 3, delay: 100ms}\n")
	id := deploy(t, pc.testCluster, path, jobfile.Options{})
	st := pc.waitJob(id, "running with output", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[2].RecordsIn > n/4)
	})
	if st.State != wire.JobRunning || len(st.Hosts) != 3 {
		t.Fatalf("job %s on %v (%s): want running on 3 hosts", st.State, st.Hosts, st.Reason)
	}
	// Some checkpoint has committed output before the kill.
	chk := len(st.Checkpoints)
	victim := st.Hosts[1]
	if err := pc.hosts[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	st = pc.waitJob(id, "failed over", func(st *wire.JobStatus) bool { return st.Attempt >= 1 || wire.TerminalJobState(st.State) })
	t.Logf("killed %s (%d checkpoints done); new attempt after %s", victim, chk, time.Since(killed).Round(time.Millisecond))
	st = pc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	for _, h := range st.Hosts {
		if h == victim {
			t.Errorf("the last attempt ran on the killed host %s: %v", victim, st.Hosts)
		}
	}
	if !strings.Contains(st.Attempts[0].Reason, "host "+victim+" lost") {
		t.Errorf("attempt 0 reason %q: want host %s lost", st.Attempts[0].Reason, victim)
	}
	if len(st.Checkpoints) == 0 {
		t.Fatal("the status lists no completed checkpoint")
	}
	last := st.Checkpoints[len(st.Checkpoints)-1].Location
	onDisk, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "chk", "*"))
	switch storage {
	case "jetstream":
		if want := "jetstream://STREAMD_CHECKPOINTS/" + id + "/chk-"; !strings.HasPrefix(last, want) {
			t.Errorf("last checkpoint at %s, want %s...", last, want)
		}
		if len(onDisk) != 0 {
			t.Errorf("storage jetstream wrote into the checkpoint directory: %v", onDisk)
		}
		// The final checkpoint reads back through the object store.
		if out, errs, code := streamd(t, nil, "inspect", "--nats", pc.url, last); code != 0 || !strings.Contains(out, "fully") {
			t.Errorf("streamd inspect %s: exit %d\n%s\n%s", last, code, out, errs)
		}
	default:
		if !strings.HasPrefix(last, filepath.Join(filepath.Dir(path), "chk", id, "chk-")) {
			t.Errorf("last checkpoint at %s, want it in the checkpoint directory", last)
		}
	}
	got := outputLines(t, filepath.Join(filepath.Dir(path), "out"))
	sameLines(t, got, runLocally(t, path))
}
