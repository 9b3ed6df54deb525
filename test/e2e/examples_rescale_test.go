package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// windowExamples are the examples whose operators keep windows, joins and
// timers in keyed state: each runs in TestExampleJobs at p=1 and p=4, and
// here through a savepoint and a rescale.
var windowExamples = []struct {
	name, job string
	inputs    []string
}{
	{"topn-rust", "topn.yaml", []string{"input.jsonl"}},
	{"sessionize", "job.yaml", []string{"input.jsonl"}},
	{"interval-join", "job.yaml", []string{"orders.jsonl", "shipments.jsonl"}},
}

// TestExampleSavepointRescale stops each window example half way through
// its input with a savepoint (Ctrl-C) at parallelism 2, resumes it from the
// savepoint at 4 and, separately, at 1, and checks that what the stopped
// run committed plus what the resumed run wrote is expected.txt exactly
// once: open windows, sessions, join buffers and timers move to the
// subtasks that own their keys.
//
// The first run reads each input from a named pipe that the test fills
// with the first half of the file's lines and keeps open, so the job is
// mid-stream when it stops; the resumed runs read the whole files from the
// savepoint's positions (the same bytes: the pipes carried the files' first
// lines).
func TestExampleSavepointRescale(t *testing.T) {
	for _, ex := range windowExamples {
		t.Run(ex.name, func(t *testing.T) {
			dir := example(t, ex.name, ex.job)
			jobPath := filepath.Join(dir, ex.job)
			job, err := os.ReadFile(jobPath)
			must(t, err)
			must(t, os.WriteFile(jobPath, append(job, []byte("\ncheckpoint: {interval: 50ms, dir: chk}\n")...), 0o644))
			want := readLines(t, filepath.Join(dir, "expected.txt"))
			full := map[string][]byte{}
			for _, in := range ex.inputs {
				path := filepath.Join(dir, in)
				b, err := os.ReadFile(path)
				must(t, err)
				full[path] = b
				lines := splitLines(string(b))
				must(t, os.Remove(path))
				must(t, syscall.Mkfifo(path, 0o644))
				// O_RDWR does not wait for the reader, and keeps the pipe
				// open (no end of input) while the job reads it.
				pipe, err := os.OpenFile(path, os.O_RDWR, 0)
				must(t, err)
				defer pipe.Close()
				_, err = pipe.WriteString(strings.Join(lines[:len(lines)/2], "\n") + "\n")
				must(t, err)
			}

			cmd, errb := start(t, dir, "run", "--progress", "off", "-p", "2", ex.job)
			chk := filepath.Join(dir, "chk")
			// Two checkpoints after the start: the first half is read (the
			// pipe holds nothing more) well before the second completes.
			waitFor(t, "two completed checkpoints", errb, func() bool { return completedCheckpoints(chk) >= 2 })
			must(t, cmd.Process.Signal(syscall.SIGINT))
			werr := cmd.Wait()
			m := savepointRE.FindStringSubmatch(errb.String())
			if m == nil || cmd.ProcessState.ExitCode() != 130 {
				t.Fatalf("no savepoint after SIGINT (exit %d, %v)\nstderr:\n%s", cmd.ProcessState.ExitCode(), werr, errb.String())
			}
			sp := m[1]
			before := committedLines(t, filepath.Join(dir, "out"))
			for path, b := range full {
				must(t, os.Remove(path))
				must(t, os.WriteFile(path, b, 0o644))
			}
			for _, p := range []string{"4", "1"} {
				must(t, os.RemoveAll(filepath.Join(dir, "out")))
				r := run(t, dir, "", "run", "--progress", "off", "-p", p, ex.job, "--from", sp)
				if r.code != 0 {
					t.Fatalf("resume at p=%s: exit %d\nstderr:\n%s", p, r.code, r.stderr)
				}
				after := committedLines(t, filepath.Join(dir, "out"))
				t.Logf("p=%s: %d lines before the savepoint, %d after", p, len(before), len(after))
				exactlyOnce(t, append(append([]string(nil), before...), after...), append([]string(nil), want...))
			}
		})
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return splitLines(string(b))
}
