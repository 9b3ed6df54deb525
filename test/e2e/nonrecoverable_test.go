package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/testwasm"
)

// Failures that no restart can fix end the job (Flink's
// SuppressRestartsException): under the default restart strategy, which
// would restart forever, `streamd run` exits 1 within 10 s naming the
// cause. The bound is measured from the first attempt's start ("job
// starting"), so building the module cache does not count.

// endsWithin runs streamd in dir with args and checks that it exits with
// code within limit of saying "job starting", and that stderr holds every
// one of want. It returns stderr.
func endsWithin(t *testing.T, dir string, limit time.Duration, code int, args []string, want ...string) string {
	t.Helper()
	cmd, errb := start(t, dir, args...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ended := false
	startBy := time.Now().Add(60 * time.Second)
	for !ended && !strings.Contains(errb.String(), "job starting") {
		select {
		case <-done:
			ended = true // a refusal before the job started
		case <-time.After(20 * time.Millisecond):
			if time.Now().After(startBy) {
				t.Fatalf("the job did not start within 60s\nstderr:\n%s", errb.String())
			}
		}
	}
	if !ended {
		select {
		case <-done:
		case <-time.After(limit):
			cmd.Process.Kill()
			<-done
			t.Fatalf("streamd run still ran %v after the job started\nstderr:\n%s", limit, errb.String())
		}
	}
	stderr := errb.String()
	if got := cmd.ProcessState.ExitCode(); got != code {
		t.Fatalf("exit %d, want %d\nstderr:\n%s", got, code, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	return stderr
}

// wasmJob writes dir/job.yaml: an unbounded generator ("v-<n>") through the
// test guest module (with config, a flow mapping or "") into a file sink,
// checkpointing every 100ms.
func wasmJob(t *testing.T, dir, name, module, config string) {
	t.Helper()
	if config != "" {
		config = "\n    config: " + config
	}
	job := fmt.Sprintf(`name: %s
checkpoint: {interval: 100ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, rate: 1000, value: "v-{n}"}
  - uid: op
    wasm: %s%s
    inputs: [gen]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [op]
`, name, testwasm.Path(t, module), config)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
}

// TestNonRecoverableBadSinkPath: a file sink under /proc cannot be created
// by any attempt: the job fails at once.
func TestNonRecoverableBadSinkPath(t *testing.T) {
	dir := t.TempDir()
	job := `name: procsink
checkpoint: {interval: 100ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, rate: 1000}
  - uid: out
    sink: {type: file, path: /proc/streamd-out}
    inputs: [gen]
`
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	stderr := endsWithin(t, dir, 10*time.Second, 1, []string{"run", "--progress", "off", "job.yaml"},
		"no restart can fix it", "/proc/streamd-out", `operator "out"`)
	if strings.Contains(stderr, "restarting") {
		t.Errorf("the job restarted:\n%s", stderr)
	}
}

// TestNonRecoverableRefusedState: a checkpoint whose file sink state names
// a pending file "../escape" is refused when the sink opens: the job fails
// at once instead of restarting from that checkpoint forever.
func TestNonRecoverableRefusedState(t *testing.T) {
	dir := t.TempDir()
	foreverJob(t, dir, "checkpoint: {interval: 100ms, dir: chk}\n")
	cmd, errb := start(t, dir, "run", "--progress", "off", "job.yaml")
	waitFor(t, "a completed checkpoint", errb, func() bool { return completedCheckpoints(filepath.Join(dir, "chk")) >= 1 })
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()

	// The latest checkpoint again, as checkpoint id+1 under bad/, with the
	// sink's pending files replaced by one that escapes its directory.
	md, err := checkpoint.Resolve(filepath.Join(dir, "chk"))
	must(t, err)
	bad, err := checkpoint.OpenDir(filepath.Join(dir, "bad"))
	must(t, err)
	ctx := context.Background()
	out := *md
	out.ID, out.Kind, out.Operators = md.ID+1, control.KindCheckpoint, nil
	tampered := false
	for _, op := range md.Operators {
		nop := op
		nop.Subtasks = nil
		for _, s := range op.Subtasks {
			if s.Ref != "" {
				data, err := os.ReadFile(filepath.Join(md.Location, s.Ref))
				must(t, err)
				if op.UID == "out" {
					st, err := checkpoint.ReadState(md, s)
					must(t, err)
					st.SinkPending = connector.EncodePending([]connector.PendingFile{{ID: md.ID, Pending: "../escape", Final: "part-0-1"}})
					data, err = checkpoint.EncodeState(st)
					must(t, err)
					tampered = true
				}
				ref, err := bad.WriteState(ctx, control.KindCheckpoint, out.ID, control.SubtaskID{Operator: op.UID, Index: s.Index}, data)
				must(t, err)
				s.Ref, s.Size, s.CRC32C = ref.Name, ref.Size, ref.CRC32C
			}
			nop.Subtasks = append(nop.Subtasks, s)
		}
		out.Operators = append(out.Operators, nop)
	}
	if !tampered {
		t.Fatalf("the checkpoint has no state of the sink: %+v", md.Operators)
	}
	must(t, bad.Commit(ctx, &out))

	stderr := endsWithin(t, dir, 10*time.Second, 1, []string{"run", "--progress", "off", "job.yaml", "--from", "bad"},
		"no restart can fix it", `"../escape"`, "not plain names")
	if strings.Contains(stderr, "restarting") {
		t.Errorf("the job restarted:\n%s", stderr)
	}
}

// TestNonRecoverableModule: a Go module whose instantiation (the Go
// runtime's _initialize) runs out of a 3 MiB memory limit cannot be
// instantiated by any attempt.
func TestNonRecoverableModule(t *testing.T) {
	dir := t.TempDir()
	wasmJob(t, dir, "nomem", "internal/testguests/failonce/failonce.wasm", "")
	endsWithin(t, dir, 10*time.Second, 1, []string{"run", "--progress", "off", "--wasm-memory-limit-mib", "3", "job.yaml"},
		`operator "op"`, "_initialize failed")
}

// TestFailsInOpenEveryAttempt: a guest that fails in open with the same
// error on every attempt fails the job after three attempts in a row,
// though the default restart strategy would go on.
func TestFailsInOpenEveryAttempt(t *testing.T) {
	dir := t.TempDir()
	wasmJob(t, dir, "failopen", "internal/testguests/failopen/failopen.wasm", "")
	endsWithin(t, dir, 10*time.Second, 1, []string{"run", "--progress", "off", "job.yaml"},
		"failopen: this version fails in open", "3 attempts in a row failed in open with this error", "failed after 2 restarts")
}

// TestSigtermEndsRestartingJob: a job that fails on a poison record and
// restarts forever under the default strategy is ended by one SIGTERM within
// 10 s: no savepoint can be taken while it restarts, so it is canceled, and
// streamd run says so and exits 130.
func TestSigtermEndsRestartingJob(t *testing.T) {
	dir := t.TempDir()
	wasmJob(t, dir, "poison", "internal/testguests/failonce/failonce.wasm", `{poison: "v-20"}`)
	cmd, errb := start(t, dir, "run", "--progress", "off", "job.yaml")
	waitFor(t, "two restarts", errb, func() bool { return strings.Count(errb.String(), "job failed, restarting") >= 2 })
	must(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("streamd run still ran 10s after SIGTERM\nstderr:\n%s", errb.String())
	}
	stderr := errb.String()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("exit %d, want 130\nstderr:\n%s", code, stderr)
	}
	// Canceled (the job was restarting) or, if the signal found an attempt
	// running, stopped with a savepoint or canceled after the stop failed:
	// either way it says which.
	if !strings.Contains(stderr, "canceled without a savepoint") && !savepointRE.MatchString(stderr) {
		t.Fatalf("stderr says neither that the job was canceled nor its savepoint:\n%s", stderr)
	}
}
