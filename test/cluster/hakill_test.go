package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
)

// serverProc is a `streamd server` process that a test kills with SIGKILL
// and starts again on the same port and data directory.
type serverProc struct {
	t    *testing.T
	port int
	data string
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
}

func (s *serverProc) start() {
	t := s.t
	s.cmd = exec.Command(streamdBin(t), "server", "--nats-port", fmt.Sprint(s.port), "--data-dir", s.data,
		"--slots", "1", "--heartbeat-interval", "100ms", "--controller-id", "lone")
	s.cmd.Dir = s.data
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	s.done = done
	cmd := s.cmd
	go func() { cmd.Wait(); close(done) }()
}

func (s *serverProc) kill() {
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatal(err)
	}
	<-s.done
}

func (s *serverProc) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	if s.t.Failed() {
		s.t.Logf("streamd server output:\n%s", s.out.String())
	}
}

// TestKillServerAdoptsJob kills `streamd server` (its embedded NATS server
// and its controller) with SIGKILL while a job runs on a separate `streamd
// host`, and starts it again on the same data directory: the controller
// finds its bucket in the NATS store, adopts the job in the same attempt
// (the host kept running it), lists and reports a job that finished
// before, cancels nothing, and the output is exactly once.
func TestKillServerAdoptsJob(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs streamd processes")
	}
	s := &serverProc{t: t, port: freePort(t), data: t.TempDir()}
	s.start()
	defer func() { s.stop() }()
	url := fmt.Sprintf("nats://127.0.0.1:%d", s.port)
	newClient := func() *client.Client {
		deadline := time.Now().Add(20 * time.Second)
		for {
			nc, err := connectErr(url)
			if err == nil {
				t.Cleanup(nc.Close)
				cl, err := client.NewClient(nc)
				if err != nil {
					t.Fatal(err)
				}
				return cl
			}
			if time.Now().After(deadline) {
				t.Fatalf("NATS of streamd server not up after 20s: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	tc := &testCluster{t: t, client: newClient()}
	startProc(t, "host", "host", "--nats", url, "--heartbeat-interval=100ms", "--host-id", "h1", "--slots", "2", "--data-dir", t.TempDir())
	tc.waitHosts(2)

	short := slowJob(t, 50, 0, 1)
	done := deploy(t, tc, short, jobfile.Options{})
	tc.waitJob(done, "finished", state(wire.JobFinished))

	const n = 4000
	path := slowJob(t, n, 1000, 2) // 2 slots: only h1 has them
	appendCheckpoint(t, path)
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running with output", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[2].RecordsIn > n/5 && len(st.Checkpoints) > 0)
	})
	if st.State != wire.JobRunning || len(st.Hosts) != 1 || st.Hosts[0] != "h1" {
		t.Fatalf("job %s on %v (%s): want running on h1", st.State, st.Hosts, st.Reason)
	}
	s.kill()
	killed := time.Now()
	s.start()
	tc.client = newClient()
	jobs, err := tc.client.List(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server killed and started again; list answers after %s", time.Since(killed).Round(time.Millisecond))
	if len(jobs) != 2 {
		t.Fatalf("list after the restart: %d jobs, want 2", len(jobs))
	}
	for _, j := range jobs {
		if j.ID == done && j.State != wire.JobFinished {
			t.Errorf("finished job listed %s (%s) after the restart", j.State, j.Reason)
		}
		if j.Term < 2 {
			t.Errorf("job %s listed by term %d, want a later term than the killed controller's", j.ID, j.Term)
		}
	}
	st = tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished || st.Attempt != 0 || len(st.Attempts) != 1 {
		t.Fatalf("job %s attempt %d attempts %+v (%s): want finished in attempt 0 (adopted, nothing canceled)", st.State, st.Attempt, st.Attempts, st.Reason)
	}
	exactlyOnce(t, filepath.Join(filepath.Dir(path), "out"), n)
}

// connectErr connects to url, without retrying a server that is not up.
func connectErr(url string) (*nats.Conn, error) {
	return natsutil.Connect(natsutil.URLs(url))
}
