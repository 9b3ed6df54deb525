package cluster

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natstest"
)

// TestDeployIsIdempotent: a deploy request sent again with the same request
// id (its answer was lost, or the controller that took it stopped) makes no
// second job: the answer names the job of the first try.
func TestDeployIsIdempotent(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.URL())
	ctl, err := StartController(nc, ControllerOptions{HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	deploy := func(rid string) string {
		t.Helper()
		data, _ := json.Marshal(wire.DeployRequest{Job: testSpec(1), RequestID: rid})
		msg, err := nc.Request(wire.SubjectDeploy, data, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r wire.DeployReply
		if err := json.Unmarshal(msg.Data, &r); err != nil || r.Error != "" {
			t.Fatalf("deploy: %v %s", err, r.Error)
		}
		return r.JobID
	}
	a, b, c := deploy("req-1"), deploy("req-1"), deploy("req-2")
	if a != b || a == c {
		t.Fatalf("job ids %s, %s (same request), %s (another): want the first two equal, the third new", a, b, c)
	}
	var list wire.ListReply
	msg, err := nc.Request(wire.SubjectList, []byte("{}"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(msg.Data, &list); err != nil || len(list.Jobs) != 2 {
		t.Fatalf("list: %v, %d jobs, want 2", err, len(list.Jobs))
	}
}

// TestClientSendsAgainOnRetry: a controller that answers Retry (it lost the
// lead before acting) gets the request again, and the answer of the next try
// is what the client returns, with nothing of the first.
func TestClientSendsAgainOnRetry(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.URL())
	var rids []string
	sub, err := nc.Subscribe(wire.SubjectDeploy, func(m *nats.Msg) {
		var req wire.DeployRequest
		_ = json.Unmarshal(m.Data, &req)
		rids = append(rids, req.RequestID)
		if len(rids) == 1 {
			wire.Respond(m, wire.DeployReply{Reply: wire.Reply{Error: "cluster: controller stopped before job x was saved", Retry: true}})
			return
		}
		wire.Respond(m, wire.DeployReply{JobID: "job-2"})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	cl, err := client.NewClient(nc)
	if err != nil {
		t.Fatal(err)
	}
	var r wire.DeployReply
	err = cl.CallIdempotent(context.Background(), wire.SubjectDeploy, wire.DeployRequest{RequestID: "rid-1"}, &r, func() wire.Reply { return r.Reply })
	if err != nil || r.JobID != "job-2" || r.Retry || r.Error != "" {
		t.Fatalf("answer %+v, %v: want job-2 and no error", r, err)
	}
	if len(rids) != 2 || rids[0] != "rid-1" || rids[1] != "rid-1" {
		t.Fatalf("requests %v: want two with the same id", rids)
	}
}

// TestLateRecordOfAnEarlierLeaderIsTaken: a job record an earlier leader
// wrote after the new leader read the table (its write held up by a NATS
// outage, its deploy answered) is taken by the new leader: status finds it,
// it is scheduled, and a deploy sent again with its request id names it.
func TestLateRecordOfAnEarlierLeaderIsTaken(t *testing.T) {
	srv := natstest.Server(t)
	connect := func() *nats.Conn { return natstest.Connect(t, srv.URL()) }
	first, err := StartController(connect(), ControllerOptions{ID: "first", HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	first.Close() // releases the lease
	nc := connect()
	ctl, err := StartController(nc, ControllerOptions{ID: "second", HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	if _, term := ctl.Leader(); term != 2 {
		t.Fatalf("second controller leads term %d, want 2", term)
	}
	// The first leader's late write of a job it deployed in term 1.
	now := time.Now()
	rec := jobRecord{ID: "late-1", Spec: testSpec(1), RequestID: "rid-late", State: wire.JobCreated, Slots: 1, Created: now, Updated: now, Term: 1}
	data, _ := json.Marshal(rec)
	if _, err := ctl.kv.Create(context.Background(), jobKey(rec.ID), data); err != nil {
		t.Fatal(err)
	}
	status := func() wire.JobReply {
		t.Helper()
		b, _ := json.Marshal(wire.JobRequest{JobID: rec.ID})
		msg, err := nc.Request(wire.SubjectStatus, b, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r wire.JobReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := status(); r.Error != "" || r.Job == nil || r.Job.ID != rec.ID {
		t.Fatalf("status of the late job: %+v", r)
	}
	b, _ := json.Marshal(wire.DeployRequest{Job: testSpec(1), RequestID: "rid-late"})
	msg, err := nc.Request(wire.SubjectDeploy, b, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var dr wire.DeployReply
	if err := json.Unmarshal(msg.Data, &dr); err != nil || dr.JobID != rec.ID {
		t.Fatalf("deploy again with the late job's request id: %+v, %v; want %s", dr, err, rec.ID)
	}
	// Rewritten in term 2: an older leader's next write of it fails.
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := ctl.kv.Get(context.Background(), jobKey(rec.ID))
		var got jobRecord
		if err == nil && json.Unmarshal(e.Value(), &got) == nil && got.Term == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late job's record was not rewritten in term 2: %+v, %v", got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
