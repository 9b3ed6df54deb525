//go:build long

package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/telemetry/jaegertest"
)

// TestJobTraceInJaeger runs a `streamd controller` and two `streamd host`
// processes with tracing on (the controller and host h1 export over OTLP
// gRPC, host h2 over OTLP HTTP) and a checkpointing job spread over both
// hosts, then reads a checkpoint's trace back through Jaeger's query API:
// one trace, the controller's checkpoint span as root, the snapshot spans of
// subtasks of both hosts' services as its children, the wasm guest's
// snapshot_state under its snapshot.
func TestJobTraceInJaeger(t *testing.T) {
	j := jaegertest.Start(t)
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	url := srv.URL()
	hb := "--heartbeat-interval=100ms"
	grpc := []string{"--tracing", "--tracing-protocol", "grpc", "--tracing-endpoint", j.OTLPGRPC, "--tracing-insecure"}
	startProc(t, "controller", append([]string{"controller", "--nats", url, hb}, grpc...)...)
	startProc(t, "h1", append([]string{"host", "--nats", url, hb, "--host-id", "h1", "--slots", "2", "--data-dir", t.TempDir()}, grpc...)...)
	// h2 names no id: its generated id is in its service name too.
	startProc(t, "h2", "host", "--nats", url, hb, "--slots", "2", "--data-dir", t.TempDir(),
		"--tracing", "--tracing-protocol", "http", "--tracing-endpoint", j.OTLPHTTP)
	tc := &testCluster{t: t, srv: srv}
	tc.client, err = client.NewClient(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	tc.waitHosts(2)
	hs, err := tc.client.Hosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h2 := ""
	for _, h := range hs {
		if h.ID != "h1" {
			h2 = "streamd-host-" + h.ID
		}
	}
	if h2 == "" || len(hs) != 2 {
		t.Fatalf("hosts %+v: want h1 and one with a generated id", hs)
	}

	path := spreadJob(t, 6000, 3000, 4, "checkpoint: {interval: 300ms, dir: chk}\n")
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished || len(st.Hosts) != 2 {
		t.Fatalf("job %s on %v: %s", st.State, st.Hosts, st.Reason)
	}

	// The batch span processors export every 5 s.
	tr := j.WaitTrace(t, "streamd-controller", 60*time.Second, func(tr *jaegertest.Trace) bool {
		services := map[string]int{}
		for _, s := range tr.Spans {
			if s.OperationName == telemetry.SpanTaskSnapshot {
				services[tr.Service(s)]++
			}
		}
		return services["streamd-host-h1"] == 6 && services[h2] == 6
	})
	var root jaegertest.Span
	for _, s := range tr.Spans {
		if s.OperationName == telemetry.SpanCheckpoint {
			root = s
		}
	}
	if root.SpanID == "" || root.Parent() != "" || tr.Service(root) != "streamd-controller" {
		t.Fatalf("checkpoint span %+v (service %s): want the root, from the controller", root, tr.Service(root))
	}
	id64, _ := root.Tag("streamd.checkpoint_id")
	byID := map[string]jaegertest.Span{}
	for _, s := range tr.Spans {
		byID[s.SpanID] = s
	}
	guests := 0
	for _, s := range tr.Spans {
		switch s.OperationName {
		case telemetry.SpanTaskSnapshot, telemetry.SpanBarrierAlignment, telemetry.SpanTaskNotifyComplete:
			if s.Parent() != root.SpanID {
				t.Errorf("%s of %s: parent %s, want the checkpoint span", s.OperationName, tr.Service(s), s.Parent())
			}
			if v, _ := s.Tag("streamd.checkpoint_id"); v != id64 {
				t.Errorf("%s: checkpoint id %v, want %v", s.OperationName, v, id64)
			}
		case telemetry.SpanGuestSnapshotState:
			guests++
			if p := byID[s.Parent()]; p.OperationName != telemetry.SpanTaskSnapshot || tr.Service(p) != tr.Service(s) {
				t.Errorf("guest.snapshot_state under %q of %s", p.OperationName, tr.Service(p))
			}
		}
	}
	if guests != 4 {
		t.Errorf("%d guest.snapshot_state spans, want 4 (the upper subtasks)", guests)
	}
	t.Logf("checkpoint %v: %d spans from %v", id64, len(tr.Spans), fmt.Sprint(tr.Processes))

	// The attempt is one trace too: the controller's job span with the task
	// spans of both hosts (each with its phases) as children.
	jt := j.WaitTrace(t, "streamd-controller", 60*time.Second, func(tr *jaegertest.Trace) bool {
		services := map[string]int{}
		for _, s := range tr.Spans {
			if s.OperationName == telemetry.SpanTask {
				services[tr.Service(s)]++
			}
		}
		return services["streamd-host-h1"] == 6 && services[h2] == 6
	})
	var job jaegertest.Span
	for _, s := range jt.Spans {
		if s.OperationName == telemetry.SpanJob {
			job = s
		}
	}
	if job.SpanID == "" || job.Parent() != "" || jt.Service(job) != "streamd-controller" {
		t.Fatalf("job span %+v (service %s): want the root, from the controller", job, jt.Service(job))
	}
	for _, s := range jt.Spans {
		if s.OperationName == telemetry.SpanTask && s.Parent() != job.SpanID {
			t.Errorf("task span of %s: parent %s, want the job span %s", jt.Service(s), s.Parent(), job.SpanID)
		}
	}
	t.Logf("job trace: %d spans from %v", len(jt.Spans), fmt.Sprint(jt.Processes))
}
