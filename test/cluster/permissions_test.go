package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
)

// TestRolePermissions runs a cluster against a NATS server with exactly the
// permissions of docs/nats-permissions.conf: the controller, two hosts and a
// client each connect with their role's credentials, a job spread over both
// hosts with checkpoints in the JetStream object store runs to its end, and
// the client credential can find the control API's micro service, but can
// neither register a host nor report for one.
func TestRolePermissions(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	conf := filepath.Join(filepath.Dir(file), "..", "..", "docs", "nats-permissions.conf")
	pw := map[string]string{"controller": "c-secret", "host": "h-secret", "client": "u-secret"}
	for role, p := range pw {
		t.Setenv("STREAMD_"+strings.ToUpper(role)+"_PASSWORD", p)
	}
	parsed, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("%s: %v", conf, err)
	}
	if len(parsed.Users) != 3 {
		t.Fatalf("%s: %d users, want controller, host and client", conf, len(parsed.Users))
	}
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir(),
		Configure: func(o *server.Options) { o.Users = parsed.Users }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	violations := make(chan string, 64)
	as := func(role string) *nats.Conn {
		nc, err := nats.Connect(srv.URL(), nats.UserInfo(role, pw[role]), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				select {
				case violations <- role + ": " + err.Error():
				default:
				}
			}
		}))
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	tc := startController(t, srv, as("controller"))
	logs := wire.NewLogPublisher(as("host"), wire.LogStreamConfig{}, logger(t))
	t.Cleanup(logs.Close)
	for _, id := range []string{"h1", "h2"} {
		h, err := agent.StartHost(as("host"), agent.HostOptions{ID: id, Slots: 1, DataDir: t.TempDir(),
			HeartbeatInterval: hbInterval, Executor: &agent.LocalExecutor{Engine: tc.engine, Logs: logs}, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		tc.hosts[id] = h
	}
	clientConn := as("client")
	tc.client, err = client.NewClient(clientConn)
	if err != nil {
		t.Fatal(err)
	}
	tc.waitHosts(2)

	path := spreadJob(t, 3000, 0, 2, "checkpoint: {interval: 50ms, storage: jetstream}\n")
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished || len(st.Hosts) != 2 || len(st.Checkpoints) == 0 {
		t.Fatalf("job %s on %v with %d checkpoints: %s", st.State, st.Hosts, len(st.Checkpoints), st.Reason)
	}
	sameLines(t, outputLines(t, filepath.Join(filepath.Dir(path), "out")), runLocally(t, path))
	// The client finds the control API as a micro service (nats micro info).
	msg, err := clientConn.Request("$SRV.INFO."+cluster.ServiceName, nil, 10*time.Second)
	if err != nil {
		t.Fatalf("micro info as the client: %v", err)
	}
	var info struct {
		Endpoints []struct{ Subject string } `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil || len(info.Endpoints) == 0 || !strings.HasPrefix(info.Endpoints[0].Subject, "streamd.v1.ctl.") {
		t.Fatalf("micro info as the client: %v: %s", err, msg.Data)
	}
	// The client reads the job's log lines the hosts published.
	readLogLine(t, clientConn, id)
	select {
	case v := <-violations:
		t.Fatalf("a role lacks a permission it needs: %s", v)
	default:
	}

	// The client forges a heartbeat and a host report: the server refuses
	// both (each answer arrives in order on the client's connection), and no
	// host "evil" exists.
	hb, _ := json.Marshal(wire.Heartbeat{HostID: "evil", Slots: 100, Interval: "1s"})
	for _, subj := range []string{wire.SubjectHeartbeat, wire.SubjectHostEvents} {
		if err := clientConn.Publish(subj, hb); err != nil {
			t.Fatal(err)
		}
		select {
		case v := <-violations:
			if !strings.HasPrefix(v, "client: ") || !strings.Contains(v, subj) {
				t.Fatalf("violation %q, want the client's publish to %s", v, subj)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the server did not refuse the client's publish to %s", subj)
		}
	}
	hs, err := tc.client.Hosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.ID != "h1" && h.ID != "h2" {
			t.Errorf("host %q registered", h.ID)
		}
	}
	if len(hs) != 2 {
		t.Errorf("hosts %v, want h1 and h2", hs)
	}
}

// TestControllerRefusesOutOfRangeHeartbeats: without permissions in place, a
// heartbeat with a bad host id or slot count or interval registers nothing.
func TestControllerRefusesOutOfRangeHeartbeats(t *testing.T) {
	tc := newCluster(t, 1)
	nc := connect(t, tc.srv.URL())
	for _, hb := range []wire.Heartbeat{
		{HostID: "evil", Slots: 100000, Interval: "1s"},
		{HostID: "evil", Slots: -1, Interval: "1s"},
		{HostID: "evil", Slots: 0},
		{HostID: "evil", Slots: 2, Interval: "0s"},
		{HostID: "evil host", Slots: 2},
		{HostID: "", Slots: 2},
	} {
		b, _ := json.Marshal(hb)
		if err := nc.Publish(wire.SubjectHeartbeat, b); err != nil {
			t.Fatal(err)
		}
	}
	// A valid heartbeat sent after them registers: once it is listed, the
	// controller has handled the ones before (one subscription, in order).
	b, _ := json.Marshal(wire.Heartbeat{HostID: "good", Slots: 2, Interval: "1s"})
	if err := nc.Publish(wire.SubjectHeartbeat, b); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		hs, err := tc.client.Hosts(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ids := fmt.Sprint(hs)
		found := false
		for _, h := range hs {
			if h.ID == "good" {
				found = true
			}
			if h.ID != "good" && h.ID != "h1" {
				t.Fatalf("host %q registered: %s", h.ID, ids)
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the valid heartbeat registered no host: %s", ids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readLogLine reads the first log line of job id from the log stream as nc,
// and fails the test without one within 10s.
func readLogLine(t *testing.T, nc *nats.Conn, id string) wire.LogRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, wire.LogStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{wire.LogsSubject(id, "*", -1)}})
	if err != nil {
		t.Fatalf("read the log stream: %v", err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("no log line of job %s: %v", id, err)
	}
	var r wire.LogRecord
	if err := json.Unmarshal(msg.Data(), &r); err != nil || r.Job != id {
		t.Fatalf("log line %s: %v", msg.Data(), err)
	}
	return r
}
