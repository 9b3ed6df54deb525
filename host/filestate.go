package host

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/streamd/streamd/abi"
)

// FileState is keyed state kept as the files of an LSM checkpoint: what an
// incremental checkpoint of the pebble backend holds instead of KeyGroups.
// The immutable data files (sstables) are shared: the checkpoint store keeps
// each once, and later checkpoints refer to the files they still contain
// (docs/checkpoints.md, "Incremental checkpoints"). The other files (the
// MANIFEST, OPTIONS and marker files) are small and travel in the state blob
// (Data).
type FileState struct {
	// KeyGroups are the key groups the files hold: those of the subtask
	// that wrote them. They may hold other key groups' entries only if a
	// restore clipped them lazily; a reader filters by key group.
	KeyGroups      abi.KeyGroupRange
	MaxParallelism int
	Files          []StateFile

	// Root is, on restore, the store the shared files are in (its
	// jetstream:// root or directory); Fetch reads them from there. Both
	// are set by the store that read the checkpoint.
	Root  string
	Fetch func(ctx context.Context, f StateFile, w io.Writer) error

	dir string // write side: the local checkpoint directory (hard links); removed by Release
}

// StateFile is one file of a FileState.
type StateFile struct {
	Name string // its name in the database directory
	// Shared: an immutable data file, stored in the checkpoint store under
	// Key (set once uploaded, or when reused from an earlier checkpoint);
	// otherwise Data holds the content.
	Shared bool
	Key    string
	Size   int64
	CRC32C uint32 // shared files: of the content (set with Key)
	Data   []byte
}

// Path is the local path of file name of a FileState just cut (empty on
// restore).
func (f *FileState) Path(name string) string {
	if f.dir == "" {
		return ""
	}
	return filepath.Join(f.dir, name)
}

// SharedBytes is the size of the shared files.
func (f *FileState) SharedBytes() int64 {
	var n int64
	for _, sf := range f.Files {
		if sf.Shared {
			n += sf.Size
		}
	}
	return n
}

// release removes the local checkpoint directory.
func (f *FileState) release() {
	if f.dir != "" {
		os.RemoveAll(f.dir)
		f.dir = ""
	}
}

// fileCutter is a backend that can cut its keyed state as files
// (StateConfig.Incremental).
type fileCutter interface {
	fileCut() (*Snapshot, error)
}

// fileImporter is what restoring a FileState into a backend needs.
type fileImporter interface {
	stateBackend
	// importFiles loads the entries and timers of parts that lie in the
	// subtask's key groups.
	importFiles(ctx context.Context, parts []*FileState) error
}

var castagnoliTable = crc32.MakeTable(crc32.Castagnoli)

// fetchPart writes the files of part into dir (which exists), checking the
// size and checksum of each shared file.
func fetchPart(ctx context.Context, part *FileState, dir string) error {
	for _, f := range part.Files {
		if err := checkFileName(f.Name); err != nil {
			return err
		}
		path := filepath.Join(dir, f.Name)
		if !f.Shared {
			if err := os.WriteFile(path, f.Data, 0o644); err != nil {
				return fmt.Errorf("host: restore state file %s: %w", f.Name, err)
			}
			continue
		}
		if part.Fetch == nil {
			return fmt.Errorf("host: restore state file %s: no store to fetch shared file %s from", f.Name, f.Key)
		}
		if err := fetchFile(ctx, part, f, path); err != nil {
			return err
		}
	}
	return nil
}

func fetchFile(ctx context.Context, part *FileState, f StateFile, path string) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("host: restore state file %s: %w", f.Name, err)
	}
	h := crc32.New(castagnoliTable)
	cw := &countWriter{w: io.MultiWriter(out, h)}
	err = part.Fetch(ctx, f, cw)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && cw.n != f.Size {
		err = fmt.Errorf("%d bytes, the checkpoint says %d (truncated?)", cw.n, f.Size)
	}
	if err == nil && h.Sum32() != f.CRC32C {
		err = fmt.Errorf("checksum %08x, the checkpoint says %08x (corrupt)", h.Sum32(), f.CRC32C)
	}
	if err != nil {
		return fmt.Errorf("host: restore shared state file %s (%s) from %s: %w", f.Name, f.Key, part.Root, err)
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// checkFileName refuses names that are not a plain file name.
func checkFileName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("host: restore state: bad file name %q", name)
	}
	return nil
}

// scanPart opens the files of part (fetched into a temporary directory
// under parent) read-only and calls put for every entry and timer whose key
// group rng contains.
func scanPart(ctx context.Context, part *FileState, parent string, rng abi.KeyGroupRange, maxP int,
	put func(kg int, name, key, val []byte) error, timer func(k timerKind, key []byte, ts int64) error) error {
	if part.MaxParallelism != maxP {
		return fmt.Errorf("host: restored state files have max parallelism %d, this subtask %d", part.MaxParallelism, maxP)
	}
	if parent == "" {
		parent = os.TempDir()
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("host: restore state: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "restore-")
	if err != nil {
		return fmt.Errorf("host: restore state: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := fetchPart(ctx, part, dir); err != nil {
		return err
	}
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: pebbleLogger{quietLogger}})
	if err != nil {
		return fmt.Errorf("host: restore state: open the files of key groups %s: %w", part.KeyGroups, err)
	}
	defer db.Close()
	return scanDB(db, rng, maxP, put, timer)
}

// scanDB calls put and timer for the entries and timers of db in rng.
func scanDB(r pebble.Reader, rng abi.KeyGroupRange, maxP int,
	put func(kg int, name, key, val []byte) error, timer func(k timerKind, key []byte, ts int64) error) error {
	lo := []byte{prefixState, byte(rng.Start >> 8), byte(rng.Start)}
	hi := []byte{prefixState, byte((rng.End + 1) >> 8), byte(rng.End + 1)}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("host: restore state: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		kg, name, key, valid := splitStateKey(k)
		if !valid {
			it.Close()
			return fmt.Errorf("host: restore state: malformed key %q", k)
		}
		got, err := storedKeyGroup(name, key, maxP)
		if err != nil {
			it.Close()
			return err
		}
		if got != kg {
			it.Close()
			return fmt.Errorf("host: restored state %q key %q is in key group %d, stored under %d", name, key, got, kg)
		}
		v, err := it.ValueAndErr()
		if err == nil {
			err = put(kg, name, key, v)
		}
		if err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("host: restore state: %w", err)
	}
	it, err = r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTimer}, UpperBound: []byte{prefixProcTimer + 1}})
	if err != nil {
		return fmt.Errorf("host: restore state: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 9 {
			it.Close()
			return fmt.Errorf("host: restore state: malformed timer key %q", k)
		}
		if !rng.Contains(abi.KeyGroup(k[9:], maxP)) {
			continue
		}
		kind := eventTime
		if k[0] == prefixProcTimer {
			kind = procTime
		}
		if err := timer(kind, k[9:], timerTS(k)); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("host: restore state: %w", err)
	}
	return nil
}

// importParts restores parts into b through scanPart: the memory backend,
// and the pebble backend for the parts it does not adopt.
func importParts(ctx context.Context, parts []*FileState, parent string, rng abi.KeyGroupRange, maxP int,
	put func(kg int, name, key, val []byte) error, timer func(k timerKind, key []byte, ts int64) error) error {
	for _, p := range parts {
		if p.KeyGroups.End < rng.Start || p.KeyGroups.Start > rng.End {
			continue
		}
		if err := scanPart(ctx, p, parent, rng, maxP, put, timer); err != nil {
			return err
		}
	}
	return nil
}

var quietLogger = slog.New(slog.DiscardHandler)
