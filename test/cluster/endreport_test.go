package cluster_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

// addHostOpts starts host id with the test options plus those set by with.
func (tc *testCluster) addHostOpts(id string, slots int, with func(*agent.HostOptions)) *agent.Host {
	t := tc.t
	opts := agent.HostOptions{ID: id, Slots: slots, DataDir: t.TempDir(), HeartbeatInterval: hbInterval,
		Executor: &agent.LocalExecutor{Engine: tc.engine}, Logger: logger(t)}
	with(&opts)
	h, err := agent.StartHost(connect(t, tc.srv.URL()), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	tc.hosts[id] = h
	return h
}

// TestLostFinalReport drops a host's final report of an attempt (all its
// retries lost): the controller notices from the heartbeats that the host no
// longer runs the attempt, asks the host for its outcome and finishes the job;
// a host that does not know the outcome has the attempt failed over.
func TestLostFinalReport(t *testing.T) {
	dropAll := func(wire.HostEvent) bool { return false }
	dropFirst := func(ev wire.HostEvent) bool { return ev.Attempt > 0 }
	for _, tt := range []struct {
		name    string
		spread  bool // two hosts, h2 drops; else one host h1
		forget  bool // the host keeps no outcomes
		drop    func(wire.HostEvent) bool
		attempt int // the attempt that finishes
	}{
		{name: "one-host/outcome-known", drop: dropAll},
		{name: "one-host/outcome-unknown", forget: true, drop: dropFirst, attempt: 1},
		{name: "spread/outcome-known", spread: true, drop: dropAll},
		{name: "spread/outcome-unknown", spread: true, forget: true, drop: dropFirst, attempt: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newCluster(t)
			dropper := "h1"
			if tt.spread {
				tc.addHost("h1", 2)
				dropper = "h2"
			}
			tc.addHostOpts(dropper, 2, func(o *agent.HostOptions) {
				o.SendFinalReport = tt.drop
				if tt.forget {
					o.Outcomes = -1
				}
			})
			tc.waitHosts(len(tc.hosts))
			var path string
			if tt.spread {
				path = spreadJob(t, 20000, 0, 4, "")
			} else {
				path = uppercaseJob(t)
			}
			start := time.Now()
			id := deploy(t, tc, path, jobfile.Options{})
			st := tc.waitJob(id, "finished", state(wire.JobFinished))
			took := time.Since(start)
			if st.State != wire.JobFinished || st.Attempt != tt.attempt {
				t.Fatalf("job %s in attempt %d (%s), want finished in attempt %d; attempts %+v", st.State, st.Attempt, st.Reason, tt.attempt, st.Attempts)
			}
			if tt.attempt > 0 {
				want := "host " + dropper + " reported no end for attempt 0 of job " + id
				if r := st.Attempts[0].Reason; st.Attempts[0].State != wire.SubtaskFailed || !strings.Contains(r, want) {
					t.Errorf("attempt 0: %s %q, want failed: %q", st.Attempts[0].State, r, want)
				}
			}
			if took > 10*time.Second {
				t.Errorf("the job took %s to finish (heartbeat %s): the lost report was noticed too late", took, hbInterval)
			}
			t.Logf("finished in attempt %d after %s (heartbeat %s)", st.Attempt, took.Round(time.Millisecond), hbInterval)
			if tt.spread {
				sameLines(t, outputLines(t, filepath.Join(filepath.Dir(path), "out")), runLocally(t, path))
			} else if got, want := readFile(t, filepath.Join(filepath.Dir(path), "out", "part-"+id+"-0")), expected(t); got != want {
				t.Fatalf("output:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
