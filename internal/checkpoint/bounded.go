package checkpoint

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// MaxMetadataBytes bounds a _metadata file: metadata lists operators and
// subtasks, never state, so anything larger is not a checkpoint's.
const MaxMetadataBytes = 64 << 20

// readBounded reads the checkpoint file at path, which must be a regular
// file inside dir (a symlink may point only within dir: a device or a link
// out of the checkpoint is refused), of at most limit bytes. It reads no
// more than limit+1 bytes whatever the file claims, so a file that grows
// while it is read is caught too.
func readBounded(path, dir string, limit int64) ([]byte, error) {
	f, size, err := openBounded(path, dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size > limit {
		return nil, fmt.Errorf("%w: %s: %d bytes, more than the %d expected", ErrCorrupt, path, size, limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: %s: more than the %d bytes expected", ErrCorrupt, path, limit)
	}
	return data, nil
}

// openBounded opens the checkpoint file at path after checking that it is a
// regular file within dir, and returns its size.
func openBounded(path, dir string) (*os.File, int64, error) {
	li, err := os.Lstat(path)
	if err != nil {
		return nil, 0, fmt.Errorf("checkpoint: %w", err)
	}
	if li.Mode()&os.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			return nil, 0, fmt.Errorf("checkpoint: %w", err)
		}
		base, err := filepath.EvalSymlinks(dir)
		if err != nil {
			return nil, 0, fmt.Errorf("checkpoint: %w", err)
		}
		if rel, err := filepath.Rel(base, target); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil, 0, fmt.Errorf("%w: %s: a symlink to %s, out of the checkpoint directory: refused", ErrCorrupt, path, target)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("checkpoint: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("checkpoint: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%w: %s: not a regular file (%s): refused", ErrCorrupt, path, fi.Mode().Type())
	}
	return f, fi.Size(), nil
}
