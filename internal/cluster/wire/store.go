package wire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
)

// OpenStore opens the checkpoint store of a deployed job, on the controller
// (which commits the metadata of a job spread over hosts) and on every host
// (which write their subtasks' state).
//
// With checkpoint.storage jetstream it is the JetStream object store
// cs.Bucket (default STREAMD_CHECKPOINTS) on nc, under the prefix jobID:
// every process reaches it through NATS, so hosts need no shared disk.
// Otherwise it is the job's checkpoint directory, which every host and the
// controller must see at the same path (a shared file system).
// Savepoints are named savepoint-<id>-<job id>, so every process puts the
// blobs of one savepoint into the same place.
func OpenStore(ctx context.Context, nc *nats.Conn, cs *jobfile.CheckpointSettings, jobID string, log *slog.Logger) (checkpoint.Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := []checkpoint.DirOption{checkpoint.WithRetain(max(cs.Retain, 1)), checkpoint.WithLogger(log), checkpoint.WithSavepointSuffix(jobID)}
	if cs.Storage == jobfile.StorageJetStream {
		if nc == nil {
			return nil, fmt.Errorf("cluster: job %s: checkpoint storage jetstream needs a NATS connection", jobID)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, fmt.Errorf("cluster: job %s: jetstream: %w", jobID, err)
		}
		return checkpoint.OpenJetStream(ctx, js, cs.Bucket, jobID, opts...)
	}
	// Each deployed job has a directory of its own, so deployments of one
	// job file never share (or prune) each other's checkpoints.
	return checkpoint.OpenDir(filepath.Join(cs.Dir, jobID), opts...)
}

// DeleteStore removes every checkpoint and savepoint of a deployed job in
// its store (see OpenStore): the directory cs.Dir/jobID, or the objects
// under the prefix jobID in the object store cs.Bucket. A store that does
// not exist is no error.
func DeleteStore(ctx context.Context, nc *nats.Conn, cs *jobfile.CheckpointSettings, jobID string) error {
	if cs.Storage != jobfile.StorageJetStream {
		dir := filepath.Join(cs.Dir, jobID)
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("cluster: job %s: delete its checkpoints: %w", jobID, err)
		}
		return nil
	}
	if nc == nil {
		return fmt.Errorf("cluster: job %s: checkpoint storage jetstream needs a NATS connection", jobID)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: job %s: jetstream: %w", jobID, err)
	}
	bucket := cs.Bucket
	if bucket == "" {
		bucket = checkpoint.DefaultBucket
	}
	obs, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster: job %s: object store bucket %s: %w", jobID, bucket, err)
	}
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster: job %s: list object store bucket %s: %w", jobID, bucket, err)
	}
	for _, in := range infos {
		if in.Deleted || !strings.HasPrefix(in.Name, jobID+"/") {
			continue
		}
		if err := obs.Delete(ctx, in.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("cluster: job %s: delete %s from object store bucket %s: %w", jobID, in.Name, bucket, err)
		}
	}
	return nil
}

// ResolveIn finds the completed checkpoint or savepoint at location: a
// jetstream://BUCKET/... location (read through nc) or a directory (see
// checkpoint.Resolve). It returns the reader of its state blobs too.
func ResolveIn(ctx context.Context, nc *nats.Conn, location string) (*checkpoint.Metadata, checkpoint.StateReader, error) {
	if !strings.HasPrefix(location, checkpoint.JetStreamScheme) {
		md, err := checkpoint.Resolve(location)
		return md, checkpoint.FileReader, err
	}
	if nc == nil {
		return nil, nil, fmt.Errorf("cluster: %s: needs a NATS connection", location)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: jetstream: %w", err)
	}
	md, err := checkpoint.ResolveJetStream(ctx, js, location)
	return md, checkpoint.JetStreamReader{JS: js}, err
}

// LoadRestore resolves location (ResolveIn) and prepares the restore of g
// from it.
func LoadRestore(ctx context.Context, nc *nats.Conn, location string, g *control.JobGraph) (*checkpoint.Restore, error) {
	md, r, err := ResolveIn(ctx, nc, location)
	if err != nil {
		return nil, err
	}
	return checkpoint.LoadRestoreFrom(ctx, r, md, g)
}

// ExportSavepoint copies the savepoint at location (a directory or a
// jetstream:// location) into directory dir on this machine (the directory
// layout of docs/checkpoint-format.md) and returns its new path, dir/<name of
// the savepoint>.
func ExportSavepoint(ctx context.Context, nc *nats.Conn, location, dir string) (string, error) {
	md, _, err := ResolveIn(ctx, nc, location)
	if err != nil {
		return "", err
	}
	var js jetstream.JetStream
	if nc != nil {
		if js, err = jetstream.New(nc); err != nil {
			return "", fmt.Errorf("cluster: jetstream: %w", err)
		}
	}
	out, err := checkpoint.Export(ctx, js, md, dir)
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	return out, nil
}

// StoreName names a store for logs: its directory or jetstream:// root.
func StoreName(s checkpoint.Store) string {
	if r, ok := s.(interface{ Root() string }); ok {
		return r.Root()
	}
	return fmt.Sprintf("%T", s)
}

// OpenStoreRetry is OpenStore with transient errors (NATS reconnecting,
// JetStream briefly unavailable) retried under DefaultRetry.
func OpenStoreRetry(ctx context.Context, nc *nats.Conn, cs *jobfile.CheckpointSettings, jobID string, log *slog.Logger) (checkpoint.Store, error) {
	var store checkpoint.Store
	err := DefaultRetry.Do(ctx, log, "open checkpoint store", func(ctx context.Context) error {
		var err error
		store, err = OpenStore(ctx, nc, cs, jobID, log)
		return err
	})
	return store, err
}
