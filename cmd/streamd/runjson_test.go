package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunJSON: run --json prints the job's result on stdout when it ends,
// finished or failed (with the exit status as without it), and refuses a
// job whose sink writes to stdout.
func TestRunJSON(t *testing.T) {
	dir := t.TempDir()
	write := func(name, sink string) string {
		p := filepath.Join(dir, name)
		job := "name: j\noperators:\n  - uid: gen\n    source: {type: generator, count: 300}\n  - uid: out\n    sink: " + sink + "\n    inputs: [gen]\n"
		if err := os.WriteFile(p, []byte(job), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	code, _, out, errs := invoke(t, "run", "--json", "--progress", "off", write("ok.yaml", "{type: discard}"))
	var r runResult
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.State != "finished" || r.Job != "j" || len(r.Operators) != 2 ||
		r.Operators[0].RecordsOut != 300 || r.Operators[1].RecordsIn != 300 || r.Error != "" {
		t.Fatalf("run --json: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	code, _, out, errs = invoke(t, "run", "--json", "--progress", "off", write("bad.yaml", "{type: file, path: /proc/streamd-run-json}"))
	r = runResult{}
	if code != 1 || json.Unmarshal([]byte(out), &r) != nil || r.State != "failed" || !strings.Contains(r.Error, "/proc/streamd-run-json") {
		t.Fatalf("run --json of a failing job: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	code, _, out, errs = invoke(t, "run", "--json", write("stdout.yaml", "{type: stdout}"))
	if code != 2 || out != "" || !strings.Contains(errs, `--json prints the result on standard output, where the sink "out" writes`) {
		t.Fatalf("run --json with a stdout sink: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
}
