package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
)

// jetStreamConns starts a NATS server with JetStream and returns a function
// that opens a connection to it (closed when the test ends).
func jetStreamConns(t *testing.T) func() *nats.Conn {
	t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return func() *nats.Conn {
		nc, err := natsutil.Connect(natsutil.URLs(srv.URL()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// TestDeposedLeaderIsFenced: once a standby took over (term 2), the hosts
// refuse the requests of term 1 (a deposed leader that has not noticed yet):
// its cancel does not stop the adopted attempt and its assignment is
// refused; the new leader's requests work. The old leader itself is deposed when it finds its lease
// taken.
func TestDeposedLeaderIsFenced(t *testing.T) {
	conn := jetStreamConns(t)
	const hb = 100 * time.Millisecond
	ncA := conn()
	a, err := StartController(ncA, ControllerOptions{ID: "a", HeartbeatInterval: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	if _, term := a.Leader(); term != 1 {
		t.Fatalf("first controller: term %d, want 1", term)
	}
	exec := newSlowExecutor(0)
	hnc := conn()
	h, err := agent.StartHost(hnc, agent.HostOptions{ID: "h1", Slots: 1, DataDir: t.TempDir(), HeartbeatInterval: hb, Executor: exec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	cl, err := client.NewClient(conn())
	if err != nil {
		t.Fatal(err)
	}
	var dr wire.DeployReply
	if err := cl.Call(context.Background(), wire.SubjectDeploy, wire.DeployRequest{Job: testSpec(1)}, &dr, func() wire.Reply { return dr.Reply }); err != nil {
		t.Fatal(err)
	}
	ref := wire.AttemptRef{JobID: dr.JobID, Attempt: 0}
	exec.waitFor(t, "attempt 0 started", func() bool { _, ok := exec.started[ref]; return ok })

	// a is cut off: it can renew its lease no more, and b takes over in
	// term 2 once the lease lapsed.
	ncB := conn()
	ncA.Close()
	b, err := StartController(ncB, ControllerOptions{ID: "b", HeartbeatInterval: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, term := b.Leader(); term == 2 && h.Term() == 2 {
			break
		}
		if time.Now().After(deadline) {
			_, term := b.Leader()
			t.Fatalf("b term %d, host term %d: want 2 and 2", term, h.Term())
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-a.Done():
		if a.Err() == nil {
			t.Error("a stopped without saying it was deposed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a did not stop after losing its lease")
	}

	// Term 1's requests are refused; the adopted attempt runs on.
	var rep wire.Reply
	if err := wire.RequestTimeout(hnc, wire.HostSubject("h1", wire.HostVerbCancel), 5*time.Second, wire.HostRequest{JobID: ref.JobID, Attempt: 0, Term: 1}, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Err() == nil || !strings.Contains(rep.Error, "term 1 refused") {
		t.Errorf("cancel of term 1: %v, want refused", rep.Err())
	}
	var ar wire.AssignReply
	if err := wire.RequestTimeout(hnc, wire.HostSubject("h1", wire.HostVerbAssign), 5*time.Second, wire.Assignment{JobID: ref.JobID, Attempt: 5, Term: 1, Job: testSpec(1), Placement: []string{"h1"}}, &ar); err != nil {
		t.Fatal(err)
	}
	if ar.Err() == nil || !strings.Contains(ar.Error, "term 1 refused") {
		t.Errorf("assignment of term 1: %v, want refused", ar.Err())
	}
	if got := h.Running(); len(got) != 1 || got[0] != ref {
		t.Fatalf("host runs %v after term 1's requests, want only %v", got, ref)
	}
	// b adopts the attempt once the host reports it (its next heartbeat):
	// until then the job shows as created.
	var jr wire.JobReply
	for deadline := time.Now().Add(10 * time.Second); ; {
		jr = wire.JobReply{}
		if err := cl.CallIdempotent(context.Background(), wire.SubjectStatus, wire.JobRequest{JobID: ref.JobID}, &jr, func() wire.Reply { return jr.Reply }); err != nil {
			t.Fatal(err)
		}
		st := jr.Job
		if st.State == wire.JobRunning && st.Attempt == 0 && st.Term == 2 && st.Leader == "b" {
			break
		}
		if st.State != wire.JobCreated || time.Now().After(deadline) {
			t.Fatalf("status after the takeover: %s attempt %d term %d leader %q (%s); want running attempt 0 from b in term 2", st.State, st.Attempt, st.Term, st.Leader, st.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The leader of term 2 is obeyed.
	jr = wire.JobReply{}
	if err := cl.Call(context.Background(), wire.SubjectCancel, wire.JobRequest{JobID: ref.JobID}, &jr, func() wire.Reply { return jr.Reply }); err != nil {
		t.Fatal(err)
	}
	exec.waitFor(t, "attempt 0 canceled by term 2", func() bool { _, ok := exec.ended[ref]; return ok })
}

// TestNewLeaderListsSilentHostsOfTheTable: a host lost under one leader,
// whose job moved on, is not forgotten by the next: the new leader lists
// it from the job table as unconfirmed (no slots, never seen by it) and
// then lost when it stays silent; a host that reports is alive.
func TestNewLeaderListsSilentHostsOfTheTable(t *testing.T) {
	conn := jetStreamConns(t)
	const hb = 50 * time.Millisecond
	opts := func(id string) ControllerOptions {
		return ControllerOptions{ID: id, HeartbeatInterval: hb, LostAfter: 10}
	}
	a, err := StartController(conn(), opts("a"))
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]*agent.Host{}
	for _, id := range []string{"h1", "h2"} {
		h, err := agent.StartHost(conn(), agent.HostOptions{ID: id, Slots: 1, DataDir: t.TempDir(), HeartbeatInterval: hb, Executor: newSlowExecutor(0)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		hosts[id] = h
	}
	cl, err := client.NewClient(conn())
	if err != nil {
		t.Fatal(err)
	}
	hostState := func() map[string]wire.HostStatus {
		hs, err := cl.Hosts(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]wire.HostStatus{}
		for _, h := range hs {
			out[h.ID] = h
		}
		return out
	}
	waitHosts := func(what string, cond func(map[string]wire.HostStatus) bool) map[string]wire.HostStatus {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if hs := hostState(); cond(hs) {
				return hs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s: %+v", what, hostState())
			}
		}
	}
	waitHosts("both hosts alive", func(hs map[string]wire.HostStatus) bool {
		return hs["h1"].State == wire.HostAlive && hs["h2"].State == wire.HostAlive
	})
	var dr wire.DeployReply
	if err := cl.Call(context.Background(), wire.SubjectDeploy, wire.DeployRequest{Job: testSpec(2)}, &dr, func() wire.Reply { return dr.Reply }); err != nil {
		t.Fatal(err)
	}
	status := func() *wire.JobStatus {
		st, err := cl.Status(context.Background(), dr.JobID)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for deadline := time.Now().Add(20 * time.Second); len(status().Hosts) != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("job not running on both hosts: %+v", status())
		}
	}
	// h2 dies: a counts it lost, and the job runs on h1 alone.
	hosts["h2"].Close()
	waitHosts("h2 lost under a", func(hs map[string]wire.HostStatus) bool { return hs["h2"].State == wire.HostLost })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st := status(); st.State == wire.JobRunning && st.Attempt > 0 && len(st.Hosts) == 1 && st.Hosts[0] == "h1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job not running again on h1 alone: %+v", status())
		}
	}
	a.Close()
	b, err := StartController(conn(), opts("b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, term := b.Leader(); term >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b does not lead")
		}
	}
	hs := hostState()
	h2, ok := hs["h2"]
	if !ok || (h2.State != wire.HostUnconfirmed && h2.State != wire.HostLost) || h2.Slots != 0 || h2.Free != 0 {
		t.Fatalf("the new leader's hosts %+v: want h2 unconfirmed or lost, without slots", hs)
	}
	if h2.State == wire.HostUnconfirmed && !h2.LastSeen.IsZero() {
		t.Errorf("unconfirmed h2 last seen %v by a leader that never heard it", h2.LastSeen)
	}
	waitHosts("h2 lost and h1 alive under b", func(hs map[string]wire.HostStatus) bool {
		return hs["h2"].State == wire.HostLost && hs["h1"].State == wire.HostAlive && hs["h1"].Slots == 1
	})
}
