package cluster_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

// TestDeployFromSavepointJetStream stops a job whose checkpoints live in the
// JetStream object store with a savepoint (a jetstream:// location), then
// deploys the same job file with streamd deploy --from that savepoint: the
// output of both deployments together is that of an uninterrupted run. Once
// spread over two hosts (the controller drives the savepoint and the
// restore), once on one host.
func TestDeployFromSavepointJetStream(t *testing.T) {
	for _, tt := range []struct {
		name  string
		slots []int
		hosts int
	}{{"spread", []int{2, 2}, 2}, {"one-host", []int{4}, 1}} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newCluster(t, tt.slots...)
			const n = 12000
			path := spreadJob(t, n, 3000, 4, "checkpoint: {interval: 300ms, dir: chk, storage: jetstream}\n")
			id := deploy(t, tc, path, jobfile.Options{})
			tc.waitJob(id, "running", func(st *wire.JobStatus) bool {
				return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[2].RecordsIn > 0)
			})
			sp, err := tc.client.Stop(context.Background(), id, "", false)
			if err != nil {
				t.Fatal(err)
			}
			if want := "jetstream://STREAMD_CHECKPOINTS/" + id + "/savepoint-"; !strings.HasPrefix(sp, want) {
				t.Fatalf("savepoint %s, want %s...", sp, want)
			}
			st := tc.waitJob(id, "stopped", state(wire.JobStopped))
			if st.State != wire.JobStopped || len(st.Hosts) != tt.hosts {
				t.Fatalf("after stop: %s on %v (%s)", st.State, st.Hosts, st.Reason)
			}
			if st.Operators[0].RecordsOut >= n {
				t.Fatalf("the generator had already ended (%d records) before the stop: make the job longer", st.Operators[0].RecordsOut)
			}
			// A savepoint that does not exist is refused before anything is submitted.
			job, err := jobfile.LoadJob(path, jobfile.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tc.client.DeployFrom(context.Background(), job, path, "jetstream://STREAMD_CHECKPOINTS/nope"); err == nil || !strings.Contains(err.Error(), "no completed checkpoint") {
				t.Errorf("deploy --from a missing checkpoint: %v", err)
			}
			env := []string{"STREAMD_NATS_URL=" + tc.srv.URL()}
			out, errs, code := streamd(t, env, "deploy", path, "--from", sp, "--wait", "--json")
			if code != 0 {
				t.Fatalf("streamd deploy --from: exit %d\n%s\n%s", code, out, errs)
			}
			if !strings.Contains(out, `"state": "finished"`) {
				t.Fatalf("deploy --from --wait --json: %s", out)
			}
			sameLines(t, outputLines(t, filepath.Join(filepath.Dir(path), "out")), runLocally(t, path))
		})
	}
}
