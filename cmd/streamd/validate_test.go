package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/jobfile"
)

// TestPrintGraphRestart checks the restart line of `streamd validate` for
// every strategy.
func TestPrintGraphRestart(t *testing.T) {
	const ops = "operators:\n  - uid: gen\n    source: {type: generator, count: 1}\n  - uid: out\n    sink: {type: discard}\n    inputs: [gen]\n"
	for _, tt := range []struct{ sections, want string }{
		{"", "restart: none\n"},
		{"checkpoint: {interval: 1s}\n", "restart: exponential-delay, initial delay 1s, max delay 1m0s, multiplier 1.5, jitter 0.1, reset after 1h0m0s, unlimited attempts\n"},
		{"restart: {strategy: fixed-delay, attempts: 2, delay: 500ms}\n", "restart: fixed-delay, 2 attempts, delay 500ms\n"},
		{"restart: {strategy: failure-rate, max_failures: 3, failure_interval: 5m, delay: 2s}\n", "restart: failure-rate, fails after more than 3 failures within 5m0s, delay 2s\n"},
		{"restart: {strategy: exponential-delay, attempts: 4, jitter: 0}\n", "restart: exponential-delay, initial delay 1s, max delay 1m0s, multiplier 1.5, jitter 0, reset after 1h0m0s, 4 attempts between resets\n"},
	} {
		job, err := jobfile.ParseJob([]byte("name: j\n"+tt.sections+ops), t.TempDir(), jobfile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		printGraph(&b, job)
		if !strings.HasSuffix(b.String(), tt.want) {
			t.Errorf("%q: printGraph ends\n%s\nwant %q", tt.sections, b.String(), tt.want)
		}
	}
}

// TestPrintGraphCheckpointStorage: validate says where checkpoints go, a
// directory or the JetStream object store, never a local directory for a
// job whose checkpoints go to JetStream.
func TestPrintGraphCheckpointStorage(t *testing.T) {
	const ops = "operators:\n  - uid: gen\n    source: {type: generator, count: 1}\n  - uid: out\n    sink: {type: discard}\n    inputs: [gen]\n"
	dir := t.TempDir()
	for _, tt := range []struct{ section, want, not string }{
		{"checkpoint: {interval: 1s, dir: chk}\n", "checkpoint: every 1s into " + dir + "/chk (retain 1", "JetStream"},
		{"checkpoint: {interval: 1s, storage: jetstream}\n", "checkpoint: every 1s into jetstream://STREAMD_CHECKPOINTS/j/ (retain 1", dir},
		{"checkpoint: {interval: 1s, storage: jetstream, bucket: B_1}\n", "checkpoint: every 1s into jetstream://B_1/j/ (retain 1", dir},
	} {
		job, err := jobfile.ParseJob([]byte("name: j\n"+tt.section+ops), dir, jobfile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		printGraph(&b, job)
		if !strings.Contains(b.String(), tt.want) || strings.Contains(b.String(), tt.not) {
			t.Errorf("%q: printGraph says\n%s\nwant %q, not %q", tt.section, b.String(), tt.want, tt.not)
		}
	}
}

// TestValidateJSON: validate --json prints the graph of a valid job, and
// every problem of an invalid one (with exit status 1, the text on stderr).
func TestValidateJSON(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(good, []byte("name: j\ncheckpoint: {interval: 2s}\noperators:\n  - uid: gen\n    source: {type: generator, count: 1}\n  - uid: out\n    sink: {type: discard}\n    inputs: [{from: gen, partition: rebalance}]\n"), 0o644))
	must(os.WriteFile(bad, []byte("name: j\noperators:\n  - uid: gen\n    source: {type: generatr}\n  - uid: out\n    sink: {type: discard}\n    inputs: [gne]\n"), 0o644))
	code, _, out, errs := invoke(t, "validate", "--json", good)
	var v validationJ
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || !v.Valid || v.Job != "j" || len(v.Operators) != 2 ||
		v.Operators[1].Inputs[0] != (inputJ{From: "gen", Partition: "rebalance"}) || v.Checkpoint == nil || v.Checkpoint.Interval != "2s" {
		t.Fatalf("validate --json good.yaml: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	code, _, out, errs = invoke(t, "validate", "--json", bad)
	v = validationJ{}
	if code != 1 || json.Unmarshal([]byte(out), &v) != nil || v.Valid || len(v.Problems) != 2 ||
		v.Problems[0].Line != 4 || v.Problems[0].Field != "source.type" || !strings.Contains(v.Problems[0].Message, `unknown source type "generatr"`) ||
		v.Problems[1].Operator != "out" || !strings.Contains(errs, "unknown operator") {
		t.Fatalf("validate --json bad.yaml: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	code, _, out, _ = invoke(t, "version", "--json")
	var b buildInfo
	if code != 0 || json.Unmarshal([]byte(out), &b) != nil || b.ABI != 1 || b.Go == "" || b.Version == "" {
		t.Fatalf("version --json: exit %d: %s", code, out)
	}
}
