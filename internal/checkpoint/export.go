package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"
)

// ReadBlob returns the bytes of the state blob of sub in checkpoint md,
// which is a directory or a jetstream:// location (then read through js),
// after checking its size and CRC32C against the metadata.
func ReadBlob(ctx context.Context, js jetstream.JetStream, md *Metadata, sub SubtaskMeta) ([]byte, error) {
	if err := checkBlobName(sub.Ref); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", md.Location, err)
	}
	bucket, prefix, isJS, err := ParseJetStreamLocation(md.Location)
	if err != nil {
		return nil, err
	}
	var data []byte
	var p string
	if isJS {
		if js == nil {
			return nil, fmt.Errorf("checkpoint: %s: reading a JetStream object store needs a NATS connection", md.Location)
		}
		obs, err := openBucket(ctx, js, bucket, false)
		if err != nil {
			return nil, err
		}
		p = md.Location + "/" + sub.Ref
		if data, err = obs.GetBytes(ctx, prefix+"/"+sub.Ref); err != nil {
			return nil, fmt.Errorf("checkpoint: %s: %w", p, err)
		}
	} else {
		p = filepath.Join(md.Location, sub.Ref)
		if data, err = readBounded(p, md.Location, sub.Size); err != nil {
			return nil, err
		}
	}
	if err := checkBlob(p, int64(len(data)), crc32c(data), sub); err != nil {
		return nil, err
	}
	return data, nil
}

// Export copies the checkpoint or savepoint md (a directory or a
// jetstream:// location, read through js) into the directory dir, in the
// directory layout: every blob, verified, then the _metadata file written
// atomically, last. It returns the copy's path, dir/NAME where NAME is the
// last element of md.Location (chk-ID or savepoint-ID-SUFFIX); an existing
// NAME with a _metadata is an error.
func Export(ctx context.Context, js jetstream.JetStream, md *Metadata, dir string) (string, error) {
	name := path.Base(filepath.ToSlash(md.Location))
	if name == "." || name == "/" || name == "" {
		return "", fmt.Errorf("checkpoint: export: %q has no checkpoint name", md.Location)
	}
	dst := filepath.Join(dir, name)
	if _, err := os.Lstat(filepath.Join(dst, MetadataFile)); err == nil {
		return "", fmt.Errorf("checkpoint: export %s: %s already exists", md.Location, filepath.Join(dst, MetadataFile))
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("checkpoint: export: %w", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", fmt.Errorf("checkpoint: export: %w", err)
	}
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			if s.Ref == "" {
				continue
			}
			data, err := ReadBlob(ctx, js, md, s)
			if err != nil {
				return "", fmt.Errorf("checkpoint: export operator %q: %w", op.UID, err)
			}
			if err := writeFileSync(filepath.Join(dst, s.Ref), data); err != nil {
				return "", fmt.Errorf("checkpoint: export: %w", err)
			}
		}
	}
	cp := *md
	data, err := encodeMetadata(&cp)
	if err != nil {
		return "", err
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dst, MetadataFile+".tmp-"+hex.EncodeToString(rnd[:]))
	if err := writeFileSync(tmp, data); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("checkpoint: export: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dst, MetadataFile)); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("checkpoint: export: %w", err)
	}
	if err := syncDir(dst); err != nil {
		return "", fmt.Errorf("checkpoint: export: %w", err)
	}
	return dst, nil
}
