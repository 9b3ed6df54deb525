package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
)

// natsSetupTimeout bounds what a nats source or sink does when it opens
// (stream lookups, creating the consumer).
const natsSetupTimeout = 30 * time.Second

// natsConns are the NATS connections of one Run: one per server URL list,
// made the first time a nats source or sink of the job needs it (so jobs
// without one never connect), shared by every subtask and attempt, and
// closed when Run returns.
type natsConns struct {
	mu     sync.Mutex
	conns  map[string]*nats.Conn
	closed bool
}

// natsOptions are the connection options of a nats source or sink: the
// runtime's Options.NATS (credentials, TLS), with the spec's url, if it
// names one, in place of the default URLs.
func (j *job) natsOptions(url string) natsutil.ConnectOptions {
	o := j.opts.NATS
	if url != "" {
		o.URLs = nil
		for _, u := range strings.Split(url, ",") {
			if u = strings.TrimSpace(u); u != "" {
				o.URLs = append(o.URLs, u)
			}
		}
	}
	if o.Name == "" {
		o.Name = "streamd job " + j.g.Name
	}
	return o
}

// get returns the connection to o's servers, connecting the first time (or
// again, if the previous connection was closed for good).
func (c *natsConns) get(o natsutil.ConnectOptions) (*nats.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("the job's NATS connections are closed")
	}
	key := o.URL()
	if nc := c.conns[key]; nc != nil && !nc.IsClosed() {
		return nc, nil
	}
	// Keep reconnecting while the job runs, a few times a second: a
	// restart of the server should not end the connection the subtasks
	// share, and the nats sink's commits wait for it to be back.
	nc, err := o.Connect(natsutil.KeepReconnecting()...)
	if err != nil {
		return nil, err
	}
	if c.conns == nil {
		c.conns = map[string]*nats.Conn{}
	}
	c.conns[key] = nc
	return nc, nil
}

// close closes every connection (after every subtask returned).
func (c *natsConns) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for k, nc := range c.conns {
		nc.Close()
		delete(c.conns, k)
	}
}

// natsSource returns the newSource function of a nats source subtask.
func (j *job) natsSource(t *task, spec *jobfile.SourceSpec) func(pos []byte) (connector.Source, error) {
	return func(pos []byte) (connector.Source, error) {
		nc, err := j.nats.get(j.natsOptions(spec.URL))
		if err != nil {
			return nil, fmt.Errorf("nats source: %w", err)
		}
		start, err := jobfile.ParseNATSStart(spec.Start)
		if err != nil {
			return nil, fmt.Errorf("nats source: start %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), natsSetupTimeout)
		defer cancel()
		src, err := connector.NewNATSSourceConn(ctx, nc, connector.NATSSourceOptions{
			Stream: spec.Stream, Subject: spec.Subject, Bounded: spec.Bounded,
			KeyFrom: spec.KeyFrom, WatermarkLag: spec.WatermarkLag, TimestampField: spec.TimestampField, Start: start,
		}, t.sub, t.v.Parallelism, pos)
		if err != nil {
			return nil, err
		}
		return src, nil
	}
}

// natsSink returns the open function of a nats sink subtask. Its writer
// (the commit-marker subjects) is named by the job's id when it is deployed
// (stable across failovers, apart for two deployments of one job file) or
// by the job's name for streamd run, and by operator (the sink's uid, or a
// dead-letter sink's "<uid>.dead_letter"). Without
// checkpointing it publishes at once (Direct).
func (j *job) natsSink(t *task, spec *jobfile.SinkSpec, operator string) func() (connector.Sink, error) {
	return func() (connector.Sink, error) {
		nc, err := j.nats.get(j.natsOptions(spec.URL))
		if err != nil {
			return nil, fmt.Errorf("nats sink: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), natsSetupTimeout)
		defer cancel()
		writer := j.g.Name
		switch {
		case spec.Job != "":
			writer = spec.Job
		case j.remote != nil:
			writer = j.remote.JobID
		}
		sink, err := connector.NewNATSSinkConn(ctx, nc, connector.NATSSinkOptions{
			Subject: spec.Subject, CommitSubject: spec.CommitSubject, Job: writer, Operator: operator, Direct: !t.ckpt,
		}, t.sub, t.v.Parallelism)
		if err != nil {
			return nil, err
		}
		return sink, nil
	}
}
