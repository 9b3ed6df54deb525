// Package client speaks streamd's control API (package wire) to the
// controller: deploy, status, cancel, savepoints, stops, upgrades and the
// jobs' log lines. The CLI and the REST API (internal/webapi) use it.
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

// Client speaks the control API.
type Client struct {
	nc   *nats.Conn
	arts *wire.Artifacts
	// Log, if set, gets the client's warnings (deploy --from of a
	// checkpoint older than one beside it).
	Log *slog.Logger
	// LeaderWait is how long a request waits for a controller to answer
	// while none does (a standby taking over, a controller starting
	// again): it is sent again until one answers; default
	// DefaultLeaderWait, < 0: not at all.
	LeaderWait time.Duration
}

// DefaultLeaderWait is the default of Client.LeaderWait: longer than a
// takeover with the default heartbeat interval (1.5s without renewal, then
// the job table's load).
const DefaultLeaderWait = 10 * time.Second

// NewClient uses nc for requests to the controller.
func NewClient(nc *nats.Conn) (*Client, error) {
	arts, err := wire.NewArtifacts(nc)
	if err != nil {
		return nil, err
	}
	return &Client{nc: nc, arts: arts}, nil
}

// errRetry: the controller answered Reply.Retry.
var errRetry = errors.New("cluster: the controller stopped before acting; sending again")

// readTryTimeout bounds one try of a read (list, status, hosts): a read
// that a controller took but never answered (it was killed) is sent again.
const readTryTimeout = time.Second

// Call sends a control request (req on subject, its answer decoded into
// resp; reply returns the answer's Reply) until a controller answers it,
// as the typed methods do: again while no controller listens, or the one
// that took it stopped before acting on it.
func (c *Client) Call(ctx context.Context, subject string, req, resp any, reply func() wire.Reply) error {
	return c.callTry(ctx, false, subject, req, resp, reply)
}

// CallIdempotent is Call for a request that changes nothing, or that is idempotent
// (a deploy with its request id): a try without an answer is sent again too.
func (c *Client) CallIdempotent(ctx context.Context, subject string, req, resp any, reply func() wire.Reply) error {
	return c.callTry(ctx, true, subject, req, resp, reply)
}

// callTry sends req until a controller answers it, within the leader wait:
// again when no controller listens, when the controller that took it
// stopped before acting on it (Reply.Retry), and, with read set, when no
// answer came.
func (c *Client) callTry(ctx context.Context, read bool, subject string, req, resp any, reply func() wire.Reply) error {
	wait := c.LeaderWait
	if wait == 0 {
		wait = DefaultLeaderWait
	}
	deadline := time.Now().Add(wait)
	delay := 50 * time.Millisecond
	try := func() error {
		// A new answer decodes into a zero resp: no field of an earlier
		// try's answer (its retry flag, its error) may stay.
		if v := reflect.ValueOf(resp); v.Kind() == reflect.Pointer && !v.IsNil() {
			v.Elem().SetZero()
		}
		if !read {
			return wire.Request(ctx, c.nc, subject, req, resp)
		}
		tctx, cancel := context.WithTimeout(ctx, readTryTimeout)
		defer cancel()
		return wire.Request(tctx, c.nc, subject, req, resp)
	}
	err := try()
	if err == nil && reply().Retry {
		err = errRetry
	}
	// Nobody received a request that found no responder: it is safe to
	// send again, whatever it asks; a read is sent again after no answer.
	for (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, errRetry) ||
		read && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) && ctx.Err() == nil) &&
		time.Now().Add(delay).Before(deadline) {
		select {
		case <-ctx.Done():
			if errors.Is(err, nats.ErrNoResponders) {
				return c.noController(ctx.Err())
			}
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
		if err = try(); err == nil && reply().Retry {
			err = errRetry
		}
	}
	if errors.Is(err, errRetry) {
		return reply().Err()
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return c.noController(nil)
		}
		return err
	}
	return reply().Err()
}

// noController is the error of a request no controller answered (matches
// ErrUnavailable; why, if set, is why the client stopped asking).
func (c *Client) noController(why error) error {
	msg := fmt.Sprintf("cluster: no controller answers on %s (is `streamd controller` or `streamd server` running on this NATS server?)", c.nc.ConnectedUrlRedacted())
	if why != nil {
		msg = fmt.Sprintf("cluster: no controller answered on %s before the request timed out (%v): is `streamd controller` or `streamd server` running on this NATS server?", c.nc.ConnectedUrlRedacted(), why)
	}
	return wire.Unavailable(msg)
}

// Conn is the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Deploy uploads the job's artifacts (modules, input files of file sources,
// and the job file when jobFile is set) and submits the job; it returns the
// job id.
func (c *Client) Deploy(ctx context.Context, job *jobfile.Job, jobFile string) (string, error) {
	return c.DeployFrom(ctx, job, jobFile, "")
}

// DeployFrom is Deploy of a job that starts from the checkpoint or savepoint
// at from: a jetstream:// location, or a directory (as streamd run --from
// takes it) that the hosts see at the same path. The checkpoint is resolved
// and loaded here first (checksums, and its fit to the job: finished
// operators, uids, parallelism of sources), and the job is sent with its
// exact location.
func (c *Client) DeployFrom(ctx context.Context, job *jobfile.Job, jobFile, from string) (string, error) {
	req := wire.DeployRequest{}
	if from != "" {
		if job.Checkpoint == nil {
			return "", errors.New("cluster: deploy --from: the job file has no checkpoint section")
		}
		md, r, err := wire.ResolveIn(ctx, c.nc, from)
		if err != nil {
			return "", err
		}
		if _, err := checkpoint.LoadRestoreFrom(ctx, r, md, job.Graph); err != nil {
			return "", err
		}
		if c.Log != nil {
			if newer, err := checkpoint.NewerThanIn(ctx, r, md); err != nil {
				c.Log.Warn("cannot tell whether a checkpoint or savepoint newer than the one restored exists", "from", md.Location, "err", err)
			} else if newer != nil {
				c.Log.Warn(fmt.Sprintf("restoring %s %d, but %s %d beside it is newer: the output committed after %s %d will be written again",
					md.Kind, md.ID, newer.Kind, newer.ID, md.Kind, md.ID), "from", md.Location, "newer", newer.Location)
			}
		}
		req.From = md.Location
		if !strings.HasPrefix(req.From, checkpoint.JetStreamScheme) {
			if req.From, err = filepath.Abs(req.From); err != nil {
				return "", fmt.Errorf("cluster: deploy --from: %w", err)
			}
		}
	}
	spec, err := wire.NewJobSpec(job, jobFile, func(path string) (wire.Artifact, error) { return c.arts.Upload(ctx, path) })
	if err != nil {
		return "", err
	}
	req.Job = spec
	// With a request id the deploy may be sent again (a lost answer, a
	// controller that stopped): the controller makes one job of it.
	var rid [8]byte
	_, _ = rand.Read(rid[:])
	req.RequestID = hex.EncodeToString(rid[:])
	var r wire.DeployReply
	if err := c.CallIdempotent(ctx, wire.SubjectDeploy, req, &r, func() wire.Reply { return r.Reply }); err != nil {
		return "", err
	}
	return r.JobID, nil
}

// List returns the jobs, newest first: with all, also those that ended
// longer ago than the controller's job retention.
func (c *Client) List(ctx context.Context, all bool) ([]wire.JobStatus, error) {
	var r wire.ListReply
	err := c.CallIdempotent(ctx, wire.SubjectList, wire.ListRequest{All: all}, &r, func() wire.Reply { return r.Reply })
	return r.Jobs, err
}

// Delete removes the record of an ended job (with checkpoints: its
// checkpoints too) and returns the job as it was.
func (c *Client) Delete(ctx context.Context, jobID string, checkpoints bool) (*wire.JobStatus, error) {
	var r wire.JobReply
	if err := c.Call(ctx, wire.SubjectDelete, wire.DeleteRequest{JobID: jobID, Checkpoints: checkpoints}, &r, func() wire.Reply { return r.Reply }); err != nil {
		return nil, err
	}
	return r.Job, nil
}

// Status returns one job's status.
func (c *Client) Status(ctx context.Context, jobID string) (*wire.JobStatus, error) {
	var r wire.JobReply
	if err := c.CallIdempotent(ctx, wire.SubjectStatus, wire.JobRequest{JobID: jobID}, &r, func() wire.Reply { return r.Reply }); err != nil {
		return nil, err
	}
	return r.Job, nil
}

// Cancel cancels a job and returns its status.
func (c *Client) Cancel(ctx context.Context, jobID string) (*wire.JobStatus, error) {
	var r wire.JobReply
	if err := c.Call(ctx, wire.SubjectCancel, wire.JobRequest{JobID: jobID}, &r, func() wire.Reply { return r.Reply }); err != nil {
		return nil, err
	}
	return r.Job, nil
}

// Savepoint takes a savepoint of a running job into dir.
func (c *Client) Savepoint(ctx context.Context, jobID, dir string) (string, error) {
	var r wire.SavepointReply
	err := c.Call(ctx, wire.SubjectSavepoint, wire.SavepointRequest{JobID: jobID, Dir: dir}, &r, func() wire.Reply { return r.Reply })
	return r.Path, err
}

// Stop stops a job with a savepoint (with drain: after finishing its input).
func (c *Client) Stop(ctx context.Context, jobID, dir string, drain bool) (string, error) {
	var r wire.SavepointReply
	err := c.Call(ctx, wire.SubjectStop, wire.StopRequest{JobID: jobID, SavepointDir: dir, Drain: drain}, &r, func() wire.Reply { return r.Reply })
	return r.Path, err
}

// Hosts lists the registered hosts.
func (c *Client) Hosts(ctx context.Context) ([]wire.HostStatus, error) {
	var r wire.HostsReply
	err := c.CallIdempotent(ctx, wire.SubjectHosts, struct{}{}, &r, func() wire.Reply { return r.Reply })
	return r.Hosts, err
}
