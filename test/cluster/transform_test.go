package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// publishValues publishes value-from .. value-(to-1) to subject and waits
// for every ack.
func publishValues(t *testing.T, js jetstream.JetStream, subject string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if _, err := js.PublishAsync(subject, fmt.Appendf(nil, "value-%d", i), jetstream.WithStallWait(time.Minute)); err != nil {
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

// transformCluster is a cluster whose hosts (2 slots each) connect the jobs'
// nats sources and sinks to its NATS server; it returns the environment
// that points the streamd binary there and a JetStream client.
func transformCluster(t *testing.T, hosts ...string) (*testCluster, []string, jetstream.JetStream) {
	t.Helper()
	tc := newCluster(t)
	co, err := natsutil.NewConnectOptions(natsutil.URLs(tc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		tc.addHostWith(h, 2, &agent.LocalExecutor{Engine: tc.engine, NATS: co})
	}
	tc.waitHosts(len(hosts))
	js, err := jetstream.New(connect(t, tc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return tc, []string{"STREAMD_NATS_URL=" + tc.srv.URL()}, js
}

// TestTransformDeployExactlyOnce deploys the uppercase module as a
// transform (streamd deploy MODULE.wasm --input nats:orders --output
// nats:upper): deploy creates both streams and says so; what a nats.go
// client publishes to orders comes out uppercased on upper, exactly once,
// through a host crash (failover from a checkpoint in the JetStream object
// store) and a stop with a savepoint followed by deploy --from, with records
// published during each.
func TestTransformDeployExactlyOnce(t *testing.T) {
	tc, env, js := transformCluster(t, "h1", "h2")
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
	st := tc.waitJob(id, "running", state(wire.JobRunning))
	tc.hosts[st.Hosts[0]].Close()
	publishValues(t, js, "orders", step, 2*step)
	st = tc.waitJob(id, "running again", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.Attempt >= 1 && st.State == wire.JobRunning)
	})
	if st.State != wire.JobRunning {
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

// TestTransformDeployStreams: a transform reads a stream named with
// jetstream:STREAM:FILTER from --start new, at parallelism 2; deploy refuses,
// before any job exists, an output stream the exactly-once sink cannot
// commit into, an input only partly captured, a transform reading its own
// output, and flags of the wrong form.
func TestTransformDeployStreams(t *testing.T) {
	tc, env, js := transformCluster(t, "h1")
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "ORDERS", Subjects: []string{"orders.>"}},
		{Name: "PLAIN", Subjects: []string{"plain"}},
		{Name: "NOCOMMIT", Subjects: []string{"nocommit"}, AllowAtomicPublish: true},
		{Name: "EU", Subjects: []string{"eu.orders"}},
		{Name: "SELF", Subjects: []string{"self.>"}, AllowAtomicPublish: true},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	publishValues(t, js, "orders.us", 0, 10) // before the start: not read
	out, errs, code := streamd(t, env, "deploy", upper, "--input", "jetstream:ORDERS:orders.eu", "--output", "nats:upper.eu",
		"--start", "new", "-p", "2", "--name", "eu-upper", "--checkpoint-interval", "100ms")
	if code != 0 {
		t.Fatalf("deploy: exit %d\n%s\n%s", code, out, errs)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "eu-upper-") || !strings.Contains(errs, "input: stream ORDERS (filter orders.eu)\n") {
		t.Fatalf("deploy: id %q, stderr:\n%s", id, errs)
	}
	st := tc.waitJob(id, "running", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && len(st.Checkpoints) > 0)
	})
	if st.State != wire.JobRunning || st.Operators[0].Parallelism != 2 || st.Operators[2].UID != "sink-upper_eu" {
		t.Fatalf("job %s (%s), operators %+v", st.State, st.Reason, st.Operators)
	}
	oc := countOutput(t, js, "STREAMD_OUT_upper_eu")
	publishValues(t, js, "orders.us", 10, 20) // filtered out
	publishValues(t, js, "orders.eu", 0, 100)
	oc.wait(t, 100)
	if _, errs, code := streamd(t, env, "stop", "--drain", id); code != 0 {
		t.Fatalf("stop --drain: exit %d: %s", code, errs)
	}
	checkStream(t, js, "STREAMD_OUT_upper_eu", 100)

	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no atomic publish", []string{"--input", "nats:in.a", "--output", "nats:plain"}, 1,
			"stream PLAIN does not allow atomic publish; the sink commits each checkpoint's records in atomic batches: set allow_atomic"},
		{"no commit subject", []string{"--input", "nats:in.a", "--output", "nats:nocommit"}, 1,
			"stream NOCOMMIT does not capture the commit subject nocommit.streamd-commit.>"},
		{"partly captured", []string{"--input", "nats:eu.*"}, 1,
			"no stream captures all of eu.*, only part: EU (subjects eu.orders); read one with jetstream:STREAM:FILTER"},
		{"own output", []string{"--input", "nats:loop.>", "--output", "nats:loop.out"}, 2,
			"--output: nats:loop.out is also read by the input loop.>: the transform would read its own output"},
		{"no stream", []string{"--input", "jetstream:NOPE"}, 1, "--input jetstream:NOPE: nats: API error: code=404"},
		{"own stream", []string{"--input", "jetstream:SELF", "--output", "nats:self.upper"}, 2,
			"--output nats:self.upper goes to stream SELF, which the input reads whole: the transform would read its own output"},
		{"output without input", []string{"--source", "generator:5", "--output", "nats:x"}, 2, "--output applies only to a transform"},
		{"bad input", []string{"--input", "kinesis:x"}, 2, `--input "kinesis:x": want nats:SUBJECT, jetstream:STREAM[:FILTER] or kafka:TOPIC`},
		{"bad output", []string{"--input", "nats:a", "--output", "nats:o.*"}, 2, `--output: "o.*" has a wildcard`},
		{"bad start", []string{"--input", "nats:a", "--start", "seq:0"}, 2, `--start "seq:0": seq:N needs a stream sequence N of at least 1`},
		{"two sources", []string{"--input", "nats:a", "--source", "generator:5"}, 2, "--input and --source are two sources"},
		{"start and from", []string{"--input", "nats:a", "--start", "new", "--from", "jetstream://STREAMD_CHECKPOINTS/x"}, 2, "--start applies to a first start"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, errs, code := streamd(t, env, append([]string{"deploy", upper}, tt.args...)...)
			if code != tt.code || !strings.Contains(errs, tt.want) {
				t.Errorf("exit %d, want %d; stderr lacks %q:\n%s%s", code, tt.code, tt.want, out, errs)
			}
		})
	}
	jobs, err := tc.client.List(ctx, true)
	if err != nil || len(jobs) != 1 {
		t.Errorf("jobs after the refused deploys: %d (%v), want the first one only", len(jobs), err)
	}
	if _, err := js.Stream(ctx, "STREAMD_IN_in_a"); err == nil {
		t.Errorf("a refused deploy left the input stream it created") // the check order: outputs are checked first
	}
}

// TestTransformDeployOnError: a transform deployed with --on-error
// dead_letter:SUBJECT does not restart on a poison record: the record goes to
// SUBJECT (its stream created and named by deploy) and every other record to
// the output, each exactly once; --on-error skip drops it. Bad --on-error
// values are refused before anything is deployed.
func TestTransformDeployOnError(t *testing.T) {
	tc, env, js := transformCluster(t, "h1")
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	for _, tt := range []struct{ flag, want string }{
		{"--on-error=retry", `--on-error "retry": want fail, skip or dead_letter[:SUBJECT]`},
		{"--on-error=skip:x", `skip takes no subject`},
		{"--on-error=dead_letter:in.>", `"in.>" has a wildcard; a sink publishes to one subject`},
		{"--on-error=dead_letter:in.a", "dead_letter:in.a: "},
		{"--on-error=dead_letter:out", "dead_letter:out is also an --output"},
	} {
		_, errs, code := streamd(t, env, "deploy", mod, "--input", "nats:in.a", "--output", "nats:out", tt.flag)
		if code != 2 || !strings.Contains(errs, tt.want) {
			t.Errorf("deploy %s: exit %d, stderr %q; want exit 2 and %q", tt.flag, code, errs, tt.want)
		}
	}
	if _, errs, code := streamd(t, env, "deploy", mod, "--source", "generator:10", "--on-error", "dead_letter:x"); code != 2 || !strings.Contains(errs, "only a transform (--input) has them") {
		t.Errorf("deploy --source --on-error dead_letter: exit %d, stderr %q", code, errs)
	}
	if ids, err := tc.client.List(context.Background(), false); err != nil || len(ids) != 0 {
		t.Fatalf("after the refused deploys: jobs %v (%v), want none", ids, err)
	}

	const n = 300
	poison := map[string]bool{"value-7": true, "value-150": true}
	for _, mode := range []string{"dead_letter:dlq.orders", "skip"} {
		in, outSubj := "in."+mode[:4], "out."+mode[:4]
		outStream := "STREAMD_OUT_" + strings.ReplaceAll(outSubj, ".", "_")
		out, errs, code := streamd(t, env, "deploy", mod, "--input", "nats:"+in, "--output", "nats:"+outSubj, "--checkpoint-interval", "200ms",
			"--config", "poison=value-7,value-150", "--on-error", mode, "--name", "onerr-"+mode[:4])
		if code != 0 {
			t.Fatalf("deploy --on-error %s: exit %d\n%s\n%s", mode, code, out, errs)
		}
		id := strings.TrimSpace(out)
		if mode != "skip" && !strings.Contains(errs, "dead letters dlq.orders: stream STREAMD_OUT_dlq_orders (created") {
			t.Errorf("deploy's stderr does not name the dead letters' stream:\n%s", errs)
		}
		oc := countOutput(t, js, outStream)
		publishValues(t, js, in, 0, n)
		oc.wait(t, n-int64(len(poison)))
		st := tc.waitJob(id, "running", state(wire.JobRunning))
		if st.Attempt != 0 {
			t.Errorf("--on-error %s: attempt %d, want 0: a poison record restarted the job", mode, st.Attempt)
		}
		if _, errs, code := streamd(t, env, "stop", id); code != 0 {
			t.Fatalf("stop: exit %d: %s", code, errs)
		}
		var want []string
		for i := 0; i < n; i++ {
			if v := fmt.Sprintf("value-%d", i); !poison[v] {
				want = append(want, v)
			}
		}
		got := streamValues(t, js, outStream)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			lost, twice := lostAndTwice(got, want)
			t.Errorf("--on-error %s: output %d records, want %d: %d lost, %d twice", mode, len(got), len(want), lost, twice)
		}
		if mode == "skip" {
			continue
		}
		dead := map[string]int{}
		for _, v := range streamValues(t, js, "STREAMD_OUT_dlq_orders") {
			var dl struct{ Value, Error string }
			if err := json.Unmarshal([]byte(v), &dl); err != nil || dl.Error == "" {
				t.Fatalf("dead letter %q: not the JSON of a failed record (%v)", v, err)
			}
			dead[dl.Value]++
		}
		if len(dead) != len(poison) || dead["value-7"] != 1 || dead["value-150"] != 1 {
			t.Errorf("dead letters %v, want value-7 and value-150 once each", dead)
		}
	}
}
