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

// TestCheckpointsDuringDrain: generator -> slow wasm (3 ms a record) -> file
// sink, p=1, a 100 ms checkpoint interval, small channels. Once the
// generator has sent its EndOfData, its records are still queued at the
// slow stage for about two seconds; checkpoints keep completing meanwhile
// (FLIP-147), in both modes: unaligned (the barrier overtakes the queued
// records and the EndOfData, which become channel state) and aligned with
// an aligned timeout (the barrier queued behind them is announced, its
// alignment times out, and it goes unaligned). streamd run is killed during
// the drain, after three such checkpoints, and resumed from the checkpoint
// directory: every record comes out exactly once, the drain's in-flight
// records replayed from the channel state.
func TestCheckpointsDuringDrain(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	// 64 batches of 10 records queue 640 records at the slow stage: a
	// drain of at least 2 s at 3 ms a record.
	const n = 1200
	for name, mode := range map[string]string{"unaligned": "mode: unaligned", "aligned-timeout": "mode: aligned, aligned_timeout: 20ms"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			job := fmt.Sprintf(`name: drain
checkpoint: {interval: 100ms, dir: chk, %s}
operators:
  - uid: gen
    source: {type: generator, count: %d, value: "v-{n}"}
  - uid: slow
    wasm: %s
    allow_clock: true
    config: {sleep_us: 3000}
    inputs: [gen]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [slow]
`, mode, n, mod)
			must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
			args := []string{"run", "--progress", "off", "--log-level", "debug", "--batch-size", "10", "--channel-capacity", "64", "job.yaml"}
			cmd, errb := start(t, dir, args...)
			const genEOD, slowEOD = `msg="end of data sent" job=drain operator=gen`, `msg="end of data sent" job=drain operator=slow`
			during := func() int { // checkpoints completed since the generator's EndOfData
				s := errb.String()
				i := strings.Index(s, genEOD)
				if i < 0 {
					return 0
				}
				return strings.Count(s[i:], `msg="checkpoint complete"`)
			}
			waitFor(t, "three checkpoints completed after the generator's end of data", errb, func() bool {
				return during() >= 3 || strings.Contains(errb.String(), slowEOD)
			})
			must(t, cmd.Process.Signal(syscall.SIGKILL))
			cmd.Wait()
			stderr := errb.String()
			if k := strings.Index(stderr, slowEOD); k >= 0 {
				i := strings.Index(stderr, genEOD)
				t.Fatalf("the slow stage processed its last record after %d checkpoints completed during the drain, want >= 3\nstderr:\n%s",
					strings.Count(stderr[i:k], `msg="checkpoint complete"`), stderr)
			}
			if got := len(committedLines(t, filepath.Join(dir, "out"))); got >= n {
				t.Fatalf("all %d records were committed before the kill", got)
			}
			r := run(t, dir, "", "run", "--progress", "off", "job.yaml", "--from", "chk")
			if r.code != 0 {
				t.Fatalf("resume: exit %d\nstderr:\n%s", r.code, r.stderr)
			}
			want := make([]string, n)
			for i := range want {
				want[i] = fmt.Sprintf("v-%d", i)
			}
			exactlyOnce(t, committedLines(t, filepath.Join(dir, "out")), want)
		})
	}
}
