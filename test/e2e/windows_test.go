package e2e

// End-to-end runs of the sessionize example beyond TestExampleJobs: its late
// output, and open sessions through a savepoint and a rescale.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// TestSessionizeLateOutput runs the sessionize example at parallelism 1 and
// 4 and checks both of its outputs: the sessions (out/) and the late views
// that reached the side output sessions.late (late/).
func TestSessionizeLateOutput(t *testing.T) {
	for _, p := range []int{1, 4} {
		t.Run(fmt.Sprintf("p%d", p), func(t *testing.T) {
			dir := example(t, "sessionize", "job.yaml")
			r := run(t, dir, "", "run", "--parallelism", fmt.Sprint(p), "--progress", "off", "job.yaml")
			if r.code != 0 {
				t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
			}
			for out, exp := range map[string]string{"out": "expected.txt", "late": "expected-late.txt"} {
				b, err := os.ReadFile(filepath.Join(dir, exp))
				must(t, err)
				diffLines(t, out, sorted(outputLines(t, filepath.Join(dir, out))), sorted(splitLines(string(b))))
			}
		})
	}
}

// TestSessionizeRescale: sessions of a generated stream (user u<k> views at
// n*10 ms for n = k mod 20), stopped with Ctrl-C (a savepoint without drain)
// while the sessions are open, resumed from the savepoint at parallelism 3
// and at 1: every user's session comes out once, with all its views.
func TestSessionizeRescale(t *testing.T) {
	dir := example(t, "sessionize", "job.yaml")
	const n, users, step = 20000, 20, 10
	job := fmt.Sprintf(`name: sessionize-rescale
parallelism: 2
checkpoint: {interval: 50ms, dir: chk}
operators:
  - uid: views
    parallelism: 1
    source: {type: generator, count: %d, rate: 10000, key: "", value: '{"user":"u{k}","page":"/p{n}"}', keys: %d, start_ts: 0, ts_step: %d}
  - uid: keyby
    parallelism: 1
    wasm: keyby.wasm
    config: {key: user, max_out_of_orderness: 0s}
    inputs: [{from: views, partition: forward}]
  - uid: sessions
    wasm: sessionize.wasm
    config: {gap: 1s, allowed_lateness: 0s}
    inputs: [{from: keyby, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: sessions}]
  - uid: late
    sink: {type: file, path: late/}
    inputs: [{from: sessions.late}]
`, n, users, step)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	var want []string
	for k := 0; k < users; k++ {
		last := int64((n - users + k) * step) // the last n with n mod users == k
		b, err := json.Marshal(struct {       // the field order of sessionize's output
			User  string `json:"user"`
			Start int64  `json:"start"`
			End   int64  `json:"end"`
			Views int    `json:"views"`
		}{fmt.Sprintf("u%d", k), int64(k * step), last + 1000, n / users})
		must(t, err)
		want = append(want, string(b))
	}
	sort.Strings(want)
	sp := stopWithSavepoint(t, dir, "job.yaml")
	resumeExactlyOnce(t, dir, "job.yaml", sp, want, "3", "1")
}
