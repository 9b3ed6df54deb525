package wire

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Artifacts stores and fetches files in the JetStream object store bucket
// ArtifactBucket. Objects are named "sha256-<hex>" after their content, so
// the same module deployed twice is stored once.
type Artifacts struct {
	js jetstream.JetStream
	// Retry is how FetchRetry retries transient errors; default
	// DefaultRetry.
	Retry RetryPolicy
	// TryTimeout bounds one try of FetchRetry (opening the bucket,
	// downloading and checking the object); default DefaultFetchTryTimeout.
	TryTimeout time.Duration
	// fetch is Fetch; tests replace it to inject failures.
	fetch func(ctx context.Context, cacheDir string, art Artifact) (string, error)

	mu  sync.Mutex // guards obs and uploads
	obs jetstream.ObjectStore
	// uploads serializes the uploads of one digest: two Puts of the same
	// object (two deploys of one module at once) would each write its
	// chunks and the second purge the first's, under a host that is
	// reading them (its fetch then stalls until it times out).
	uploads map[string]*sync.Mutex
}

// DefaultFetchTryTimeout is the default of Artifacts.TryTimeout.
const DefaultFetchTryTimeout = 30 * time.Second

// Errors of Fetch that no retry mends.
var (
	// ErrArtifactMissing: the object store has no object of the digest.
	ErrArtifactMissing = errors.New("cluster: artifact not in the object store")
	// ErrDigestMismatch: the object's content does not have its digest.
	ErrDigestMismatch = errors.New("cluster: artifact content does not match its digest")
)

// NewArtifacts uses the connection's JetStream.
func NewArtifacts(nc *nats.Conn) (*Artifacts, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("cluster: artifacts: jetstream: %w", err)
	}
	a := &Artifacts{js: js, Retry: DefaultRetry, TryTimeout: DefaultFetchTryTimeout}
	a.fetch = a.Fetch
	return a, nil
}

// FetchRetry is Fetch with transient errors (a try that timed out, NATS
// reconnecting, JetStream briefly unavailable) retried under a.Retry, each
// retry logged; a permanent error (ErrArtifactMissing, ErrDigestMismatch, a
// bad digest) or the end of ctx fails at once.
func (a *Artifacts) FetchRetry(ctx context.Context, cacheDir string, art Artifact, log *slog.Logger) (string, error) {
	var path string
	err := a.Retry.Do(ctx, log, "fetch artifact "+art.Name, func(ctx context.Context) error {
		tctx, cancel := context.WithTimeout(ctx, a.TryTimeout)
		defer cancel()
		p, err := a.fetch(tctx, cacheDir, art)
		path = p
		return err
	})
	return path, err
}

// store opens the bucket, creating it if it does not exist.
func (a *Artifacts) store(ctx context.Context) (jetstream.ObjectStore, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.obs != nil {
		return a.obs, nil
	}
	obs, err := a.js.ObjectStore(ctx, ArtifactBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = a.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      ArtifactBucket,
			Description: "streamd modules, job files and input files, by content hash",
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			obs, err = a.js.ObjectStore(ctx, ArtifactBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: artifact bucket %s (the NATS server needs JetStream): %w", ArtifactBucket, err)
	}
	a.obs = obs
	return obs, nil
}

func objectName(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// Upload stores the file at path unless an object with its hash exists.
func (a *Artifacts) Upload(ctx context.Context, path string) (Artifact, error) {
	digest, size, err := fileDigest(path)
	if err != nil {
		return Artifact{}, err
	}
	art := Artifact{Name: filepath.Base(path), Digest: digest, Size: size}
	obs, err := a.store(ctx)
	if err != nil {
		return Artifact{}, err
	}
	name := objectName(digest)
	a.mu.Lock()
	if a.uploads == nil {
		a.uploads = map[string]*sync.Mutex{}
	}
	one := a.uploads[digest]
	if one == nil {
		one = &sync.Mutex{}
		a.uploads[digest] = one
	}
	a.mu.Unlock()
	one.Lock()
	defer one.Unlock()
	if info, err := obs.GetInfo(ctx, name); err == nil && info.Size == uint64(size) {
		return art, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return Artifact{}, fmt.Errorf("cluster: upload: %w", err)
	}
	defer f.Close()
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name, Description: art.Name}, f); err != nil {
		return Artifact{}, fmt.Errorf("cluster: upload %s to object store %s: %w", path, ArtifactBucket, err)
	}
	return art, nil
}

// Fetch returns a path under cacheDir holding the artifact, downloading it
// if the cache does not have it. The content is checked against the digest.
func (a *Artifacts) Fetch(ctx context.Context, cacheDir string, art Artifact) (string, error) {
	hexsum, ok := strings.CutPrefix(art.Digest, "sha256:")
	if !ok || len(hexsum) != 64 {
		return "", Permanent(fmt.Errorf("cluster: artifact %s: digest %q is not sha256:<hex>", art.Name, art.Digest))
	}
	name := filepath.Base(art.Name)
	if name == "." || name == "/" || name == "" {
		name = "artifact"
	}
	dir := filepath.Join(cacheDir, hexsum)
	path := filepath.Join(dir, name)
	if d, _, err := fileDigest(path); err == nil && d == art.Digest {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cluster: artifact cache: %w", err)
	}
	obs, err := a.store(ctx)
	if err != nil {
		return "", err
	}
	res, err := obs.Get(ctx, objectName(art.Digest))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return "", fmt.Errorf("%w: fetch artifact %s (%s) from object store %s: %w (deploy uploads it; was the bucket purged?)", ErrArtifactMissing, art.Name, art.Digest, ArtifactBucket, err)
	}
	if err != nil {
		return "", fmt.Errorf("cluster: fetch artifact %s (%s) from object store %s: %w", art.Name, art.Digest, ArtifactBucket, err)
	}
	defer res.Close()
	tmp, err := os.CreateTemp(dir, ".fetch-*")
	if err != nil {
		return "", fmt.Errorf("cluster: artifact cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), res); err != nil {
		tmp.Close()
		return "", fmt.Errorf("cluster: fetch artifact %s: %w", art.Name, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("cluster: artifact cache: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != art.Digest {
		return "", fmt.Errorf("%w: fetch artifact %s: content has digest %s, want %s", ErrDigestMismatch, art.Name, got, art.Digest)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("cluster: artifact cache: %w", err)
	}
	return path, nil
}

func fileDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("cluster: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("cluster: read %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}
