package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// upgradeKeys is the number of keys of the counter tests' input.
const upgradeKeys = 5

// publishKeyed publishes records from .. to-1 to subject, record i with key
// k<i%upgradeKeys> (the Streamd-Key header), and waits for every ack.
func publishKeyed(t *testing.T, js jetstream.JetStream, subject string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		m := nats.NewMsg(subject)
		m.Header.Set("Streamd-Key", fmt.Sprintf("k%d", i%upgradeKeys))
		m.Data = fmt.Appendf(nil, "v%d", i)
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(20 * time.Second):
		t.Fatal("publishing the input timed out")
	}
}

// checkCounts checks that stream name holds every count 1..n/upgradeKeys of
// every key exactly once ("k<j>=<count>", with suffix " v2" from countv2),
// and that the counts above v2From (0: none) are countv2's and the others
// failonce's.
func checkCounts(t *testing.T, js jetstream.JetStream, name string, n, v2From int) {
	t.Helper()
	got := streamValues(t, js, name)
	var want []string
	for k := 0; k < upgradeKeys; k++ {
		for c := 1; c <= n/upgradeKeys; c++ {
			w := fmt.Sprintf("k%d=%d", k, c)
			if v2From > 0 && c > v2From {
				w += " v2"
			}
			want = append(want, w)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		lost, twice := lostAndTwice(got, want)
		t.Fatalf("output stream %s: %d counts, want %d: %d missing, %d more than once (first: %q)", name, len(got), len(want), lost, twice, got[:min(len(got), 5)])
	}
}

// deployCounter deploys failonce as a keyed counter transform from nats:events
// to nats:counts and returns its id and the output's counter.
func deployCounter(t *testing.T, env []string, js jetstream.JetStream, config ...string) (string, *outputCounter) {
	t.Helper()
	counter := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	args := []string{"deploy", counter, "--input", "nats:events", "--output", "nats:counts",
		"--config", "mode=count", "--name", "counter", "--checkpoint-interval", "200ms"}
	for _, kv := range config {
		args = append(args, "--config", kv)
	}
	out, errs, code := streamd(t, env, args...)
	if code != 0 {
		t.Fatalf("deploy: exit %d\n%s\n%s", code, out, errs)
	}
	return strings.TrimSpace(out), countOutput(t, js, "STREAMD_OUT_counts")
}

// runningCounter starts a cluster of one host (env: restart.* settings,
// say), deploys the counter there, counts n records and waits until the job
// runs; it returns the streamd environment, the JetStream client, the job
// id and its output's counter.
func runningCounter(t *testing.T, n int, env ...string) ([]string, jetstream.JetStream, string, *outputCounter, *wire.JobStatus) {
	t.Helper()
	return runningCounterWith(t, n, nil, env...)
}

// runningCounterWith is runningCounter with more config of the counter.
func runningCounterWith(t *testing.T, n int, config []string, env ...string) ([]string, jetstream.JetStream, string, *outputCounter, *wire.JobStatus) {
	t.Helper()
	tc, base, js := transformCluster(t, "h1")
	env = append(base, env...)
	id, oc := deployCounter(t, env, js, config...)
	publishKeyed(t, js, "events", 0, n)
	oc.wait(t, int64(n))
	st := tc.waitJob(id, "running", state(wire.JobRunning))
	return env, js, id, oc, st
}

// countOnAndStop counts records from .. to-1, stops the job and checks the
// counts of all to records (checkCounts).
func countOnAndStop(t *testing.T, env []string, js jetstream.JetStream, id string, oc *outputCounter, from, to, v2From int) {
	t.Helper()
	publishKeyed(t, js, "events", from, to)
	oc.wait(t, int64(to))
	if _, errs, code := streamd(t, env, "stop", id); code != 0 {
		t.Fatalf("stop: exit %d: %s", code, errs)
	}
	checkCounts(t, js, "STREAMD_OUT_counts", to, v2From)
}

// counterJobFile writes the counter transform as a job file, with module
// module as operator uid, and returns its path.
func counterJobFile(t *testing.T, uid, module string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "counter.yaml")
	job := fmt.Sprintf(`name: counter
checkpoint: {interval: 200ms, storage: jetstream}
operators:
  - uid: source
    source: {type: nats, stream: STREAMD_IN_events, subject: events}
  - uid: %s
    wasm: %s
    config: {mode: count}
    inputs: [{from: source, partition: hash}]
  - uid: sink-counts
    sink: {type: nats, subject: counts}
    inputs: [%s]
`, uid, module, uid)
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// statusJSON is streamd status --json JOB.
func statusJSON(t *testing.T, env []string, id string) wire.JobStatus {
	t.Helper()
	out, errs, code := streamd(t, env, "status", "--json", id)
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errs)
	}
	var st wire.JobStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st
}

// TestUpgradeKeepsState upgrades a keyed counter transform (failonce) to
// its second version (countv2, another module with the same state), then to
// a job file of the same operators: the job keeps its id, the new version
// counts on from the savepoint, every count is written exactly once, and
// status shows the versions.
func TestUpgradeKeepsState(t *testing.T) {
	env, js, id, oc, _ := runningCounter(t, 500)

	v2 := testwasm.Path(t, "internal/testguests/countv2/countv2.wasm")
	out, errs, code := streamd(t, env, "upgrade", id, v2)
	if code != 0 {
		t.Fatalf("upgrade: exit %d\n%s\n%s", code, out, errs)
	}
	_, sp, _ := strings.Cut(errs, "stopped with savepoint ")
	sp, _, _ = strings.Cut(sp, ";")
	if !strings.HasPrefix(sp, "jetstream://STREAMD_CHECKPOINTS/"+id+"/savepoint-") {
		t.Fatalf("upgrade's stderr names no savepoint of the job:\n%s", errs)
	}
	if want := fmt.Sprintf("job %s upgraded to version 2 (from savepoint %s)\n", id, sp); out != want {
		t.Errorf("upgrade printed %q, want %q", out, want)
	}
	publishKeyed(t, js, "events", 500, 1000)
	oc.wait(t, 1000)
	st := statusJSON(t, env, id)
	if st.State != wire.JobRunning || len(st.Versions) != 2 {
		t.Fatalf("after the upgrade: %s, versions %+v", st.State, st.Versions)
	}
	v1, v2s := st.Versions[0], st.Versions[1]
	if v1.State != wire.VersionReplaced || v2s.State != wire.VersionRunning || v2s.From != sp ||
		len(v1.Modules) != 1 || len(v2s.Modules) != 1 || v1.Modules[0].Operator != "failonce" || v2s.Modules[0].Operator != "failonce" ||
		v2s.Modules[0].Name != "countv2.wasm" || v1.Modules[0].Digest == v2s.Modules[0].Digest || !strings.HasPrefix(v2s.Modules[0].Digest, "sha256:") {
		t.Errorf("versions: %+v", st.Versions)
	}
	text, _, _ := streamd(t, env, "status", id)
	for _, want := range []string{"VERSION", "failonce=sha256:", "replaced", sp, "running"} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}

	// A job file with the same operators is the third version.
	if out, errs, code := streamd(t, env, "upgrade", id, counterJobFile(t, "failonce", v2)); code != 0 {
		t.Fatalf("upgrade to a job file: exit %d\n%s\n%s", code, out, errs)
	}
	st = statusJSON(t, env, id)
	if len(st.Versions) != 3 || st.Versions[2].State != wire.VersionRunning || !strings.HasPrefix(st.Versions[2].JobFile, "sha256:") ||
		st.Versions[2].Modules[0].Digest != v2s.Modules[0].Digest {
		t.Fatalf("after the job file upgrade: versions %+v", st.Versions)
	}
	countOnAndStop(t, env, js, id, oc, 1000, 1500, 500/upgradeKeys)
}

// TestUpgradeRollsBack upgrades the counter to a module that fails in open
// (failopen, differently each time): its restart strategy gives up, the
// controller starts the counter again from the same savepoint, upgrade says
// so and exits 1, and the counter counts on with its state intact, every
// count exactly once.
func TestUpgradeRollsBack(t *testing.T) {
	env, js, id, oc, _ := runningCounterWith(t, 300, []string{"failopen_vary=1"},
		"STREAMD_RESTART_STRATEGY=fixed-delay", "STREAMD_RESTART_ATTEMPTS=2", "STREAMD_RESTART_DELAY=100ms")

	bad := testwasm.Path(t, "internal/testguests/failopen/failopen.wasm")
	out, errs, code := streamd(t, env, "upgrade", id, bad)
	if code != 1 {
		t.Fatalf("upgrade to a module that fails in open: exit %d, want 1\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"version 2 failed: attempt ", "failopen: this version fails in open",
		"rolled back: version 1 runs again (as version 3) from savepoint jetstream://STREAMD_CHECKPOINTS/" + id + "/savepoint-"} {
		if !strings.Contains(errs, want) {
			t.Errorf("upgrade's stderr lacks %q:\n%s", want, errs)
		}
	}
	st := statusJSON(t, env, id)
	if st.State != wire.JobRunning || len(st.Versions) != 3 {
		t.Fatalf("after the rollback: %s (%s), versions %+v", st.State, st.Reason, st.Versions)
	}
	v1, v2, v3 := st.Versions[0], st.Versions[1], st.Versions[2]
	if v1.State != wire.VersionReplaced || v2.State != wire.VersionRolledBack || !strings.Contains(v2.Reason, "fails in open") ||
		v3.State != wire.VersionRunning || v3.Rerun != 1 || v3.From != v2.From || v3.Modules[0].Digest != v1.Modules[0].Digest {
		t.Errorf("versions: %+v", st.Versions)
	}
	text, _, _ := streamd(t, env, "status", id)
	for _, want := range []string{"rolled back\n", "running (version 1 again)\n", "version 2 rolled back: attempt "} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	countOnAndStop(t, env, js, id, oc, 300, 600, 0)
}

// TestUpgradeRefused: a module that is not one, an unknown job, an
// operator the job does not have, a job file whose operator uids do not
// match the job's state, and a job that is not running are refused, and the
// running job goes on untouched.
func TestUpgradeRefused(t *testing.T) {
	env, js, id, oc, before := runningCounter(t, 100)

	bad := filepath.Join(t.TempDir(), "bad.wasm")
	if err := os.WriteFile(bad, []byte("not a module"), 0o644); err != nil {
		t.Fatal(err)
	}
	v2 := testwasm.Path(t, "internal/testguests/countv2/countv2.wasm")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"upgrade", id, bad}, "streamd: module " + bad + ": "},
		{[]string{"upgrade", "nosuch-12345678", v2}, `streamd: cluster: no job "nosuch-12345678"`},
		{[]string{"upgrade", id, v2, "--operator", "nosuch"}, `the job has no wasm operator "nosuch" (its wasm operators: failonce)`},
		{[]string{"upgrade", id, counterJobFile(t, "renamed", v2)}, `the new version cannot restore the job's latest checkpoint, so the job was not stopped: checkpoint: restore from checkpoint `},
	} {
		out, errs, code := streamd(t, env, tt.args...)
		if code != 1 || !strings.Contains(errs, tt.want) {
			t.Errorf("%v: exit %d, want 1 with %q\n%s\n%s", tt.args, code, tt.want, out, errs)
		}
	}
	st := statusJSON(t, env, id)
	if st.State != wire.JobRunning || st.Attempt != before.Attempt || len(st.Versions) != 0 {
		t.Fatalf("after refused upgrades: %s, attempt %d (was %d), versions %+v", st.State, st.Attempt, before.Attempt, st.Versions)
	}
	countOnAndStop(t, env, js, id, oc, 100, 200, 0)
	out, errs, code := streamd(t, env, "upgrade", id, v2)
	if want := "the job is stopped, not running"; code != 1 || !strings.Contains(errs, want) {
		t.Errorf("upgrade of a stopped job: exit %d, want 1 with %q\n%s\n%s", code, want, out, errs)
	}
}

// TestUpgradeRollsBackAfterTimeout: under the transform's default restart
// strategy (exponential-delay, unlimited) a module that fails in open, each
// time differently (failopen_vary), never makes the job fail; the
// controller rolls it back when it does not run within --timeout, and the
// counter runs on from the savepoint.
func TestUpgradeRollsBackAfterTimeout(t *testing.T) {
	env, js, id, oc, _ := runningCounterWith(t, 100, []string{"failopen_vary=1"})

	bad := testwasm.Path(t, "internal/testguests/failopen/failopen.wasm")
	// 10s: long enough for the first attempts to fail in open on a loaded
	// machine, so the report names the last failure.
	out, errs, code := streamd(t, env, "upgrade", id, bad, "--timeout", "10s")
	if want := "version 2 failed: not running 10s after it started (the last failure: attempt "; code != 1 || !strings.Contains(errs, want) || !strings.Contains(errs, "rolled back: version 1 runs again (as version 3)") {
		t.Fatalf("upgrade: exit %d, want 1 with %q and the rollback\n%s\n%s", code, want, out, errs)
	}
	st := statusJSON(t, env, id)
	if st.State != wire.JobRunning || len(st.Versions) != 3 || st.Versions[2].State != wire.VersionRunning {
		t.Fatalf("after the rollback: %s (%s), versions %+v", st.State, st.Reason, st.Versions)
	}
	countOnAndStop(t, env, js, id, oc, 100, 200, 0)
}

// TestUpgradeRollbackSurvivesLeaderChange: the leading controller is killed
// while the version an upgrade started fails in open; the standby that takes
// over has the upgrade in the job's record and rolls it back at its deadline.
func TestUpgradeRollbackSurvivesLeaderChange(t *testing.T) {
	hc := newHACluster(t, 2)
	co, err := natsutil.NewConnectOptions(natsutil.URLs(hc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	hc.addHostOpts("h1", 2, func(o *agent.HostOptions) {
		o.HeartbeatInterval = haInterval
		o.Executor = &agent.LocalExecutor{Engine: hc.engine, NATS: co}
	})
	hc.waitHosts(1)
	js, err := jetstream.New(connect(t, hc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"STREAMD_NATS_URL=" + hc.srv.URL()}
	id, oc := deployCounter(t, env, js, "failopen_vary=1") // no two failures alike: only the deadline rolls it back
	publishKeyed(t, js, "events", 0, 100)
	oc.wait(t, 100)
	hc.waitJob(id, "running", state(wire.JobRunning))

	bad := testwasm.Path(t, "internal/testguests/failopen/failopen.wasm")
	rep, err := hc.client.Upgrade(context.Background(), id, nil, "", bad, "", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := hc.leader()
	old.kill()
	hc.waitLeader(old, 3*haInterval)
	st := hc.waitJob(id, "rolled back and running", func(st *wire.JobStatus) bool {
		n := len(st.Versions)
		return wire.TerminalJobState(st.State) || n == 3 && st.Versions[2].State == wire.VersionRunning
	})
	if st.State != wire.JobRunning || len(st.Versions) != 3 || st.Versions[rep.Version-1].State != wire.VersionRolledBack ||
		!strings.Contains(st.Versions[rep.Version-1].Reason, "not running 3s after it started") {
		t.Fatalf("after the takeover: %s (%s), versions %+v", st.State, st.Reason, st.Versions)
	}
	countOnAndStop(t, env, js, id, oc, 100, 200, 0)
}

// TestUpgradeRestartingJob: a transform that restarts on a poison record
// cannot take a savepoint, so upgrade cancels its attempt and starts the new
// module from the job's latest checkpoint, says so, and the output holds
// every record exactly once: those committed before as the old module wrote
// them, the rest as the new one does.
func TestUpgradeRestartingJob(t *testing.T) {
	tc, env, js := transformCluster(t, "h1")
	env = append(env, "STREAMD_RESTART_STRATEGY=fixed-delay", "STREAMD_RESTART_ATTEMPTS=1000", "STREAMD_RESTART_DELAY=100ms")
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	out, errs, code := streamd(t, env, "deploy", mod, "--input", "nats:raw", "--output", "nats:clean", "--name", "poisoned",
		"--config", "poison=value-50", "--checkpoint-interval", "200ms")
	if code != 0 {
		t.Fatalf("deploy: exit %d\n%s\n%s", code, out, errs)
	}
	id := strings.TrimSpace(out)
	oc := countOutput(t, js, "STREAMD_OUT_clean")
	publishValues(t, js, "raw", 0, 50)
	oc.wait(t, 50)
	publishValues(t, js, "raw", 50, 100)
	tc.waitJob(id, "restarting on the poison record", func(st *wire.JobStatus) bool { return st.Attempt >= 2 })

	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	out, errs, code = streamd(t, env, "upgrade", id, upper)
	if code != 0 {
		t.Fatalf("upgrade of a restarting job: exit %d\n%s\n%s", code, out, errs)
	}
	// Between two failures an attempt may run long enough for the stop's
	// savepoint to complete (before the source replays the poison
	// record): then version 2 starts from that savepoint, else from the
	// latest checkpoint. Either way each record is in the output once.
	fromCheckpoint := "did not run (it restarted or waited for slots): its attempt was canceled; starting version 2 from checkpoint jetstream://STREAMD_CHECKPOINTS/" + id + "/chk-"
	fromSavepoint := "job " + id + " stopped with savepoint jetstream://STREAMD_CHECKPOINTS/" + id + "/savepoint-"
	switch {
	case strings.Contains(errs, fromCheckpoint):
		if !strings.Contains(out, "job "+id+" upgraded to version 2 (from checkpoint jetstream://") {
			t.Errorf("upgrade's stdout: %q", out)
		}
	case strings.Contains(errs, fromSavepoint):
		if !strings.Contains(out, "job "+id+" upgraded to version 2 (from savepoint jetstream://") {
			t.Errorf("upgrade's stdout: %q", out)
		}
	default:
		t.Errorf("upgrade's stderr has neither %q nor %q:\n%s", fromCheckpoint, fromSavepoint, errs)
	}
	oc.wait(t, 100)
	st := statusJSON(t, env, id)
	if st.State != wire.JobRunning || len(st.Versions) != 2 || st.Versions[0].State != wire.VersionReplaced || st.Versions[1].State != wire.VersionRunning {
		t.Fatalf("after the upgrade: %s (%s), versions %+v", st.State, st.Reason, st.Versions)
	}
	if _, errs, code := streamd(t, env, "stop", id); code != 0 {
		t.Fatalf("stop: exit %d: %s", code, errs)
	}
	// Each record once: lower case up to the checkpoint, upper case after.
	seen := map[int]int{}
	for _, v := range streamValues(t, js, "STREAMD_OUT_clean") {
		var i int
		if _, err := fmt.Sscanf(strings.ToLower(v), "value-%d", &i); err != nil {
			t.Fatalf("output %q", v)
		}
		seen[i]++
		if i >= 50 && v != strings.ToUpper(v) {
			t.Errorf("%q: written by the old module after the poison record", v)
		}
	}
	for i := 0; i < 100; i++ {
		if seen[i] != 1 {
			t.Errorf("value-%d in the output %d times, want once", i, seen[i])
		}
	}
}

// TestUpgradeRollsBackOnRepeatedOpenFailure: under the transform's default
// restart strategy (unlimited), a new version whose attempts fail in open
// twice in a row with the same error is rolled back at once, long before
// its --timeout, and upgrade says why.
func TestUpgradeRollsBackOnRepeatedOpenFailure(t *testing.T) {
	env, js, id, oc, _ := runningCounter(t, 100)
	bad := testwasm.Path(t, "internal/testguests/failopen/failopen.wasm")
	start := time.Now()
	out, errs, code := streamd(t, env, "upgrade", id, bad, "--timeout", "10m")
	took := time.Since(start)
	if want := "version 2 failed: its attempts failed in open 2 times in a row the same way: "; code != 1 || !strings.Contains(errs, want) ||
		!strings.Contains(errs, "failopen: this version fails in open") || !strings.Contains(errs, "rolled back: version 1 runs again (as version 3)") {
		t.Fatalf("upgrade: exit %d after %s, want 1 with %q and the rollback\n%s\n%s", code, took, want, out, errs)
	}
	t.Logf("rolled back after %s (--timeout 10m)", took.Round(time.Millisecond))
	countOnAndStop(t, env, js, id, oc, 100, 200, 0)
}
