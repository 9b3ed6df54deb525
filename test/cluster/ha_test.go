package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
)

// haInterval is the heartbeat interval of the takeover tests: the lease is
// renewed every haInterval/2 and taken over after 1.5 haInterval.
const haInterval = 200 * time.Millisecond

// haCluster is a testCluster whose controllers each have their own NATS
// connection, so a test can cut one off the way a kill -9 would.
type haCluster struct {
	*testCluster
	ctls []*haController
}

type haController struct {
	nc  *nats.Conn
	ctl *cluster.Controller
}

func newHACluster(t *testing.T, controllers int, slots ...int) *haCluster {
	t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	hc := &haCluster{testCluster: &testCluster{t: t, srv: srv, hosts: map[string]*agent.Host{}}}
	for i := 0; i < controllers; i++ {
		hc.startController(fmt.Sprintf("ctl%d", i+1))
	}
	hc.engine, err = host.NewEngine(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.engine.Close(context.Background()) })
	for i, n := range slots {
		hc.addHostOpts(fmt.Sprintf("h%d", i+1), n, func(o *agent.HostOptions) { o.HeartbeatInterval = haInterval })
	}
	hc.client, err = client.NewClient(connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	hc.waitHosts(len(slots))
	return hc
}

// startController starts a controller named id on its own connection.
func (hc *haCluster) startController(id string) *haController {
	t := hc.t
	nc, err := natsutil.Connect(natsutil.URLs(hc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := cluster.StartController(nc, cluster.ControllerOptions{ID: id, Logger: logger(t).With("ctl", id),
		HeartbeatInterval: haInterval, LostAfter: 3})
	if err != nil {
		t.Fatal(err)
	}
	c := &haController{nc: nc, ctl: ctl}
	t.Cleanup(func() { ctl.Close(); nc.Close() })
	hc.ctls = append(hc.ctls, c)
	return c
}

// kill stops c the way kill -9 does: its connection drops at once, it says
// nothing to anyone (no lease release, no cancel).
func (c *haController) kill() {
	c.nc.Close()
	c.ctl.Close()
}

// leader is the controller that leads, and its term.
func (hc *haCluster) leader() (*haController, uint64) {
	for _, c := range hc.ctls {
		if _, term := c.ctl.Leader(); term != 0 {
			select {
			case <-c.ctl.Done():
				continue
			default:
				return c, term
			}
		}
	}
	return nil, 0
}

// waitLeader waits until a controller other than old leads and returns it.
func (hc *haCluster) waitLeader(old *haController, within time.Duration) (*haController, uint64, time.Duration) {
	hc.t.Helper()
	start := time.Now()
	for {
		if c, term := hc.leader(); c != nil && c != old {
			return c, term, time.Since(start)
		}
		if time.Since(start) > 10*time.Second {
			hc.t.Fatalf("no new leader within 10s (want within %s)", within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// poller asks for list and status of job id without pause until stopped,
// and counts the answers that missed the job.
type poller struct {
	mu       sync.Mutex
	polls    int
	failures []string
	terms    map[uint64]bool
	stop     chan struct{}
	done     chan struct{}
}

func startPoller(t *testing.T, client *client.Client, id string) *poller {
	p := &poller{terms: map[uint64]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			jobs, lerr := client.List(ctx, false)
			st, serr := client.Status(ctx, id)
			cancel()
			p.mu.Lock()
			p.polls++
			switch {
			case lerr != nil:
				p.failures = append(p.failures, "list: "+lerr.Error())
			case !slices.ContainsFunc(jobs, func(j wire.JobStatus) bool { return j.ID == id }):
				p.failures = append(p.failures, fmt.Sprintf("list: %d jobs, not %s", len(jobs), id))
			}
			switch {
			case serr != nil:
				p.failures = append(p.failures, "status: "+serr.Error())
			case st.ID != id:
				p.failures = append(p.failures, "status: job "+st.ID)
			default:
				p.terms[st.Term] = true
			}
			p.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return p
}

func (p *poller) finish(t *testing.T) {
	t.Helper()
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.failures) > 0 {
		t.Errorf("%d of %d list/status polls during the takeover failed: %v", len(p.failures), p.polls, p.failures)
	}
	t.Logf("%d list/status polls during the takeover, all answered; terms seen %v", p.polls, p.terms)
}

// exactlyOnce checks a slowJob's output: VALUE-0 .. VALUE-n-1, each once.
func exactlyOnce(t *testing.T, dir string, n int) {
	t.Helper()
	got := outputLines(t, dir)
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("VALUE-%d", i)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		missing, dup := lostAndTwice(got, want)
		t.Fatalf("output: %d lines, %d missing, %d twice; want %d exactly once", len(got), missing, dup, n)
	}
}

// TestLeaderKilledStandbyAdoptsJob kills the leading controller while a job
// runs, on one host and spread over two: the standby takes over within
// three heartbeat intervals, list and status answer throughout, the job
// goes on in the same attempt (not restarted) and its output is exactly
// once.
func TestLeaderKilledStandbyAdoptsJob(t *testing.T) {
	for _, spread := range []bool{false, true} {
		t.Run(map[bool]string{false: "one-host", true: "spread"}[spread], func(t *testing.T) {
			hc := newHACluster(t, 2, 1, 1)
			old, term := hc.leader()
			if old != hc.ctls[0] || term != 1 {
				t.Fatalf("leader %v term %d: want ctl1 in term 1", old, term)
			}
			const n = 3000
			p := 1
			if spread {
				p = 2
			}
			path := slowJob(t, n, 1000, p)
			appendCheckpoint(t, path)
			id := deploy(t, hc.testCluster, path, jobfile.Options{})
			st := hc.waitJob(id, "running with output", func(st *wire.JobStatus) bool {
				return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[2].RecordsIn > n/5 && len(st.Checkpoints) > 0)
			})
			if st.State != wire.JobRunning || len(st.Hosts) != p {
				t.Fatalf("job %s on %v (%s): want running on %d host(s)", st.State, st.Hosts, st.Reason, p)
			}
			lastID := st.Checkpoints[len(st.Checkpoints)-1].ID
			poll := startPoller(t, hc.client, id)
			old.kill()
			next, term, took := hc.waitLeader(old, 3*haInterval)
			t.Logf("leader killed; %s leads in term %d after %s (heartbeat interval %s)", hc.ctlID(next), term, took.Round(time.Millisecond), haInterval)
			// The lease expires 1.5 intervals after the last renewal; the
			// bound leaves a loaded machine room, and still fails a takeover
			// that waited for something other than the lease.
			if took > 25*haInterval || term != 2 {
				t.Errorf("takeover after %s in term %d: want within %s, term 2", took, term, 25*haInterval)
			}
			st = hc.waitJob(id, "finished", state(wire.JobFinished))
			poll.finish(t)
			if st.State != wire.JobFinished {
				t.Fatalf("job %s: %s", st.State, st.Reason)
			}
			if st.Attempt != 0 || len(st.Attempts) != 1 {
				t.Errorf("attempt %d, attempts %+v: want attempt 0 only (adopted, not restarted)", st.Attempt, st.Attempts)
			}
			// The new leader's coordinator took the checkpoints over: ids go on.
			if len(st.Checkpoints) == 0 || st.Checkpoints[len(st.Checkpoints)-1].ID <= lastID {
				t.Errorf("checkpoints after the takeover %+v: want one after %d", st.Checkpoints, lastID)
			}
			if st.Term != 2 || st.Leader != hc.ctlID(next) {
				t.Errorf("status from %s term %d, want %s term 2", st.Leader, st.Term, hc.ctlID(next))
			}
			for _, h := range hc.hosts {
				if h.Term() != 2 {
					t.Errorf("host %s knows term %d, want 2", h.ID(), h.Term())
				}
			}
			exactlyOnce(t, filepath.Join(filepath.Dir(path), "out"), n)
		})
	}
}

// TestLoneControllerRestartAdoptsJob kills the only controller and starts
// it again on the same NATS store: the running job is adopted (same
// attempt), a finished job is still listed with its result, nothing is
// canceled, and the output is exactly once.
func TestLoneControllerRestartAdoptsJob(t *testing.T) {
	hc := newHACluster(t, 1, 2)
	short := slowJob(t, 100, 0, 1)
	done := deploy(t, hc.testCluster, short, jobfile.Options{})
	hc.waitJob(done, "finished", state(wire.JobFinished))

	const n = 3000
	path := slowJob(t, n, 1000, 1)
	appendCheckpoint(t, path)
	id := deploy(t, hc.testCluster, path, jobfile.Options{})
	st := hc.waitJob(id, "running with output", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[2].RecordsIn > n/5 && len(st.Checkpoints) > 0)
	})
	if st.State != wire.JobRunning {
		t.Fatalf("job %s (%s): want running", st.State, st.Reason)
	}
	old := hc.ctls[0]
	old.kill()
	restarted := time.Now()
	hc.startController("ctl1") // the same name, as a restarted process would have
	next, term, _ := hc.waitLeader(old, 0)
	t.Logf("controller started again; leads in term %d after %s", term, time.Since(restarted).Round(time.Millisecond))

	jobs, err := hc.client.List(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("list after the restart: %d jobs, want 2", len(jobs))
	}
	for _, j := range jobs {
		switch {
		case j.ID == done && j.State != wire.JobFinished:
			t.Errorf("finished job %s listed %s after the restart", done, j.State)
		case j.ID == id && j.State != wire.JobRunning && j.State != wire.JobFinished:
			t.Errorf("running job %s listed %s (%s) after the restart", id, j.State, j.Reason)
		}
	}
	st = hc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished || st.Attempt != 0 || len(st.Attempts) != 1 {
		t.Fatalf("job %s attempt %d attempts %+v (%s): want finished in attempt 0 (adopted)", st.State, st.Attempt, st.Attempts, st.Reason)
	}
	if st.Leader != hc.ctlID(next) || st.Term != term {
		t.Errorf("status from %s term %d, want %s term %d", st.Leader, st.Term, hc.ctlID(next), term)
	}
	exactlyOnce(t, filepath.Join(filepath.Dir(path), "out"), n)
	exactlyOnce(t, filepath.Join(filepath.Dir(short), "out"), 100)
}

func (hc *haCluster) ctlID(c *haController) string {
	id, _ := c.ctl.Leader()
	return id
}

// appendCheckpoint adds a checkpoint section (a directory beside the job
// file) to the job file at path.
func appendCheckpoint(t *testing.T, path string) {
	t.Helper()
	b := readFile(t, path)
	if strings.Contains(b, "checkpoint:") {
		return
	}
	writeFile(t, path, b+"checkpoint: {interval: 100ms, dir: chk}\n")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
