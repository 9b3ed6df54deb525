package cluster

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testlog"
)

// srvRequest asks subject (a $SRV subject) and decodes the JSON answer into v.
func srvRequest(t *testing.T, nc *nats.Conn, subject string, v any) {
	t.Helper()
	msg, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	if err := json.Unmarshal(msg.Data, v); err != nil {
		t.Fatalf("%s: %v: %s", subject, err, msg.Data)
	}
}

// TestControlAPIIsAMicroService: the leader's control API is the micro
// service streamd-controller: $SRV.PING finds it with its version and
// metadata, $SRV.INFO lists one endpoint per control subject, on the
// subjects of docs/subjects.md, and $SRV.STATS counts the requests the
// cluster client made and the errors among them, whose body is as before.
// When the leader closes, the standby that takes over runs the service.
func TestControlAPIIsAMicroService(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.URL())
	const hb = 50 * time.Millisecond
	a, err := StartController(natstest.Connect(t, srv.URL()), ControllerOptions{ID: "ctl-a", HeartbeatInterval: hb, Version: "v1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)

	var ping micro.Ping
	srvRequest(t, nc, "$SRV.PING", &ping)
	if ping.Name != ServiceName || ping.Version != "1.2.3" || ping.Metadata["controller"] != "ctl-a" || ping.Metadata["term"] != "1" ||
		ping.Metadata["build"] != "v1.2.3" || ping.Type != micro.PingResponseType {
		t.Fatalf("ping: %+v", ping)
	}

	var info micro.Info
	srvRequest(t, nc, "$SRV.INFO."+ServiceName, &info)
	if info.ID != ping.ID || info.Description == "" {
		t.Fatalf("info: %+v, want the id %s and a description", info, ping.ID)
	}
	want := map[string]string{"deploy": wire.SubjectDeploy, "list": wire.SubjectList, "status": wire.SubjectStatus, "cancel": wire.SubjectCancel,
		"delete": wire.SubjectDelete, "savepoint": wire.SubjectSavepoint, "stop": wire.SubjectStop, "upgrade": wire.SubjectUpgrade, "hosts": wire.SubjectHosts}
	if len(info.Endpoints) != len(want) {
		t.Fatalf("info: %d endpoints %+v, want %d", len(info.Endpoints), info.Endpoints, len(want))
	}
	for _, e := range info.Endpoints {
		if want[e.Name] != e.Subject || e.QueueGroup != ServiceQueueGroup || e.Metadata["description"] == "" {
			t.Errorf("endpoint %+v: want subject %q, queue group %s and a description", e, want[e.Name], ServiceQueueGroup)
		}
	}

	// Requests through the cluster client: a deploy (no host: the job
	// waits for slots), the job's status, and the status of no job.
	cl, err := client.NewClient(natstest.Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var dr wire.DeployReply
	if err := cl.Call(ctx, wire.SubjectDeploy, wire.DeployRequest{Job: testSpec(1)}, &dr, func() wire.Reply { return dr.Reply }); err != nil {
		t.Fatal(err)
	}
	st, err := cl.Status(ctx, dr.JobID)
	if err != nil || st.ID != dr.JobID {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if _, err := cl.Status(ctx, "no-such-job"); err == nil || !strings.Contains(err.Error(), `no job "no-such-job"`) {
		t.Fatalf("status of no job: %v, want its error", err)
	}
	// The error reply's body is the one it always was, with the error's
	// code added; micro's headers come with it, their code the HTTP word
	// of the error's.
	data, _ := json.Marshal(wire.JobRequest{JobID: "no-such-job"})
	msg, err := nc.Request(wire.SubjectStatus, data, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(wire.JobReply{Reply: wire.Reply{Error: `cluster: no job "no-such-job" (streamd list shows the jobs)`, Code: wire.CodeNotFound}})
	if string(msg.Data) != string(body) || msg.Header.Get(micro.ErrorCodeHeader) != "404" || !strings.Contains(msg.Header.Get(micro.ErrorHeader), "no-such-job") {
		t.Fatalf("error reply: %s, headers %v; want body %s and micro's error headers", msg.Data, msg.Header, body)
	}

	// micro counts a request once its handler returned, which may be just
	// after the reply arrived: ask until the last one is counted.
	var counts map[string]*micro.EndpointStats
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var stats micro.Stats
		srvRequest(t, nc, "$SRV.STATS."+ServiceName, &stats)
		counts = map[string]*micro.EndpointStats{}
		for _, e := range stats.Endpoints {
			counts[e.Name] = e
		}
		if s, d := counts["status"], counts["deploy"]; s != nil && s.NumRequests >= 3 && d != nil && d.NumRequests >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if s := counts["status"]; s == nil || s.Subject != wire.SubjectStatus || s.NumRequests != 3 || s.NumErrors != 2 || !strings.Contains(s.LastError, "no-such-job") {
		t.Fatalf("status endpoint stats: %+v, want 3 requests, 2 errors", s)
	}
	if s := counts["deploy"]; s == nil || s.NumRequests != 1 || s.NumErrors != 0 {
		t.Fatalf("deploy endpoint stats: %+v, want 1 request, no error", s)
	}
	if s := counts["list"]; s == nil || s.NumRequests != 0 {
		t.Fatalf("list endpoint stats: %+v, want no request", s)
	}

	// A standby runs no service; once the leader closes it takes over and
	// runs it in term 2.
	b, err := StartController(natstest.Connect(t, srv.URL()), ControllerOptions{ID: "ctl-b", HeartbeatInterval: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	a.Close()
	deadline := time.Now().Add(10 * time.Second)
	for ping.Metadata["controller"] != "ctl-b" {
		if time.Now().After(deadline) {
			t.Fatalf("no ping answer of ctl-b after the takeover; last %+v", ping)
		}
		// No responders until b leads: ask again.
		if msg, err := nc.Request("$SRV.PING."+ServiceName, nil, time.Second); err == nil {
			ping = micro.Ping{}
			if err := json.Unmarshal(msg.Data, &ping); err != nil {
				t.Fatalf("ping: %v: %s", err, msg.Data)
			}
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if ping.Metadata["term"] != "2" || ping.Version != serviceDevVersion {
		t.Fatalf("ping after the takeover: %+v, want term 2, version %s", ping, serviceDevVersion)
	}
	if st, err := cl.Status(ctx, dr.JobID); err != nil || st.ID != dr.JobID {
		t.Fatalf("status from the new leader: %+v, %v", st, err)
	}
}

// failingRequest is a control request whose replies cannot be sent.
type failingRequest struct{ micro.Request }

func (failingRequest) Reply() string { return "_INBOX.gone" }
func (failingRequest) Respond([]byte, ...micro.RespondOpt) error {
	return nats.ErrMaxPayload
}
func (failingRequest) Error(string, string, []byte, ...micro.RespondOpt) error {
	return nats.ErrConnectionClosed
}

// A reply that could not be sent is logged with the endpoint, the reply
// subject and why, instead of leaving the client's wait unexplained; each
// request is logged at debug level with how long it took.
func TestControlReplyFailureIsLogged(t *testing.T) {
	logs := testlog.New()
	c := &Controller{log: slog.New(logs)}
	h := c.logged("status", func(req micro.Request) {
		reply(req, wire.JobReply{})
		reply(req, wire.JobReply{Reply: wire.ErrorReply(wire.Conflictf("busy"))})
	})
	h.Handle(failingRequest{})
	var msgs, errs []string
	for _, r := range logs.Matching("endpoint", "status") {
		if r.Attrs["reply_to"] != "_INBOX.gone" {
			t.Errorf("record %+v does not name the reply subject", r)
		}
		msgs = append(msgs, r.Level+" "+r.Msg)
		errs = append(errs, r.Attrs["err"])
	}
	want := []string{"DEBUG control request", "WARN control request: reply not sent", "WARN control request: reply not sent", "DEBUG control request answered"}
	if !slices.Equal(msgs, want) {
		t.Fatalf("logged %q, want %q", msgs, want)
	}
	if errs[1] != nats.ErrMaxPayload.Error() || errs[2] != nats.ErrConnectionClosed.Error() {
		t.Errorf("errors logged %q: want why each reply failed", errs[1:3])
	}
}

// controlSubscribers is how many subscriptions the server holds on the
// control API's status subject.
func controlSubscribers(t *testing.T, srv *natsutil.Server) int {
	t.Helper()
	sz, err := srv.Subsz(&server.SubszOptions{Subscriptions: true, Test: wire.SubjectStatus, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(sz.Subs)
}

// A leader that stops while NATS restarts leaves no control API
// subscription on the server once its connection is back. nats.go loses a
// subscription drained while reconnecting (micro stops a service so): the
// server kept it, routed requests of the endpoint's queue group to it, and
// nobody answered them. Its control API has a connection of its own,
// closed when it stops.
func TestStoppedLeaderLeavesNoControlSubscription(t *testing.T) {
	rs := natstest.NewRestartable(t)
	nc := rs.NC
	c, err := StartController(nc, ControllerOptions{ID: "a", HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, term := c.Leader(); term == 0 {
		t.Fatal("the only controller does not lead")
	}
	if n := controlSubscribers(t, rs.Srv); n != 1 {
		t.Fatalf("%d subscriptions on %s while leading, want 1", n, wire.SubjectStatus)
	}
	rs.Stop()
	for deadline := time.Now().Add(10 * time.Second); nc.IsConnected(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection did not see the server go")
		}
	}
	c.Close() // stops the service while the connection reconnects
	rs.Start()
	for deadline := time.Now().Add(10 * time.Second); !nc.IsConnected(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection did not come back")
		}
	}
	if err := nc.Flush(); err != nil { // its subscriptions are on the server again
		t.Fatal(err)
	}
	if n := controlSubscribers(t, rs.Srv); n != 0 {
		t.Fatalf("%d subscriptions on %s after the controller stopped, want none", n, wire.SubjectStatus)
	}
}
