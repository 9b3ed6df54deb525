package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testout"
	"github.com/streamd/streamd/internal/testwasm"
)

// committedLines returns the lines of the visible files of dir (hidden files
// are in-progress or pending data), sorted.
func committedLines(t *testing.T, dir string) []string { return testout.Committed(t, dir) }

func exactlyOnce(t *testing.T, got, want []string) {
	t.Helper()
	sort.Strings(want)
	count := map[string]int{}
	for _, l := range got {
		count[l]++
	}
	var bad []string
	missing, dups := 0, 0
	for _, w := range want {
		switch c := count[w]; {
		case c == 0:
			missing++
		case c > 1:
			dups++
		}
		if count[w] != 1 {
			bad = append(bad, fmt.Sprintf("%s x%d", w, count[w]))
		}
		delete(count, w)
	}
	if len(bad) > 0 || len(count) > 0 {
		t.Fatalf("got %d lines, want %d: %d missing, %d more than once, %d unexpected; wrong counts (first 5): %q", len(got), len(want), missing, dups, len(count), bad[:min(5, len(bad))])
	}
}

// start starts streamd with args in dir.
func start(t *testing.T, dir string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(streamd(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "STREAMD_WASM_CACHE_DIR="+cacheDir(t))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	must(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, &errb
}

// waitFor polls cond for up to 30s.
func waitFor(t *testing.T, what string, errb *bytes.Buffer, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s\nstderr:\n%s", what, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func completedCheckpoints(dir string) int {
	m, _ := filepath.Glob(filepath.Join(dir, "chk-*", "_metadata"))
	return len(m)
}

// TestCrashAndResume: streamd run killed with SIGKILL mid-job, then run again
// with --from the checkpoint directory, ends with every record exactly once
// in the committed output.
func TestCrashAndResume(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	const n = 20000
	job := fmt.Sprintf(`name: crash
parallelism: 2
checkpoint: {interval: 50ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: 10000, value: "v-{n}"}
  - uid: op
    wasm: %s
    config: {mode: count}
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [op]
`, n, mod)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	cmd, errb := start(t, dir, "run", "--progress", "off", "job.yaml")
	waitFor(t, "a completed checkpoint and committed output", errb, func() bool {
		return completedCheckpoints(filepath.Join(dir, "chk")) >= 1 && len(committedLinesQuiet(filepath.Join(dir, "out"))) > 0
	})
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	if got := len(committedLines(t, filepath.Join(dir, "out"))); got >= n {
		t.Fatalf("the job finished before it was killed (%d lines)", got)
	}
	r := run(t, dir, "", "run", "--progress", "off", "job.yaml", "--from", "chk")
	if r.code != 0 {
		t.Fatalf("resume: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	per := map[int]int{}
	var want []string
	for i := 0; i < n; i++ {
		per[i%100]++
		want = append(want, fmt.Sprintf("key-%d=%d", i%100, per[i%100]))
	}
	exactlyOnce(t, committedLines(t, filepath.Join(dir, "out")), want)
}

func committedLinesQuiet(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

var savepointRE = regexp.MustCompile(`stopped with savepoint (\S+)`)

// resumeExactlyOnce resumes job in dir from savepoint sp at each
// parallelism and checks that out/ then holds want exactly once.
func resumeExactlyOnce(t *testing.T, dir, job, sp string, want []string, parallelisms ...string) {
	t.Helper()
	for _, p := range parallelisms {
		must(t, os.RemoveAll(filepath.Join(dir, "out")))
		r := run(t, dir, "", "run", "--progress", "off", "-p", p, job, "--from", sp)
		if r.code != 0 {
			t.Fatalf("resume at p=%s: exit %d\nstderr:\n%s", p, r.code, r.stderr)
		}
		exactlyOnce(t, committedLines(t, filepath.Join(dir, "out")), append([]string(nil), want...))
	}
}

// stopWithSavepoint runs job (checkpointing to dir/chk) in dir, stops it with
// Ctrl-C after its first completed checkpoint and returns the savepoint.
func stopWithSavepoint(t *testing.T, dir, job string) string {
	t.Helper()
	cmd, errb := start(t, dir, "run", "--progress", "off", job)
	waitFor(t, "a completed checkpoint", errb, func() bool { return completedCheckpoints(filepath.Join(dir, "chk")) >= 1 })
	must(t, cmd.Process.Signal(syscall.SIGINT))
	err := cmd.Wait()
	m := savepointRE.FindStringSubmatch(errb.String())
	if m == nil {
		t.Fatalf("no savepoint path after SIGINT (%v)\nstderr:\n%s", err, errb.String())
	}
	if cmd.ProcessState.ExitCode() != 130 {
		t.Fatalf("exit %d after SIGINT, want 130\nstderr:\n%s", cmd.ProcessState.ExitCode(), errb.String())
	}
	return m[1]
}

// TestRescaleWordcount: a word count stopped with Ctrl-C (a savepoint
// without drain) at parallelism 2 and resumed from the savepoint at 3 and at
// 1 gives the counts of an uninterrupted run.
func TestRescaleWordcount(t *testing.T) {
	dir := example(t, "wordcount", "wordcount.yaml")
	const n, words = 30000, 40
	job := fmt.Sprintf(`name: wordcount-rescale
parallelism: 2
checkpoint: {interval: 50ms, dir: chk}
operators:
  - uid: lines
    parallelism: 1
    source: {type: generator, count: %d, rate: 20000, value: "word{k} other{k}", keys: %d}
  - uid: split
    wasm: split.wasm
    config: {min_length: 3}
    inputs: [{from: lines, partition: rebalance}]
  - uid: count
    wasm: count.wasm
    inputs: [{from: split, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: count}]
`, n, words)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	var want []string
	for k := 0; k < words; k++ {
		want = append(want, fmt.Sprintf("word%d %d", k, n/words), fmt.Sprintf("other%d %d", k, n/words))
	}
	sp := stopWithSavepoint(t, dir, "job.yaml")
	if got := committedLines(t, filepath.Join(dir, "out")); len(got) != 0 {
		t.Fatalf("counts emitted before the end of the input: %d lines", len(got))
	}
	resumeExactlyOnce(t, dir, "job.yaml", sp, want, "3", "1")
}

// TestStopMessages: Ctrl-C on a checkpointed job stops it with a savepoint
// and says so once: no "streamd: canceled" after a savepoint that
// succeeded, and "resume with" only when the savepoint can be resumed
// (not after --drain, which ended the input).
func TestStopMessages(t *testing.T) {
	for _, drain := range []bool{false, true} {
		t.Run(fmt.Sprintf("drain=%t", drain), func(t *testing.T) {
			dir := t.TempDir()
			foreverJob(t, dir, "checkpoint: {interval: 50ms, dir: chk}\n")
			args := []string{"run", "--progress", "off", "job.yaml"}
			if drain {
				args = append(args, "--drain")
			}
			cmd, errb := start(t, dir, args...)
			waitFor(t, "a completed checkpoint", errb, func() bool { return completedCheckpoints(filepath.Join(dir, "chk")) >= 1 })
			must(t, cmd.Process.Signal(syscall.SIGINT))
			cmd.Wait()
			stderr := errb.String()
			if cmd.ProcessState.ExitCode() != 130 || !savepointRE.MatchString(stderr) {
				t.Fatalf("exit %d, want 130 and a savepoint\nstderr:\n%s", cmd.ProcessState.ExitCode(), stderr)
			}
			if strings.Contains(stderr, "streamd: canceled") {
				t.Errorf("a stop with a savepoint says canceled:\n%s", stderr)
			}
			if got := strings.Contains(stderr, "resume with"); got == drain {
				t.Errorf("drain=%t: says \"resume with\": %t\n%s", drain, got, stderr)
			}
		})
	}
}
