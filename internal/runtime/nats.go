package runtime

import (
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/natsutil"
)

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

// sourceEnv is what the connector registry gives source subtask t's
// constructor (Position is set per call).
func (j *job) sourceEnv(t *task) connector.SourceEnv {
	return connector.SourceEnv{
		Operator: t.v.UID, Job: j.writerName(), Subtask: t.sub, Parallelism: t.v.Parallelism,
		MaxRecordBytes: j.opts.MaxRecordBytes, Stdin: j.opts.Stdin, NATS: j.natsConn, Settings: j.opts.ConnectorSettings,
	}
}

// sinkEnv is what the registry gives the constructor of a sink of subtask
// t named operator (the sink's uid, or a dead-letter sink's
// "<uid>.dead_letter"). Its Job names the writer of a nats sink (the
// commit-marker subjects): the job's id when it is deployed (stable across
// failovers, apart for two deployments of one job file), else the job's
// name (streamd run); a spec's own Job (set by the controller) wins.
func (j *job) sinkEnv(t *task, operator string) connector.SinkEnv {
	return connector.SinkEnv{
		Operator: operator, Job: j.writerName(), Subtask: t.sub, Parallelism: t.v.Parallelism,
		Checkpointing: t.ckpt, CheckpointInterval: j.checkpointInterval(), Stdout: j.opts.Stdout, StdoutMu: j.stdout, NATS: j.natsConn, Settings: j.opts.ConnectorSettings,
	}
}

// checkpointInterval is the job's periodic checkpoint interval; 0: none.
func (j *job) checkpointInterval() time.Duration {
	if j.opts.Checkpoint == nil {
		return 0
	}
	return j.opts.Checkpoint.Interval
}

func (j *job) writerName() string {
	if j.remote != nil {
		return j.remote.JobID
	}
	return j.g.Name
}

// natsConn is the job's shared connection to url ("" the configured
// nats.url), for the registry's SourceEnv.NATS and SinkEnv.NATS.
func (j *job) natsConn(url string) (*nats.Conn, error) { return j.nats.get(j.natsOptions(url)) }
