package host

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A pebble instance's directory is claimed by a lock file next to it,
// <dir>.streamd-lock, which the instance holds locked (flock, released by
// the kernel when the process dies) from before the directory exists until
// it is removed. A process that dies without closing its instances (a kill,
// a crash) leaves their directories and file cuts behind; the next pebble
// instance opened under the same data directory finds their lock files
// unlocked and removes what they claim. Directories of live instances, of
// this process or another sharing the data directory, stay locked.
const lockSuffix = ".streamd-lock"

// staleLockAge: a lock file found unlocked with no directory beside it is
// removed only when older than this, as its owner may be between creating
// the file and locking it.
const staleLockAge = time.Minute

// dirLock is a held lock file.
type dirLock struct {
	f *os.File
}

// claimDir creates and locks a lock file in parent whose name starts with
// prefix, and returns it with the directory it claims (the lock file's
// path without its suffix), not yet created.
func claimDir(parent, prefix string) (*dirLock, string, error) {
	f, err := os.CreateTemp(parent, prefix+"-*"+lockSuffix)
	if err != nil {
		return nil, "", err
	}
	if err := lockFile(f); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, "", fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return &dirLock{f: f}, strings.TrimSuffix(f.Name(), lockSuffix), nil
}

// release removes the lock file and unlocks it (in that order, so nobody
// locks a file that is about to go). Idempotent.
func (l *dirLock) release() {
	if l == nil || l.f == nil {
		return
	}
	os.Remove(l.f.Name())
	l.f.Close()
	l.f = nil
}

// removeStaleDirs removes, under parent, what dead instances left: for each
// unlocked lock file, the directory it claims, that directory's file cuts
// (<dir>.cut-N) and the lock file. It logs what it removed and why it could
// not remove something; it never fails the caller.
func removeStaleDirs(parent string, log *slog.Logger) {
	locks, err := filepath.Glob(filepath.Join(parent, "*"+lockSuffix))
	if err != nil || len(locks) == 0 {
		return
	}
	for _, lp := range locks {
		f, err := os.OpenFile(lp, os.O_RDWR, 0)
		if err != nil {
			continue // gone meanwhile, or not ours to open
		}
		if !tryLockFile(f) {
			f.Close() // a live instance holds it
			continue
		}
		dir := strings.TrimSuffix(lp, lockSuffix)
		_, derr := os.Stat(dir)
		cuts, _ := filepath.Glob(dir + ".cut-*")
		if errors.Is(derr, fs.ErrNotExist) && len(cuts) == 0 {
			// Its owner may not have locked it yet; remove it only when old.
			if info, err := f.Stat(); err != nil || time.Since(info.ModTime()) < staleLockAge {
				f.Close()
				continue
			}
		}
		var failed error
		for _, d := range append(cuts, dir) {
			if err := os.RemoveAll(d); err != nil && failed == nil {
				failed = err
			}
		}
		if failed != nil {
			log.Warn("host: pebble state: cannot remove the files of a dead instance", "dir", dir, "err", failed)
			f.Close()
			continue
		}
		os.Remove(lp)
		f.Close()
		log.Info("host: pebble state: removed the files of a dead instance", "dir", dir, "file_cuts", len(cuts))
	}
}
