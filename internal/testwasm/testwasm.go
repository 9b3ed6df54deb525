// Package testwasm gives tests in any package real Wasm artifacts: it builds
// them with the repository's Makefile (`make -C <root> <target>`, which also
// rebuilds stale outputs) and returns their absolute path.
//
// Builds are serialized across test processes with a file lock (go test runs
// packages in parallel) and done at most once per target per process.
package testwasm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

const modulePath = "github.com/streamd/streamd"

var (
	mu      sync.Mutex
	results = map[string]error{} // target -> build result, per process
)

// Root returns the repository root (the directory of streamd's go.mod).
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testwasm: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testwasm: no go.mod of " + modulePath + " above the working directory")
		}
		dir = parent
	}
}

// Path builds target (a path relative to the repository root, e.g.
// "internal/conformance/guests/wat/conformance.wasm") if it is missing or
// stale and returns its absolute path. A failed build fails the test; only
// with -short, when the toolchain (make) is missing, does it skip.
func Path(t testing.TB, target string) string {
	t.Helper()
	p, err := Build(target)
	if err != nil {
		if testing.Short() && errors.Is(err, exec.ErrNotFound) {
			t.Skipf("testwasm: cannot build %s in -short mode: %v", target, err)
		}
		t.Fatalf("%v", err)
	}
	return p
}

// Build is Path without a testing.TB.
func Build(target string) (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	abs := filepath.Join(root, filepath.FromSlash(target))
	mu.Lock()
	defer mu.Unlock()
	if err, done := results[target]; done {
		return abs, err
	}
	err = withLock(root, func() error { return runMake(root, target) })
	results[target] = err
	return abs, err
}

// HasTarget reports whether the Makefile knows how to build target (some
// guests are added by other fragments of mk/ as they are written).
func HasTarget(target string) (bool, error) {
	root, err := Root()
	if err != nil {
		return false, err
	}
	cmd := exec.Command("make", "-C", root, "-n", target)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = nil
	err = cmd.Run()
	if err == nil {
		return true, nil
	}
	if strings.Contains(stderr.String(), "No rule to make target") {
		return false, nil
	}
	return false, fmt.Errorf("testwasm: make -n %s: %w\n%s", target, err, stderr.String())
}

func runMake(root, target string) error {
	cmd := exec.Command("make", "-C", root, "--no-print-directory", target)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("testwasm: make %s in %s: %w\n%s", target, root, err, out)
	}
	if _, err := os.Stat(filepath.Join(root, target)); err != nil {
		return fmt.Errorf("testwasm: make %s succeeded but did not produce it: %w", target, err)
	}
	return nil
}

// withLock runs f holding an exclusive flock shared by every test process
// building in root.
func withLock(root string, f func() error) error {
	sum := sha256.Sum256([]byte(root))
	name := filepath.Join(os.TempDir(), "streamd-testwasm-"+hex.EncodeToString(sum[:8])+".lock")
	lf, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("testwasm: lock file: %w", err)
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("testwasm: lock %s: %w", name, err)
	}
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN)
	return f()
}

// FailingJob writes dir/job.yaml, a job whose conformance operator "boom"
// panics on its first record ("conformance panic"), and returns its path.
func FailingJob(t testing.TB, dir string) string {
	t.Helper()
	job := fmt.Sprintf(`name: failing
operators:
  - uid: gen
    source: {type: generator, count: 10, value: panic}
  - uid: boom
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: discard}
    inputs: [boom]
`, Path(t, "internal/conformance/guests/go/conformance.wasm"))
	path := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
