package cluster

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/runtime"
)

// testSpec is a job of parallelism p without artifacts: generator -> discard.
func testSpec(p int) wire.JobSpec {
	return wire.JobSpec{Name: "fence", Vertices: []wire.VertexSpec{
		{UID: "gen", Kind: control.KindSource, Parallelism: p, MaxParallelism: 128,
			Source: &jobfile.SourceSpec{Type: "generator", Count: 10, KeyPattern: "k", ValuePattern: "v"}},
		{UID: "out", Kind: control.KindSink, Parallelism: p, MaxParallelism: 128,
			Inputs: []control.Edge{{From: "gen", Partition: control.Forward}}, Sink: &jobfile.SinkSpec{Type: "discard"}},
	}}
}

// slowExecutor runs nothing: an execution waits for its cancel and then
// takes stopDelay to end. It records when each attempt started and ended.
type slowExecutor struct {
	stopDelay time.Duration
	mu        sync.Mutex
	started   map[wire.AttemptRef]time.Time
	ended     map[wire.AttemptRef]time.Time
	changed   chan struct{} // a start or an end
}

func newSlowExecutor(d time.Duration) *slowExecutor {
	return &slowExecutor{stopDelay: d, started: map[wire.AttemptRef]time.Time{}, ended: map[wire.AttemptRef]time.Time{}, changed: make(chan struct{}, 100)}
}

type slowExecution struct {
	e   *slowExecutor
	ref wire.AttemptRef
	ctx context.Context
}

func (e *slowExecutor) Start(ctx context.Context, r agent.ExecRequest) (agent.Execution, error) {
	ref := wire.AttemptRef{JobID: r.JobID, Attempt: r.Attempt}
	e.mu.Lock()
	e.started[ref] = time.Now()
	e.mu.Unlock()
	e.changed <- struct{}{}
	return &slowExecution{e: e, ref: ref, ctx: ctx}, nil
}

func (x *slowExecution) Wait() (runtime.Stats, error) {
	<-x.ctx.Done()
	time.Sleep(x.e.stopDelay) // a slow cancel
	x.e.mu.Lock()
	x.e.ended[x.ref] = time.Now()
	x.e.mu.Unlock()
	x.e.changed <- struct{}{}
	return runtime.Stats{}, x.ctx.Err()
}

// waitFor waits until cond (under e.mu) holds.
func (e *slowExecutor) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		e.mu.Lock()
		ok := cond()
		e.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-e.changed:
		case <-deadline:
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

func testNATS(t *testing.T) *nats.Conn {
	t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := natsutil.Connect(natsutil.URLs(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestHostFencesAttempts: a host never runs two attempts of a job at once
// and refuses older ones. Attempt 2 of a job whose attempt 1 runs there
// cancels attempt 1 and starts only once it ended (its slots pass on);
// attempts older than one assigned, or canceled, there are refused; a job
// that does not fit in the free slots is refused as busy.
func TestHostFencesAttempts(t *testing.T) {
	nc := testNATS(t)
	exec := newSlowExecutor(200 * time.Millisecond)
	h, err := agent.StartHost(nc, agent.HostOptions{ID: "h1", Slots: 2, DataDir: t.TempDir(), HeartbeatInterval: 50 * time.Millisecond, Executor: exec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	// A controller that takes every report.
	sub, err := nc.Subscribe(wire.SubjectHostEvents, func(m *nats.Msg) { wire.Respond(m, wire.Reply{}) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	assign := func(job string, attempt int, placement ...string) wire.AssignReply {
		t.Helper()
		var r wire.AssignReply
		a := wire.Assignment{JobID: job, Attempt: attempt, Job: testSpec(len(placement)), Placement: placement}
		if err := wire.RequestTimeout(nc, wire.HostSubject("h1", wire.HostVerbAssign), 5*time.Second, a, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	ref := func(job string, attempt int) wire.AttemptRef { return wire.AttemptRef{JobID: job, Attempt: attempt} }

	if r := assign("a", 1, "h1", "h1"); r.Err() != nil {
		t.Fatalf("attempt 1: %v", r.Err())
	}
	exec.waitFor(t, "attempt 1 started", func() bool { return !exec.started[ref("a", 1)].IsZero() })
	// Attempt 2 needs both slots, which attempt 1 holds: they pass on.
	if r := assign("a", 2, "h1", "h1"); r.Err() != nil || r.Busy {
		t.Fatalf("attempt 2 while attempt 1 runs: %+v", r)
	}
	exec.waitFor(t, "attempt 2 started", func() bool { return !exec.started[ref("a", 2)].IsZero() })
	exec.mu.Lock()
	end1, start2 := exec.ended[ref("a", 1)], exec.started[ref("a", 2)]
	exec.mu.Unlock()
	if end1.IsZero() || start2.Before(end1) {
		t.Fatalf("attempt 2 started at %v, attempt 1 ended at %v: want 2 to start after 1 ended", start2, end1)
	}
	if got := h.Running(); len(got) != 1 || got[0] != ref("a", 2) {
		t.Errorf("running %v, want only attempt 2", got)
	}

	for _, old := range []int{0, 1} {
		if r := assign("a", old, "h1"); r.Err() == nil || r.Busy || !strings.Contains(r.Error, "fenced") {
			t.Errorf("older attempt %d: %+v, want refused as fenced", old, r)
		}
	}
	// A cancel of an attempt that never came here fences it (and older
	// ones) too: its assignment, overtaken by the cancel, is refused.
	var cr wire.Reply
	if err := wire.RequestTimeout(nc, wire.HostSubject("h1", wire.HostVerbCancel), 5*time.Second, wire.HostRequest{JobID: "a", Attempt: 5}, &cr); err != nil || cr.Err() != nil {
		t.Fatalf("cancel attempt 5: %v %v", err, cr.Err())
	}
	for _, att := range []int{4, 5} {
		if r := assign("a", att, "h1"); r.Err() == nil || !strings.Contains(r.Error, "fenced") {
			t.Errorf("attempt %d after the cancel of 5: %+v, want refused as fenced", att, r)
		}
	}
	// Another job does not fit next to attempt 2's two slots.
	if r := assign("b", 0, "h1"); !r.Busy {
		t.Errorf("job b on a full host: %+v, want busy", r)
	}
	if r := assign("a", 6, "h1"); r.Err() != nil {
		t.Fatalf("attempt 6: %v", r.Err())
	}
	exec.waitFor(t, "attempt 6 started after attempt 2 ended", func() bool {
		return !exec.ended[ref("a", 2)].IsZero() && !exec.started[ref("a", 6)].IsZero() && !exec.started[ref("a", 6)].Before(exec.ended[ref("a", 2)])
	})
}

// fakeHost answers a controller's host subjects: it registers with
// heartbeats listing what it runs, accepts or refuses assignments, and
// answers cancels after a delay, reporting the attempt canceled first.
type fakeHost struct {
	t     *testing.T
	nc    *nats.Conn
	id    string
	slots int

	mu          sync.Mutex
	running     map[wire.AttemptRef]bool
	log         []string // "assign a/0", "cancel-done a/0", ...
	busyRefuse  int      // refuse this many assignments as busy
	refuse      int      // then refuse this many with an error (not busy)
	cancelDelay time.Duration
	changed     chan struct{}
}

func startFakeHost(t *testing.T, nc *nats.Conn, id string, slots int) *fakeHost {
	f := &fakeHost{t: t, nc: nc, id: id, slots: slots, running: map[wire.AttemptRef]bool{}, changed: make(chan struct{}, 1000)}
	subs := map[string]nats.MsgHandler{wire.HostVerbAssign: f.assign, wire.HostVerbCancel: f.cancel, wire.HostVerbOutcome: f.outcome}
	for verb, fn := range subs {
		sub, err := nc.Subscribe(wire.HostSubject(id, verb), fn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			f.mu.Lock()
			hb := wire.Heartbeat{HostID: id, Slots: slots, Interval: "20ms"}
			for r := range f.running {
				hb.Running = append(hb.Running, r)
			}
			f.mu.Unlock()
			data, _ := json.Marshal(hb)
			nc.Publish(wire.SubjectHeartbeat, data)
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return f
}

func (f *fakeHost) note(s string) {
	f.mu.Lock()
	f.log = append(f.log, s)
	f.mu.Unlock()
	f.changed <- struct{}{}
}

func (f *fakeHost) assign(m *nats.Msg) {
	var a wire.Assignment
	json.Unmarshal(m.Data, &a)
	ref := wire.AttemptRef{JobID: a.JobID, Attempt: a.Attempt}
	f.mu.Lock()
	busy, refuse := f.busyRefuse > 0, f.busyRefuse == 0 && f.refuse > 0
	switch {
	case busy:
		f.busyRefuse--
	case refuse:
		f.refuse--
	default:
		f.running[ref] = true
	}
	f.mu.Unlock()
	if busy {
		f.note("busy " + refString(ref))
		wire.Respond(m, wire.AssignReply{Busy: true, Reply: wire.Reply{Error: "cluster: host " + f.id + ": slots busy (test)"}})
		return
	}
	if refuse {
		f.note("refuse " + refString(ref))
		wire.Respond(m, wire.AssignReply{Reply: wire.Reply{Error: "cluster: host " + f.id + ": cannot run it (test)"}})
		return
	}
	f.note("assign " + refString(ref))
	wire.Respond(m, wire.AssignReply{})
}

func (f *fakeHost) cancel(m *nats.Msg) {
	var req wire.HostRequest
	json.Unmarshal(m.Data, &req)
	ref := wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}
	f.mu.Lock()
	d := f.cancelDelay
	f.mu.Unlock()
	go func() {
		time.Sleep(d) // the attempt takes its time to stop; heartbeats still list it
		f.mu.Lock()
		was := f.running[ref]
		delete(f.running, ref)
		f.mu.Unlock()
		// The attempt has stopped: noted before it is reported (the
		// report frees the slot, and the next assignment may come at once).
		f.note("cancel-done " + refString(ref))
		if was {
			f.report(ref, wire.SubtaskCanceled, "")
		}
		wire.Respond(m, wire.Reply{})
	}()
}

// outcome answers the controller's question about an attempt its
// heartbeats did not list (a heartbeat sent just before an assignment, on
// a loaded machine): running if it runs it. A real host answers too; with
// no answer the controller failed the attempt as unreported.
func (f *fakeHost) outcome(m *nats.Msg) {
	var req wire.HostRequest
	json.Unmarshal(m.Data, &req)
	f.mu.Lock()
	running := f.running[wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}]
	f.mu.Unlock()
	wire.Respond(m, wire.OutcomeReply{Running: running})
}

func (f *fakeHost) report(ref wire.AttemptRef, state, errText string) {
	var r wire.Reply
	ev := wire.HostEvent{HostID: f.id, JobID: ref.JobID, Attempt: ref.Attempt, State: state, Error: errText}
	if err := wire.RequestTimeout(f.nc, wire.SubjectHostEvents, 5*time.Second, ev, &r); err != nil {
		f.t.Errorf("host %s: report %s: %v", f.id, state, err)
	}
}

func (f *fakeHost) fail(ref wire.AttemptRef, errText string) {
	f.mu.Lock()
	delete(f.running, ref)
	f.mu.Unlock()
	f.report(ref, wire.SubtaskFailed, errText)
}

func (f *fakeHost) entries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

// waitLog waits until the host's log has entry.
func (f *fakeHost) waitLog(t *testing.T, entry string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for _, e := range f.entries() {
			if e == entry {
				return
			}
		}
		select {
		case <-f.changed:
		case <-deadline:
			t.Fatalf("host %s: no %q within 10s; log %v", f.id, entry, f.entries())
		}
	}
}

// waitHostsListed waits until the controller on nc lists n hosts.
func waitHostsListed(t *testing.T, nc *nats.Conn, n int) {
	t.Helper()
	cl, err := client.NewClient(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		hs, _ := cl.Hosts(context.Background())
		if len(hs) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d fake hosts not registered within 10s (%d listed)", n, len(hs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func refString(r wire.AttemptRef) string { return r.JobID + "/" + strconv.Itoa(r.Attempt) }

func index(log []string, entry string) int {
	for i, e := range log {
		if e == entry {
			return i
		}
	}
	return -1
}

// TestControllerAssignsOnlyFreedSlots: after a failure of its part on h2,
// the attempt of a job spread over h1 and h2 (one slot each) is canceled on
// h1, which takes its time; the controller assigns the next attempt only
// after h1 confirmed the cancel (it never sends an assignment h1 would
// refuse for busy slots). Then h1 refuses assignments as busy more often
// than MaxFailovers: the job is rescheduled each time, not failed.
func TestControllerAssignsOnlyFreedSlots(t *testing.T) {
	nc := testNATS(t)
	c, err := StartController(nc, ControllerOptions{HeartbeatInterval: 20 * time.Millisecond, LostAfter: 50, MaxFailovers: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h1, h2 := startFakeHost(t, nc, "h1", 1), startFakeHost(t, nc, "h2", 1)
	h1.cancelDelay = 300 * time.Millisecond // 15 heartbeats that still list the attempt
	waitHostsListed(t, nc, 2)
	var dr wire.DeployReply
	spec := testSpec(2)
	spec.Restart = jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 5}
	if err := wire.RequestTimeout(nc, wire.SubjectDeploy, 5*time.Second, wire.DeployRequest{Job: spec}, &dr); err != nil || dr.Err() != nil {
		t.Fatalf("deploy: %v %v", err, dr.Err())
	}
	job := dr.JobID
	a0 := wire.AttemptRef{JobID: job, Attempt: 0}
	h1.waitLog(t, "assign "+refString(a0))
	h2.waitLog(t, "assign "+refString(a0))

	h2.fail(a0, "injected failure of h2's part")
	a1 := wire.AttemptRef{JobID: job, Attempt: 1}
	h1.waitLog(t, "assign "+refString(a1))
	log := h1.entries()
	if c, a := index(log, "cancel-done "+refString(a0)), index(log, "assign "+refString(a1)); c < 0 || c > a {
		t.Fatalf("h1 log %v: attempt 1 assigned before h1 confirmed the cancel of attempt 0", log)
	}
	h2.waitLog(t, "assign "+refString(a1))

	// Busy refusals, more than MaxFailovers (2), are rescheduled.
	h1.mu.Lock()
	h1.busyRefuse = 4
	h1.cancelDelay = 0
	h1.mu.Unlock()
	h2.fail(a1, "injected failure again")
	a6 := wire.AttemptRef{JobID: job, Attempt: 6} // 2..5 refused as busy
	h1.waitLog(t, "assign "+refString(a6))
	var jr wire.JobReply
	if err := wire.RequestTimeout(nc, wire.SubjectStatus, 5*time.Second, wire.JobRequest{JobID: job}, &jr); err != nil || jr.Job == nil {
		t.Fatalf("status: %v %+v", err, jr)
	}
	st := jr.Job
	if wire.TerminalJobState(st.State) || st.Attempt != 6 {
		t.Fatalf("after 4 busy refusals: %s attempt %d (%s), want attempt 6 not ended", st.State, st.Attempt, st.Reason)
	}
	busy := 0
	for _, a := range st.Attempts {
		if strings.Contains(a.Reason, "slots are busy") {
			busy++
		}
	}
	if busy != 4 {
		t.Errorf("attempts %+v: want 4 rescheduled after busy refusals", st.Attempts)
	}
}
