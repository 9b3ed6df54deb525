package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// newestCheckpointID is the highest id of a chk-<id> with _metadata in dir
// (0: none).
func newestCheckpointID(dir string) int64 {
	m, _ := filepath.Glob(filepath.Join(dir, "chk-*", "_metadata"))
	var newest int64
	for _, p := range m {
		id, err := strconv.ParseInt(strings.TrimPrefix(filepath.Base(filepath.Dir(p)), "chk-"), 10, 64)
		if err == nil && id > newest {
			newest = id
		}
	}
	return newest
}

var savepointIDRE = regexp.MustCompile(`savepoint-(\d+)-[^/]*$`)

// TestResumeFromDirAfterSavepoint is the README's flow: streamd run, Ctrl-C
// (a stop-with-savepoint written into the checkpoint directory, newer than
// its checkpoints), then streamd run --from the checkpoint directory. The
// directory stands for the savepoint, so the file sink's output is every
// record exactly once; before, it stood for the older chk-N and the
// records the savepoint committed after it came out twice. Restoring that
// older chk-N by its path still works, with a warning naming both.
func TestResumeFromDirAfterSavepoint(t *testing.T) {
	dir := t.TempDir()
	const n = 8000
	// Only built-in connectors: the generator (throttled, released every
	// 10ms) and the exactly-once file sink. retain 5 keeps chk-N after the
	// savepoint for the explicit restore below. The interval leaves the
	// stop room to come between two checkpoints on a loaded machine.
	job := fmt.Sprintf(`name: fromdir
parallelism: 2
checkpoint: {interval: 500ms, dir: chk, retain: 5}
operators:
  - uid: gen
    parallelism: 1
    source: {type: generator, count: %d, rate: 2000, value: "v-{n}"}
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: gen, partition: rebalance}]
`, n)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	var want []string
	for i := 0; i < n; i++ {
		want = append(want, fmt.Sprintf("v-%d", i))
	}

	cmd, errb := start(t, dir, "run", "--progress", "off", "job.yaml")
	waitFor(t, "a completed checkpoint and its committed output", errb, func() bool {
		return completedCheckpoints(filepath.Join(dir, "chk")) >= 1 && len(committedLinesQuiet(filepath.Join(dir, "out"))) > 0
	})
	must(t, cmd.Process.Signal(syscall.SIGINT))
	err := cmd.Wait()
	m := savepointRE.FindStringSubmatch(errb.String())
	if m == nil || cmd.ProcessState.ExitCode() != 130 {
		t.Fatalf("SIGINT: exit %d (%v), want 130 and a savepoint path\nstderr:\n%s", cmd.ProcessState.ExitCode(), err, errb.String())
	}
	spMatch := savepointIDRE.FindStringSubmatch(m[1])
	if spMatch == nil {
		t.Fatalf("savepoint path %s: want .../savepoint-ID-SUFFIX", m[1])
	}
	spID, _ := strconv.ParseInt(spMatch[1], 10, 64)
	spName := filepath.Base(m[1])
	if _, err := os.Stat(filepath.Join(dir, "chk", spName, "_metadata")); err != nil {
		t.Fatalf("the savepoint is not in the checkpoint directory: %v", err)
	}
	chkID := newestCheckpointID(filepath.Join(dir, "chk"))
	if chkID == 0 || chkID >= spID {
		t.Fatalf("checkpoint directory: newest chk-%d, savepoint %d; want a checkpoint older than the savepoint", chkID, spID)
	}
	stopped := committedLines(t, filepath.Join(dir, "out"))
	if len(stopped) >= n {
		t.Fatalf("the job finished before SIGINT (%d lines)", len(stopped))
	}
	// The precondition of the bug: the savepoint committed records that
	// chk-N had not (restoring chk-N writes them again).
	atSavepoint, _ := filepath.Glob(filepath.Join(dir, "out", fmt.Sprintf("part-*-%d", spID)))
	if len(atSavepoint) == 0 {
		t.Fatalf("the savepoint %d committed no output after checkpoint %d: nothing to duplicate", spID, chkID)
	}

	// inspect of the directory shows what --from the directory restores.
	ins := run(t, dir, "", "inspect", "--json", "chk")
	if ins.code != 0 {
		t.Fatalf("inspect chk: exit %d\nstderr:\n%s", ins.code, ins.stderr)
	}
	var meta struct {
		ID   int64  `json:"id"`
		Kind string `json:"kind"`
		Path string `json:"path"`
	}
	must(t, json.Unmarshal([]byte(ins.stdout), &meta))
	if meta.ID != spID || meta.Kind != "savepoint" || filepath.Base(meta.Path) != spName {
		t.Fatalf("inspect chk = %s %d at %s, want savepoint %d (%s)", meta.Kind, meta.ID, meta.Path, spID, spName)
	}

	// A copy of this state for the explicit restore of the older chk-N.
	older := filepath.Join(t.TempDir(), "copy")
	must(t, os.CopyFS(older, os.DirFS(dir)))

	// --from the directory: the savepoint, every record exactly once.
	r := run(t, dir, "", "run", "--progress", "off", "job.yaml", "--from", "chk")
	if r.code != 0 {
		t.Fatalf("resume --from chk: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "kind=savepoint id="+strconv.FormatInt(spID, 10)) || strings.Contains(r.stderr, "beside it is newer") {
		t.Errorf("resume --from chk: want a restore of savepoint %d without a warning\nstderr:\n%s", spID, r.stderr)
	}
	exactlyOnce(t, committedLines(t, filepath.Join(dir, "out")), append([]string(nil), want...))

	// --from chk/chk-N names the older checkpoint: it is restored, with a
	// warning naming both, and what the savepoint committed comes twice.
	chkPath := filepath.Join("chk", fmt.Sprintf("chk-%d", chkID))
	r = run(t, older, "", "run", "--progress", "off", "job.yaml", "--from", chkPath)
	if r.code != 0 {
		t.Fatalf("resume --from %s: exit %d\nstderr:\n%s", chkPath, r.code, r.stderr)
	}
	for _, w := range []string{
		fmt.Sprintf("restoring checkpoint %d, but savepoint %d beside it is newer: the output committed after checkpoint %d will be written again", chkID, spID, chkID),
		"from=" + chkPath,
		"newer=" + filepath.Join("chk", spName),
	} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("resume --from %s: stderr lacks %q\nstderr:\n%s", chkPath, w, r.stderr)
		}
	}
	count := map[string]int{}
	twice := 0
	for _, l := range committedLines(t, filepath.Join(older, "out")) {
		if count[l]++; count[l] == 2 {
			twice++
		}
	}
	if twice == 0 {
		t.Errorf("restoring checkpoint %d wrote nothing twice: the warning would be wrong", chkID)
	}
}
