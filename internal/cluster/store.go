package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
)

// OpenStore opens the checkpoint store of a job spread over hosts, on the
// controller (which commits the metadata) and on every host (which write
// their subtasks' state): the job's checkpoint directory, which every host
// and the controller must see at the same path (a shared file system).
// Savepoints are named savepoint-<id>-<job id>, so every process puts the
// blobs of one savepoint into the same directory.
func OpenStore(ctx context.Context, nc *nats.Conn, cs *jobfile.CheckpointSettings, jobID string, log *slog.Logger) (checkpoint.Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return checkpoint.OpenDir(cs.Dir, checkpoint.WithRetain(max(cs.Retain, 1)), checkpoint.WithLogger(log), checkpoint.WithSavepointSuffix(jobID))
}

// ResolveIn finds the completed checkpoint or savepoint at location in store.
func ResolveIn(ctx context.Context, store checkpoint.Store, location string) (*checkpoint.Metadata, error) {
	return checkpoint.Resolve(location)
}

// ExportSavepoint copies the savepoint at location into directory dir on this
// machine (the directory layout of docs/checkpoint-format.md) and returns its
// new path, dir/<name of the savepoint>.
func ExportSavepoint(ctx context.Context, store checkpoint.Store, location, dir string) (string, error) {
	md, err := ResolveIn(ctx, store, location)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, filepath.Base(md.Location))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	ents, err := os.ReadDir(md.Location)
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	// The blobs first, the metadata (the commit point) last.
	var meta string
	for _, e := range ents {
		if e.Name() == checkpoint.MetadataFile {
			meta = e.Name()
			continue
		}
		if e.Type().IsRegular() {
			if err := copyFile(filepath.Join(md.Location, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return "", err
			}
		}
	}
	if meta == "" {
		return "", fmt.Errorf("cluster: %s has no %s", md.Location, checkpoint.MetadataFile)
	}
	if err := copyFile(filepath.Join(md.Location, meta), filepath.Join(dst, meta)); err != nil {
		return "", err
	}
	return dst, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("cluster: copy %s: %w", from, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("cluster: %w", err)
	}
	return out.Close()
}
