package testwasm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var bin struct {
	once      sync.Once
	dir, path string
	err       error
}

// Streamd builds cmd/streamd once per test process into a new temporary
// directory and returns the binary's path. Call RemoveBuilt from TestMain.
func Streamd(t testing.TB) string {
	t.Helper()
	bin.once.Do(func() {
		root, err := Root()
		if err != nil {
			bin.err = err
			return
		}
		if bin.dir, err = os.MkdirTemp("", "streamd-bin-"); err != nil {
			bin.err = err
			return
		}
		bin.path = filepath.Join(bin.dir, "streamd")
		cmd := exec.Command("go", "build", "-o", bin.path, "./cmd/streamd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			bin.err = fmt.Errorf("go build ./cmd/streamd: %v\n%s", err, out)
		}
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

// BinDir is the temporary directory Streamd built into: a place for other
// per-process files. Empty before the first Streamd.
func BinDir() string { return bin.dir }

// RemoveBuilt deletes what Streamd built.
func RemoveBuilt() {
	if bin.dir != "" {
		os.RemoveAll(bin.dir)
	}
}
