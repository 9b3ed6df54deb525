package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

// openRunStore opens the checkpoint store of `streamd run`: the job's
// checkpoint directory, or with checkpoint.storage jetstream the object
// store of the NATS server of nats.url, under the job's name. close
// releases the NATS connection.
func (c *cli) openRunStore(ctx context.Context, cs *jobfile.CheckpointSettings, job string, log *slog.Logger) (checkpoint.Store, func(), error) {
	if cs.Storage != jobfile.StorageJetStream {
		s, err := checkpoint.OpenDir(cs.Dir, checkpoint.WithRetain(cs.Retain), checkpoint.WithLogger(log))
		return s, func() {}, err
	}
	nc, err := c.jetStreamConn("streamd run " + job)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	s, err := checkpoint.OpenJetStream(ctx, js, cs.Bucket, job, checkpoint.WithRetain(cs.Retain), checkpoint.WithLogger(log))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	closeStore := func() {
		// The retention of the last commits runs in the background: it
		// ends before the connection closes (a bounded wait).
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.WaitCleanup(wctx); err != nil {
			log.Warn("checkpoint retention not finished; the next run applies it", "err", err)
		}
		nc.Close()
	}
	return s, closeStore, nil
}

// resolveCheckpoint resolves a checkpoint path (run --from, inspect): a
// directory, or a jetstream:// location in the object store of the NATS
// server of nats.url. close releases the NATS connection.
func (c *cli) resolveCheckpoint(ctx context.Context, loc, who string) (*checkpoint.Metadata, checkpoint.StateReader, func(), error) {
	if !strings.HasPrefix(loc, checkpoint.JetStreamScheme) {
		md, err := checkpoint.Resolve(loc)
		return md, checkpoint.FileReader, func() {}, err
	}
	nc, err := c.jetStreamConn(who)
	if err != nil {
		return nil, nil, nil, err
	}
	md, r, err := wire.ResolveIn(ctx, nc, loc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return md, r, nc.Close, nil
}

func (c *cli) jetStreamConn(who string) (*nats.Conn, error) {
	c.clusterDefaults()
	nc, err := c.connectNATS(who)
	if err != nil {
		return nil, fmt.Errorf("checkpoint storage jetstream: %w", err)
	}
	return nc, nil
}
