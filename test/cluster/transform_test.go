package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// publishValues publishes value-from .. value-(to-1) to subject and waits
// for every ack.
func publishValues(t *testing.T, js jetstream.JetStream, subject string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if _, err := js.PublishAsync(subject, fmt.Appendf(nil, "value-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(20 * time.Second):
		t.Fatal("publishing the input timed out")
	}
}

// outputCounter counts the records (not the commit markers) stored in a
// stream, with an ordered consumer.
type outputCounter struct {
	n  atomic.Int64
	cc jetstream.ConsumeContext
}

func countOutput(t *testing.T, js jetstream.JetStream, stream string) *outputCounter {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	oc := &outputCounter{}
	if oc.cc, err = cons.Consume(func(m jetstream.Msg) {
		if m.Headers().Get("Streamd-Commit") == "" {
			oc.n.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(oc.cc.Stop)
	return oc
}

// wait waits until at least n records are in the stream.
func (oc *outputCounter) wait(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for oc.n.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d records in the output after 60s, want %d", oc.n.Load(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTransformDeployExactlyOnce deploys the uppercase module as a
// transform (streamd deploy MODULE.wasm --input nats:orders --output
// nats:upper): deploy creates both streams and says so; what a nats.go
// client publishes to orders comes out uppercased on upper, exactly once,
// through a host crash (failover from a checkpoint in the JetStream object
// store) and a stop with a savepoint followed by deploy --from, with records
// published during each.
func TestTransformDeployExactlyOnce(t *testing.T) {
	tc := newCluster(t)
	co, err := natsutil.NewConnectOptions(natsutil.URLs(tc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		tc.addHostWith(h, 2, &cluster.LocalExecutor{Engine: tc.engine, NATS: co})
	}
	tc.waitHosts(2)
	env := []string{"STREAMD_NATS_URL=" + tc.srv.URL()}
	js, err := jetstream.New(connect(t, tc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	args := []string{"deploy", upper, "--input", "nats:orders", "--output", "nats:upper", "--checkpoint-interval", "200ms"}
	out, errs, code := streamd(t, env, args...)
	if code != 0 {
		t.Fatalf("deploy: exit %d\n%s\n%s", code, out, errs)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "uppercase-") {
		t.Fatalf("deploy printed %q, want the job id", out)
	}
	for _, want := range []string{
		"input orders: stream STREAMD_IN_orders (created)\n",
		"output upper: stream STREAMD_OUT_upper (created, atomic publish, commit markers on upper.streamd-commit.>)\n",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("deploy's stderr lacks %q:\n%s", want, errs)
		}
	}
	oc := countOutput(t, js, "STREAMD_OUT_upper")
	const step = 1000
	publishValues(t, js, "orders", 0, step)
	oc.wait(t, step/2)

	// A host crash: the job fails over to the other host.
	st := tc.waitJob(id, "running", state(cluster.JobRunning))
	tc.hosts[st.Hosts[0]].Close()
	publishValues(t, js, "orders", step, 2*step)
	st = tc.waitJob(id, "running again", func(st *cluster.JobStatus) bool {
		return cluster.TerminalJobState(st.State) || (st.Attempt >= 1 && st.State == cluster.JobRunning)
	})
	if st.State != cluster.JobRunning {
		t.Fatalf("after the host crash: %s (%s)", st.State, st.Reason)
	}
	oc.wait(t, 2*step)

	// Stop with a savepoint, publish while stopped, deploy --from it.
	sp, errs, code := streamd(t, env, "stop", id)
	if code != 0 {
		t.Fatalf("stop: exit %d: %s", code, errs)
	}
	sp = strings.TrimSpace(sp)
	if !strings.HasPrefix(sp, "jetstream://STREAMD_CHECKPOINTS/"+id+"/savepoint-") {
		t.Fatalf("stop printed %q, want a savepoint in the object store", sp)
	}
	publishValues(t, js, "orders", 2*step, 3*step)
	out, errs, code = streamd(t, env, append(args, "--from", sp)...)
	if code != 0 {
		t.Fatalf("deploy --from: exit %d\n%s\n%s", code, out, errs)
	}
	id2 := strings.TrimSpace(out)
	if !strings.Contains(errs, "input orders: stream STREAMD_IN_orders\n") || !strings.Contains(errs, "output upper: stream STREAMD_OUT_upper\n") {
		t.Errorf("deploy --from's stderr does not name the existing streams:\n%s", errs)
	}
	publishValues(t, js, "orders", 3*step, 4*step)
	oc.wait(t, 4*step)
	if _, errs, code := streamd(t, env, "stop", id2); code != 0 {
		t.Fatalf("stop of the second job: exit %d: %s", code, errs)
	}
	checkStream(t, js, "STREAMD_OUT_upper", 4*step)
}
