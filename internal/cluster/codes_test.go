package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natstest"
)

// TestErrorCodesOnTheWire: a controller's refusals cross NATS with a code,
// which the client matches with errors.Is (no guessing from the text): an
// unknown job is ErrNotFound, a request the job's state refuses is
// ErrConflict; without a controller the client's error is ErrUnavailable
// and says that no controller answered, also when the request times out.
func TestErrorCodesOnTheWire(t *testing.T) {
	srv := natstest.Server(t)
	bare, err := client.NewClient(natstest.Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = bare.Status(ctx, "x")
	if !errors.Is(err, wire.ErrUnavailable) || errors.Is(err, wire.ErrNotFound) || !strings.Contains(err.Error(), "no controller answered") {
		t.Fatalf("status without a controller, request timeout 300ms: %v", err)
	}

	nc := natstest.Connect(t, srv.URL())
	ctl, err := StartController(nc, ControllerOptions{HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	cl, err := client.NewClient(natstest.Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if _, err := cl.Status(bg, "no-such-job"); !errors.Is(err, wire.ErrNotFound) || errors.Is(err, wire.ErrConflict) || !strings.Contains(err.Error(), `no job "no-such-job"`) {
		t.Fatalf("status of an unknown job: %v", err)
	}
	if _, err := cl.Cancel(bg, "no-such-job"); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("cancel of an unknown job: %v", err)
	}
	// A job that waits for slots (no host): not running, so no savepoint.
	var dr wire.DeployReply
	spec := testSpec(1)
	if err := cl.CallIdempotent(bg, wire.SubjectDeploy, wire.DeployRequest{Job: spec, RequestID: "codes-1"}, &dr, func() wire.Reply { return dr.Reply }); err != nil {
		t.Fatal(err)
	}
	id := dr.JobID
	if _, err := cl.Stop(bg, id, "", false); !errors.Is(err, wire.ErrConflict) || errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("stop of a job that waits for slots: %v", err)
	}
	if _, err := cl.Delete(bg, id, false); !errors.Is(err, wire.ErrConflict) {
		t.Fatalf("delete of a job that has not ended: %v", err)
	}
}
