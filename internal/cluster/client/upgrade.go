package client

import (
	"context"
	"fmt"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

// Upgrade uploads the new version of job jobID, the job (with its job file,
// when jobFile is set), or else the module at module, which replaces the
// module of wasm operator operator ("": the job's only one), and asks the
// controller to upgrade the job to it; startTimeout as
// UpgradeRequest.StartTimeout. It returns once the job stopped with its
// savepoint and the new version started: the job's status tells how it
// goes on (JobStatus.Versions).
func (c *Client) Upgrade(ctx context.Context, jobID string, job *jobfile.Job, jobFile, module, operator string, startTimeout time.Duration) (wire.UpgradeReply, error) {
	req := wire.UpgradeRequest{JobID: jobID, Operator: operator, StartTimeout: startTimeout}
	if module != "" {
		a, err := c.arts.Upload(ctx, module)
		if err != nil {
			return wire.UpgradeReply{}, fmt.Errorf("cluster: upgrade: module: %w", err)
		}
		req.Module = &a
	} else {
		spec, err := wire.NewJobSpec(job, jobFile, func(path string) (wire.Artifact, error) { return c.arts.Upload(ctx, path) })
		if err != nil {
			return wire.UpgradeReply{}, err
		}
		req.Job = &spec
	}
	var r wire.UpgradeReply
	err := c.Call(ctx, wire.SubjectUpgrade, req, &r, func() wire.Reply { return r.Reply })
	return r, err
}
