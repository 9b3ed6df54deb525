package webapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/webapi"
)

// The hosts, a job's logs, its versions, its checkpoint counts and a
// checkpoint's trace with each subtask's part, on a real cluster.
func TestHostsLogsTraces(t *testing.T) {
	tc := newCluster(t, webapi.Options{})
	id := tc.deploy(foreverJob(t, "forever"))
	base := tc.url + "/jobs/" + id
	waitFor(t, base, "running", func(j *webapi.JobDetail) bool { return j.State == wire.JobRunning })

	hosts := waitFor(t, tc.url+"/hosts", "h1 running the job", func(r *webapi.HostsReply) bool {
		return len(r.Hosts) == 1 && slices.Contains(r.Hosts[0].Jobs, id)
	})
	if h := hosts.Hosts[0]; h.ID != "h1" || h.State != "alive" || h.Slots != 4 || h.Free != 2 {
		t.Errorf("host %+v: want h1 alive with 4 slots, 2 free", h)
	}

	// The logs: the hosts' task lines about the attempt, read on with after=.
	logs := waitFor(t, base+"/logs", "the attempt's start", func(r *webapi.LogsReply) bool {
		return slices.ContainsFunc(r.Records, func(l wire.StoredLog) bool { return l.Msg == "attempt started" && l.Host == "h1" })
	})
	if logs.Next == 0 || logs.Next != logs.Records[len(logs.Records)-1].Seq {
		t.Errorf("logs: next %d, want the last record's sequence", logs.Next)
	}
	var again webapi.LogsReply
	call(t, http.MethodGet, base+"/logs?after="+strconv.FormatUint(logs.Next, 10), "", &again)
	for _, l := range again.Records {
		if l.Seq <= logs.Next {
			t.Errorf("after=%d gave record %d again", logs.Next, l.Seq)
		}
	}
	var one webapi.LogsReply
	if code, b := call(t, http.MethodGet, base+"/logs?since=1h&limit=1", "", &one); code != 200 || len(one.Records) != 1 || one.More != (len(logs.Records) > 1) {
		t.Errorf("logs?limit=1: %d %s: want one record, and more when %d are stored", code, b, len(logs.Records))
	}
	var upper webapi.LogsReply
	call(t, http.MethodGet, base+"/logs?operator=upper", "", &upper)
	for _, l := range upper.Records {
		if l.Operator != "upper" {
			t.Errorf("logs?operator=upper: a line of %q: %+v", l.Operator, l)
		}
	}
	wantError(t, http.MethodGet, base+"/logs?since=yesterday", "", 400, `since "yesterday"`)
	wantError(t, http.MethodGet, base+"/logs?limit=0", "", 400, "limit")
	wantError(t, http.MethodGet, base+"/logs?after=x", "", 400, "after")
	wantError(t, http.MethodGet, base+"/logs?operator=a.b", "", 400, "operator")
	wantError(t, http.MethodGet, tc.url+"/jobs/nosuchjob/logs", "", 404, "nosuchjob")

	var vs webapi.VersionsReply
	if code, b := call(t, http.MethodGet, base+"/versions", "", &vs); code != 200 || vs.Versions == nil || len(vs.Versions) != 0 {
		t.Errorf("versions before an upgrade: %d %s, want []", code, b)
	}

	// Checkpoints: counted, and the trace of one with its 4 subtasks.
	cps := waitFor(t, base+"/checkpoints", "a traced completed checkpoint", func(r *webapi.CheckpointsReply) bool {
		return r.Counts != nil && r.Counts.Completed > 0 && len(r.History) > 0 && slices.Contains(r.Traced, r.History[0].ID)
	})
	cid := cps.History[0].ID
	var tr webapi.TraceReply
	if code, b := call(t, http.MethodGet, base+"/checkpoints/"+strconv.FormatInt(cid, 10)+"/trace", "", &tr); code != 200 {
		t.Fatalf("trace: %d %s", code, b)
	}
	names := map[string]int{}
	for _, s := range tr.Spans {
		names[s.Name]++
	}
	if tr.CheckpointID != cid || names[telemetry.SpanCheckpoint] != 1 || names[telemetry.SpanCheckpointSubtask] != 4 ||
		names[telemetry.SpanCheckpointPersist] != 1 || names[telemetry.SpanTaskSnapshot] == 0 || len(tr.Subtasks) != 4 {
		t.Errorf("trace of checkpoint %d: spans %v, %d subtasks: want the checkpoint, its persist, 4 subtask parts and their snapshots", cid, names, len(tr.Subtasks))
	}
	for _, s := range tr.Subtasks {
		if s.AckMS <= 0 || s.Declined != "" {
			t.Errorf("subtask part %+v: want an acknowledgement time", s)
		}
	}
	t.Logf("checkpoint %d: %d spans, counts %+v; subtasks %+v", cid, len(tr.Spans), *cps.Counts, tr.Subtasks)
	wantError(t, http.MethodGet, base+"/checkpoints/999999/trace", "", 404, "no trace of checkpoint 999999")
	wantError(t, http.MethodGet, base+"/checkpoints/x/trace", "", 400, `checkpoint id "x"`)
	wantError(t, http.MethodGet, tc.url+"/jobs/nosuchjob/checkpoints/1/trace", "", 404, "nosuchjob")
}

// streamd run: GET /hosts is its own process; it has no log stream.
func TestLocalHostsAndLogs(t *testing.T) {
	g, err := control.NewJobGraph("local", []*control.Vertex{
		{UID: "gen", Parallelism: 1, Kind: control.KindSource, Spec: &jobfile.SourceSpec{Type: "generator", Count: 1}},
		{UID: "out", Parallelism: 1, Kind: control.KindSink, Spec: &jobfile.SinkSpec{Type: "discard"}, Inputs: []control.Edge{{From: "gen", Partition: control.Forward}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l := webapi.NewLocal(webapi.LocalJob{Graph: g, Cancel: func() {}})
	srv := httptest.NewServer(webapi.New(l, webapi.Options{Mode: "run"}))
	defer srv.Close()
	var hs webapi.HostsReply
	if code, b := call(t, http.MethodGet, srv.URL+"/hosts", "", &hs); code != 200 || len(hs.Hosts) != 1 || hs.Hosts[0].ID != "local" ||
		!slices.Equal(hs.Hosts[0].Jobs, []string{l.ID()}) {
		t.Errorf("GET /hosts of a run: %d %s: want the local process running the job", code, b)
	}
	wantError(t, http.MethodGet, srv.URL+"/jobs/"+l.ID()+"/logs", "", 404, "streamd run publishes no job log stream")
	wantError(t, http.MethodGet, srv.URL+"/jobs/"+l.ID()+"/checkpoints/1/trace", "", 404, "keeps no traces")
}

func TestExplain(t *testing.T) {
	for _, c := range []struct {
		reason  string
		attempt int
		want    string
	}{
		{"host h1 lost (no heartbeat for 205ms)", 1, "The process running attempt 1 on host h1 died or lost its connection: it sent no heartbeat for 205ms."},
		{`on host h2: job "j" operator "upper" subtask 1/2 phase process: guest trap: integer divide by zero` + "\nwasm stack trace:\n...", 0,
			"The module of operator upper (subtask 1) crashed in process during attempt 0: integer divide by zero."},
		{"host h3 reported no end for attempt 4 of job j-1", 4, "Host h3 restarted while it ran attempt 4: the attempt was lost with its process."},
		{"something nobody knows", 2, ""},
	} {
		if got := webapi.Explain(c.reason, c.attempt); got != c.want {
			t.Errorf("Explain(%q) = %q, want %q", c.reason, got, c.want)
		}
	}
	if !strings.HasPrefix(webapi.Explain("waiting for slots: need 4, have 2", 0), "Waiting for hosts") {
		t.Error("waiting for slots: not explained")
	}
}

// A job upgraded once has two versions: the deployed one, replaced, and
// the new one started from the upgrade's savepoint.
func TestVersionsAfterUpgrade(t *testing.T) {
	tc := newCluster(t, webapi.Options{})
	path := foreverJob(t, "forever")
	id := tc.deploy(path)
	base := tc.url + "/jobs/" + id
	waitFor(t, base+"/checkpoints", "a checkpoint", func(r *webapi.CheckpointsReply) bool { return len(r.History) > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := tc.client.Upgrade(ctx, id, nil, "", filepath.Join(filepath.Dir(path), "uppercase.wasm"), "upper", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	vs := waitFor(t, base+"/versions", "version 2 running", func(r *webapi.VersionsReply) bool {
		return len(r.Versions) == 2 && r.Versions[1].State == wire.VersionRunning
	})
	v1, v2 := vs.Versions[0], vs.Versions[1]
	if v1.Version != 1 || v1.State != wire.VersionReplaced || v2.Version != 2 || v2.From != rep.Savepoint || rep.Savepoint == "" ||
		len(v2.Modules) != 1 || v2.Modules[0].Operator != "upper" {
		t.Errorf("versions %+v after the upgrade to %+v", vs.Versions, rep)
	}
}
