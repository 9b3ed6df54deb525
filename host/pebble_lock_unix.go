//go:build unix

package host

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on f, waiting for it. flock (unlike
// fcntl record locks) conflicts between two opens of the file in one
// process too, so instances of one process see each other's locks.
func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}

// tryLockFile takes an exclusive flock on f if nobody holds one.
func tryLockFile(f *os.File) bool {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err == nil
		}
	}
}
