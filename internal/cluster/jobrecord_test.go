package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natstest"
)

func listIDs(t *testing.T, cl *client.Client, all bool) []string {
	t.Helper()
	jobs, err := cl.List(context.Background(), all)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// TestJobRecords: a canceled job leaves the list once it ended longer ago
// than the job retention (list --all and status still show it); delete of
// a running job is refused; delete of an ended job removes its record, its
// checkpoint directory with --checkpoints, and a new controller on the same
// bucket does not bring it back.
func TestJobRecords(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.URL())
	const hb = 50 * time.Millisecond
	const retention = 200 * time.Millisecond
	ctl, err := StartController(nc, ControllerOptions{ID: "a", HeartbeatInterval: hb, JobRetention: retention})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	exec := newSlowExecutor(0)
	h, err := agent.StartHost(natstest.Connect(t, srv.URL()), agent.HostOptions{ID: "h1", Slots: 2, DataDir: t.TempDir(), HeartbeatInterval: hb, Executor: exec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	cl, err := client.NewClient(natstest.Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ckDir := t.TempDir()
	spec := testSpec(1)
	spec.Checkpoint = &jobfile.CheckpointSettings{Interval: time.Hour, Dir: ckDir, Retain: 1, Timeout: time.Minute}
	deploy := func() string {
		t.Helper()
		var dr wire.DeployReply
		if err := cl.CallIdempotent(ctx, wire.SubjectDeploy, wire.DeployRequest{Job: spec}, &dr, func() wire.Reply { return dr.Reply }); err != nil {
			t.Fatal(err)
		}
		exec.waitFor(t, "attempt 0 of "+dr.JobID+" started", func() bool { _, ok := exec.started[wire.AttemptRef{JobID: dr.JobID}]; return ok })
		return dr.JobID
	}
	ended, running := deploy(), deploy()

	// Delete of a running job is refused.
	if _, err := cl.Delete(ctx, running, false); err == nil || !strings.Contains(err.Error(), "cancel it first") {
		t.Fatalf("delete of a running job: %v, want refused (cancel it first)", err)
	}
	endedAt := time.Now() // the job cannot end before it is asked to (its reply may come late)
	if _, err := cl.Cancel(ctx, ended); err != nil {
		t.Fatal(err)
	}
	// The canceled job stays listed within the retention...
	if ids := listIDs(t, cl, false); len(ids) != 2 && time.Since(endedAt) < retention {
		t.Fatalf("list right after the cancel: %v, want both jobs", ids)
	}
	// ...and leaves it after.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids := listIDs(t, cl, false)
		if len(ids) == 1 && ids[0] == running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list %v: want only %s once %s ended longer ago than %v", ids, running, ended, retention)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if time.Since(endedAt) < retention {
		t.Fatalf("job hidden %v after it ended, before the retention %v", time.Since(endedAt), retention)
	}
	if ids := listIDs(t, cl, true); len(ids) != 2 {
		t.Fatalf("list --all: %v, want both jobs", ids)
	}
	if st, err := cl.Status(ctx, ended); err != nil || st.State != wire.JobCanceled {
		t.Fatalf("status of the hidden job: %+v, %v; want canceled", st, err)
	}

	// Delete with its checkpoints.
	jobDir := filepath.Join(ckDir, ended)
	if err := os.MkdirAll(filepath.Join(jobDir, "chk-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(ckDir, running)
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := cl.Delete(ctx, ended, true)
	if err != nil || st.ID != ended {
		t.Fatalf("delete: %+v, %v", st, err)
	}
	if _, err := os.Stat(jobDir); !os.IsNotExist(err) {
		t.Errorf("checkpoint directory %s after delete --checkpoints: %v, want gone", jobDir, err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("the other job's checkpoint directory: %v", err)
	}
	if ids := listIDs(t, cl, true); len(ids) != 1 || ids[0] != running {
		t.Fatalf("list --all after delete: %v, want only %s", ids, running)
	}
	if _, err := cl.Status(ctx, ended); err == nil || !strings.Contains(err.Error(), "no job") {
		t.Fatalf("status of the deleted job: %v, want no job", err)
	}
	if _, err := cl.Delete(ctx, ended, false); err == nil {
		t.Fatal("second delete of the job: no error")
	}

	// A new leader on the same bucket does not bring the record back.
	ctl.Close()
	b, err := StartController(natstest.Connect(t, srv.URL()), ControllerOptions{ID: "b", HeartbeatInterval: hb, JobRetention: retention})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	deadline = time.Now().Add(10 * time.Second)
	for {
		if _, term := b.Leader(); term != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new controller did not take the lead")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ids := listIDs(t, cl, true); len(ids) != 1 || ids[0] != running {
		t.Fatalf("list --all from the new leader: %v, want only %s", ids, running)
	}
	if _, err := cl.Status(ctx, ended); err == nil || !strings.Contains(err.Error(), "no job") {
		t.Fatalf("status of the deleted job from the new leader: %v, want no job", err)
	}
}

// TestDeleteStoreJetStream: DeleteStore of a job with checkpoint storage
// jetstream removes the objects under its prefix only.
func TestDeleteStoreJetStream(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.URL())
	js := natstest.JetStream(t, srv)
	ctx := context.Background()
	cs := &jobfile.CheckpointSettings{Storage: jobfile.StorageJetStream, Bucket: "CK"}
	if err := wire.DeleteStore(ctx, nc, cs, "job-a"); err != nil {
		t.Fatalf("delete without a bucket: %v", err)
	}
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "CK"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"job-a/chk-1/_metadata", "job-a/savepoint-2-job-a/_metadata", "job-ab/chk-1/_metadata", "job-b/chk-1/_metadata"} {
		if _, err := obs.PutString(ctx, name, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := wire.DeleteStore(ctx, nc, cs, "job-a"); err != nil {
		t.Fatal(err)
	}
	infos, err := obs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, in := range infos {
		left = append(left, in.Name)
	}
	if strings.Join(left, ",") != "job-ab/chk-1/_metadata,job-b/chk-1/_metadata" {
		t.Fatalf("objects left: %v, want those of job-ab and job-b", left)
	}
}
