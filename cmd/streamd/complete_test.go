package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/natstest"
)

// complete runs the hidden __complete command in-process, as the shell
// scripts do, and returns the completions it printed, its directive, and
// its standard error.
func complete(t *testing.T, args ...string) ([]string, cobra.ShellCompDirective, string) {
	t.Helper()
	code, _, out, errs := invoke(t, append([]string{cobra.ShellCompRequestCmd}, args...)...)
	if code != 0 {
		t.Fatalf("__complete %q: exit %d: %s", args, code, errs)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	last := lines[len(lines)-1]
	d, err := strconv.Atoi(strings.TrimPrefix(last, ":"))
	if !strings.HasPrefix(last, ":") || err != nil {
		t.Fatalf("__complete %q: no directive at the end of %q", args, out)
	}
	return lines[:len(lines)-1], cobra.ShellCompDirective(d), errs
}

func TestCompleteFiles(t *testing.T) {
	for _, cmd := range []string{"run", "deploy", "validate"} {
		got, d, _ := complete(t, cmd, "")
		if d != cobra.ShellCompDirectiveFilterFileExt || !slices.Equal(got, []string{"yaml", "yml", "wasm"}) {
			t.Errorf("%s: %q, directive %d; want yaml, yml, wasm and FilterFileExt", cmd, got, d)
		}
		// One argument only: nothing after it.
		if got, d, _ := complete(t, cmd, "job.yaml", ""); len(got) != 0 || d != cobra.ShellCompDirectiveNoFileComp {
			t.Errorf("%s job.yaml: %q, directive %d; want nothing", cmd, got, d)
		}
	}
	for _, args := range [][]string{{"inspect", ""}, {"run", "--from", ""}, {"deploy", "--from", ""},
		{"stop", "--savepoint-dir", ""}, {"savepoint", "--savepoint-dir", ""}} {
		if got, d, _ := complete(t, args...); len(got) != 0 || d != cobra.ShellCompDirectiveFilterDirs {
			t.Errorf("%q: %q, directive %d; want directories", args, got, d)
		}
	}
	if got, d, _ := complete(t, "--config-file", ""); d != cobra.ShellCompDirectiveFilterFileExt || !slices.Equal(got, []string{"yaml", "yml"}) {
		t.Errorf("--config-file: %q, directive %d", got, d)
	}
	for _, cmd := range []string{"list", "hosts", "server", "version"} {
		if got, d, _ := complete(t, cmd, ""); len(got) != 0 || d != cobra.ShellCompDirectiveNoFileComp {
			t.Errorf("%s: %q, directive %d; want nothing", cmd, got, d)
		}
	}
}

func TestCompleteJobIDs(t *testing.T) {
	srv := natstest.Server(t)
	ctl, err := cluster.StartController(natstest.Connect(t, srv.URL()), cluster.ControllerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	// A job without modules, deployed as a user would; no host runs it.
	code, _, out, errs := invoke(t, "deploy", "--nats", srv.URL(), writeDiscardJob(t))
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	cl, err := client.NewClient(natstest.Connect(t, srv.URL()))
	must(t, err)
	st, err := cl.Status(context.Background(), id)
	must(t, err)

	for _, cmd := range []string{"status", "cancel", "savepoint", "stop"} {
		got, d, errs := complete(t, cmd, "--nats", srv.URL(), "")
		want := id + "\ttabjob, " + st.State
		if d != cobra.ShellCompDirectiveNoFileComp || len(got) != 1 || !strings.HasPrefix(got[0], id+"\ttabjob, ") {
			t.Errorf("%s: %q, directive %d (stderr %q); want [%q] and NoFileComp", cmd, got, d, errs, want)
		}
	}
	// The prefix typed filters; the environment's NATS settings count too.
	t.Setenv("STREAMD_NATS_URL", srv.URL())
	if got, _, _ := complete(t, "status", id[:len(id)-1]); len(got) != 1 || !strings.HasPrefix(got[0], id+"\t") {
		t.Errorf("status %s: %q; want the job", id[:len(id)-1], got)
	}
	if got, d, _ := complete(t, "status", "nosuchjob"); len(got) != 0 || d != cobra.ShellCompDirectiveNoFileComp {
		t.Errorf("status nosuchjob: %q, directive %d; want nothing", got, d)
	}
	if got, _, _ := complete(t, "status", id, ""); len(got) != 0 {
		t.Errorf("status %s: %q; want nothing after the one JOB", id, got)
	}
}

// TestCompleteJobIDsNoController: with no controller (a NATS server without
// one, or no NATS server) completion offers nothing, prints no error, and
// gives up within the bound.
func TestCompleteJobIDsNoController(t *testing.T) {
	srv := natstest.Server(t)
	down := natstest.Server(t)
	downURL := down.URL()
	down.Shutdown()
	for _, url := range []string{srv.URL(), downURL, "nats://user@[bad"} {
		start := time.Now()
		got, d, errs := complete(t, "status", "--nats", url, "")
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%s: took %s; want < 2s", url, took)
		}
		if len(got) != 0 || d != cobra.ShellCompDirectiveNoFileComp {
			t.Errorf("%s: %q, directive %d; want nothing and NoFileComp", url, got, d)
		}
		if strings.Contains(strings.ToLower(errs), "error") || strings.Contains(errs, "streamd:") {
			t.Errorf("%s: stderr %q; want no error message", url, errs)
		}
	}
}

// TestCompleteConfig: job-id completion reads the configuration file named
// on the line, and a bad configuration file spoils no file completion.
func TestCompleteConfig(t *testing.T) {
	srv := natstest.Server(t)
	ctl, err := cluster.StartController(natstest.Connect(t, srv.URL()), cluster.ControllerOptions{})
	must(t, err)
	t.Cleanup(ctl.Close)
	code, _, out, errs := invoke(t, "deploy", "--nats", srv.URL(), writeDiscardJob(t))
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "cfg.yaml")
	must(t, os.WriteFile(cfg, []byte("nats:\n  url: "+srv.URL()+"\n"), 0o644))
	if got, _, _ := complete(t, "--config-file", cfg, "cancel", ""); len(got) != 1 || !strings.HasPrefix(got[0], id+"\t") {
		t.Errorf("cancel with --config-file: %q; want the job %s", got, id)
	}

	bad := filepath.Join(dir, "bad.yaml")
	must(t, os.WriteFile(bad, []byte("bogus: 1\n"), 0o644))
	t.Setenv("STREAMD_CONFIG_FILE", bad)
	if got, d, _ := complete(t, "run", ""); d != cobra.ShellCompDirectiveFilterFileExt || len(got) != 3 {
		t.Errorf("run with a bad config file: %q, directive %d", got, d)
	}
	if got, d, errs := complete(t, "status", "--nats", srv.URL(), ""); len(got) != 0 || d != cobra.ShellCompDirectiveNoFileComp || strings.Contains(errs, "streamd:") {
		t.Errorf("status with a bad config file: %q, directive %d, stderr %q; want nothing", got, d, errs)
	}
}

// writeDiscardJob writes a job file without modules: generator -> discard.
func writeDiscardJob(t *testing.T) string {
	t.Helper()
	job := filepath.Join(t.TempDir(), "job.yaml")
	must(t, os.WriteFile(job, []byte("name: tabjob\noperators:\n  - uid: gen\n    source: {type: generator, count: 10}\n  - uid: out\n    sink: {type: discard}\n    inputs: [gen]\n"), 0o644))
	return job
}
