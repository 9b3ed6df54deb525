package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster/wire"
)

// Logs reads the job's stored log lines, oldest first (not following new
// ones), and says whether more are stored past them. It is what
// `streamd logs` prints, for the REST API.
func (c *Client) Logs(ctx context.Context, jobID string, q wire.LogQuery) ([]wire.StoredLog, bool, error) {
	if !wire.ValidJobID(jobID) {
		return nil, false, fmt.Errorf("job %q: not a job id", jobID)
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return nil, false, err
	}
	stream, err := js.Stream(ctx, wire.LogStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, fmt.Errorf("job %s: no log stream %s on the NATS server (the hosts create it when they start)", jobID, wire.LogStream)
	}
	if err != nil {
		return nil, false, fmt.Errorf("job %s: log stream %s: %w", jobID, wire.LogStream, err)
	}
	op := "*"
	if q.Operator != "" {
		op = q.Operator
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{wire.SubjectLogsPrefix + jobID + "." + op + ".*"}}
	switch {
	case q.After > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, q.After+1
	case !q.Since.IsZero():
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &q.Since
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("job %s: read log stream %s: %w", jobID, wire.LogStream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("job %s: read log stream %s: %w", jobID, wire.LogStream, err)
	}
	n := min(int(info.NumPending), q.Limit)
	if n <= 0 {
		return nil, info.NumPending > 0, nil
	}
	wait := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(wait))
	if err != nil {
		return nil, false, fmt.Errorf("job %s: read log stream %s: %w", jobID, wire.LogStream, err)
	}
	var out []wire.StoredLog
	for m := range batch.Messages() {
		rec := wire.StoredLog{}
		if md, err := m.Metadata(); err == nil {
			rec.Seq = md.Sequence.Stream
		}
		if err := json.Unmarshal(m.Data(), &rec.LogRecord); err != nil {
			rec.Msg, rec.Source = fmt.Sprintf("(not a log record: %q)", m.Data()), "stream"
		}
		out = append(out, rec)
	}
	if err := batch.Error(); err != nil && len(out) < n {
		return out, true, fmt.Errorf("job %s: read log stream %s: %w", jobID, wire.LogStream, err)
	}
	return out, int(info.NumPending) > len(out), nil
}
