package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/streamd/streamd/internal/testwasm"
)

// TestStopWhoseSavepointFails: Ctrl-C stops `streamd run` with a savepoint;
// an operator fails in that savepoint's notify_checkpoint_complete, after
// the savepoint was written. streamd run says that the stop failed, naming
// the savepoint and its path, and, since Ctrl-C must end the run, cancels
// the job instead of restarting it (exit 130, saying so); resuming from the
// checkpoint directory gives every record exactly once.
func TestStopWhoseSavepointFails(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	const n = 4000
	job := fmt.Sprintf(`name: stopfails
checkpoint: {interval: 1h, dir: chk}
restart: {strategy: fixed-delay, attempts: 3, delay: 0}
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: 1000, value: "v-{n}"}
  - uid: op
    wasm: %s
    config: {fail_notify: 1}
    inputs: [gen]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [op]
`, n, mod)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	cmd, errb := start(t, dir, "run", "--progress", "off", "job.yaml")
	waitFor(t, "the job to run", errb, func() bool { return strings.Contains(errb.String(), "job starting") })
	must(t, cmd.Process.Signal(syscall.SIGINT))
	err := cmd.Wait()
	out := errb.String()
	if cmd.ProcessState.ExitCode() != 130 {
		t.Fatalf("exit %d (%v), want 130\nstderr:\n%s", cmd.ProcessState.ExitCode(), err, out)
	}
	if !strings.Contains(out, "stop-with-savepoint failed: its savepoint "+filepath.Join(dir, "chk", "savepoint-1-")) || !strings.Contains(out, "injected failure in notify_checkpoint_complete") {
		t.Fatalf("the stop's failure does not name the savepoint, its path and the cause:\n%s", out)
	}
	if !strings.Contains(out, "canceled without a savepoint: the stop-with-savepoint failed") || strings.Contains(out, "job failed, restarting") {
		t.Fatalf("the job was not canceled after its stop failed, or it restarted:\n%s", out)
	}
	r := run(t, dir, "", "run", "--progress", "off", "job.yaml", "--from", "chk")
	if r.code != 0 {
		t.Fatalf("resume: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	var want []string
	for i := 0; i < n; i++ {
		want = append(want, fmt.Sprintf("v-%d", i))
	}
	exactlyOnce(t, committedLines(t, filepath.Join(dir, "out")), want)
}
