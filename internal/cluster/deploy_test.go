package cluster

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/natsutil"
)

// TestDeployIsIdempotent: a deploy request sent again with the same request
// id (its answer was lost, or the controller that took it stopped) makes no
// second job: the answer names the job of the first try.
func TestDeployIsIdempotent(t *testing.T) {
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := natsutil.Connect(natsutil.URLs(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctl, err := StartController(nc, ControllerOptions{HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	deploy := func(rid string) string {
		t.Helper()
		data, _ := json.Marshal(DeployRequest{Job: testSpec(1), RequestID: rid})
		msg, err := nc.Request(SubjectDeploy, data, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r DeployReply
		if err := json.Unmarshal(msg.Data, &r); err != nil || r.Error != "" {
			t.Fatalf("deploy: %v %s", err, r.Error)
		}
		return r.JobID
	}
	a, b, c := deploy("req-1"), deploy("req-1"), deploy("req-2")
	if a != b || a == c {
		t.Fatalf("job ids %s, %s (same request), %s (another): want the first two equal, the third new", a, b, c)
	}
	var list ListReply
	msg, err := nc.Request(SubjectList, []byte("{}"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(msg.Data, &list); err != nil || len(list.Jobs) != 2 {
		t.Fatalf("list: %v, %d jobs, want 2", err, len(list.Jobs))
	}
}
