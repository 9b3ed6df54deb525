package cluster_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// natsStreams creates the streams IN (in.>) and OUT (out.>, with a duplicate
// window) on the server at url and publishes n records "value-i" to IN, on
// subjects in.k0 .. in.k6.
func natsStreams(t *testing.T, url string, n int) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "IN", Subjects: []string{"in.>"}},
		{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: 2 * time.Minute, AllowAtomicPublish: true},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		if _, err := js.PublishAsync(fmt.Sprintf("in.k%d", i%7), fmt.Appendf(nil, "value-%d", i), jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(20 * time.Second):
		t.Fatal("publishing the input timed out")
	}
	return js
}

// checkOutStream checks that OUT holds exactly VALUE-0 .. VALUE-(n-1), each
// once.
func checkOutStream(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	checkStream(t, js, "OUT", n)
}

// checkStream checks that stream name holds exactly VALUE-0 .. VALUE-(n-1),
// each once, besides the nats sink's commit markers.
func checkStream(t *testing.T, js jetstream.JetStream, name string, n int) {
	t.Helper()
	got := streamValues(t, js, name)
	slices.Sort(got)
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("VALUE-%d", i)
	}
	slices.Sort(want)
	if slices.Equal(got, want) {
		return
	}
	lost, twice := lostAndTwice(got, want)
	t.Fatalf("output stream: %d messages, want %d: %d records lost, %d more than once", len(got), n, lost, twice)
}

// streamValues returns the payloads of stream name in stream order,
// without the nats sink's commit markers.
func streamValues(t *testing.T, js jetstream.JetStream, name string) []string {
	t.Helper()
	ctx := context.Background()
	out, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := out.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		// One request per message: on a loaded machine one of tens of
		// thousands may wait past the client's 5 s default, so each has
		// a minute and a timed-out one is asked again.
		var m *jetstream.RawStreamMsg
		for try := 1; ; try++ {
			gctx, cancel := context.WithTimeout(ctx, time.Minute)
			m, err = out.GetMsg(gctx, seq)
			cancel()
			if err == nil || try == 3 || !errors.Is(err, context.DeadlineExceeded) {
				break
			}
		}
		if err != nil {
			t.Fatalf("output message %d: %v", seq, err)
		}
		if m.Header.Get("Streamd-Commit") != "" {
			continue // the sink's commit marker
		}
		got = append(got, string(m.Data))
	}
	return got
}

// lostAndTwice counts the lines of want missing from got, and those in got
// more than once.
func lostAndTwice(got, want []string) (lost, twice int) {
	seen := map[string]int{}
	for _, g := range got {
		seen[g]++
	}
	for _, w := range want {
		switch seen[w] {
		case 0:
			lost++
		case 1:
		default:
			twice++
		}
	}
	return lost, twice
}

// TestNATSJobKillHostExactlyOnce runs a nats source -> uppercase -> nats sink
// job with checkpoints spread over three host processes (one source subtask
// hash-partitioning to four), kills one with SIGKILL mid-job, and checks
// that after the failover the output stream holds every record exactly
// once (the sink publishes only what completed checkpoints hold).
func TestNATSJobKillHostExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs streamd processes")
	}
	pc := newProcessCluster(t, 3, 2, "--batch-size", "16")
	const n = 60000
	js := natsStreams(t, pc.url, n)
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	path := filepath.Join(t.TempDir(), "nats-upper.yaml")
	job := fmt.Sprintf(`name: nats-upper
parallelism: 4
checkpoint: {interval: 100ms, storage: jetstream}
restart: {strategy: fixed-delay, attempts: 3, delay: 100ms}
operators:
  - uid: in
    parallelism: 1
    source: {type: nats, stream: IN, subject: "in.>", bounded: true, key_from: subject}
  - uid: upper
    wasm: %s
    inputs: [{from: in, partition: hash}]
  - uid: out
    sink: {type: nats, subject: out.upper}
    inputs: [upper]
`, upper)
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	id := deploy(t, pc.testCluster, path, jobfile.Options{})
	// Kill a host once a fifth of the output is in the stream (the hosts'
	// progress reports come only once a second: watch the stream itself).
	out, err := js.Stream(context.Background(), "OUT")
	if err != nil {
		t.Fatal(err)
	}
	var sunk uint64
	for deadline := time.Now().Add(30 * time.Second); sunk <= n/5; time.Sleep(2 * time.Millisecond) {
		info, err := out.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if sunk = info.State.Msgs; time.Now().After(deadline) {
			t.Fatalf("%d records in the output stream after 30s", sunk)
		}
	}
	st, err := pc.client.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != wire.JobRunning || len(st.Hosts) != 3 || sunk >= n {
		t.Fatalf("job %s on %v (%s) with %d records out: want running on 3 hosts", st.State, st.Hosts, st.Reason, sunk)
	}
	victim := st.Hosts[1]
	if err := pc.hosts[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	st = pc.waitJob(id, "failed over", func(st *wire.JobStatus) bool { return st.Attempt >= 1 || wire.TerminalJobState(st.State) })
	t.Logf("killed %s after %d of %d records reached the output stream (%d checkpoints); new attempt after %s",
		victim, sunk, n, len(st.Checkpoints), time.Since(killed).Round(time.Millisecond))
	st = pc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	if st.Attempt < 1 || !strings.Contains(st.Attempts[0].Reason, "host "+victim+" lost") {
		t.Fatalf("attempts %+v: want attempt 0 failed by the lost host %s", st.Attempts, victim)
	}
	checkOutStream(t, js, n)
}

// slowWriter is a stdout sink's writer that takes a while for every write,
// like a slow downstream system.
type slowWriter struct {
	mu    sync.Mutex
	delay time.Duration
	b     strings.Builder
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(w.delay)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *slowWriter) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Fields(w.b.String())
}

// TestSlowReceiverAcrossHostsIsBackPressured runs a generator on host h1
// feeding, over NATS, an operator and a slow stdout sink on host h2 (every
// write takes 3 ms) with a 1 KiB credit window: h1's senders must wait for
// credit (back-pressure) instead of flooding NATS, and every record arrives
// exactly once.
func TestSlowReceiverAcrossHostsIsBackPressured(t *testing.T) {
	tc := newCluster(t)
	fast, slow := &slowWriter{}, &slowWriter{delay: 3 * time.Millisecond}
	execs := map[string]*agent.LocalExecutor{}
	for _, h := range []struct {
		id  string
		out *slowWriter
	}{{"h1", fast}, {"h2", slow}} {
		execs[h.id] = &agent.LocalExecutor{Engine: tc.engine, Stdout: h.out, BatchSize: 32,
			ChannelOptions: []natsch.Option{natsch.Window(1 << 10)}}
		tc.addHostWith(h.id, 1, execs[h.id])
	}
	tc.waitHosts(2)
	const n = 20000
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	path := filepath.Join(t.TempDir(), "slow.yaml")
	job := fmt.Sprintf(`name: slow-receiver
parallelism: 2
operators:
  - uid: gen
    source: {type: generator, count: %d}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: rebalance}]
  - uid: out
    sink: {type: stdout}
    inputs: [upper]
`, n, upper)
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	elapsed := time.Since(start)
	got := append(fast.lines(), slow.lines()...)
	slices.Sort(got)
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("VALUE-%d", i)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%d records written (h1 %d, h2 %d), want each of %d once", len(got), len(fast.lines()), len(slow.lines()), n)
	}
	s1, s2 := execs["h1"].SenderStats(), execs["h2"].SenderStats()
	t.Logf("%d records in %s; h1 senders: %+v; h2 senders: %+v; records on h2's slow sink: %d",
		n, elapsed.Round(time.Millisecond), s1, s2, len(slow.lines()))
	if s1.Messages == 0 || s2.Messages == 0 {
		t.Fatalf("no NATS channel between the hosts: h1 sent %d messages, h2 %d", s1.Messages, s2.Messages)
	}
	if s1.CreditWaits == 0 {
		t.Errorf("h1's senders never waited for credit although h2's sink is slow: %+v", s1)
	}
	// In flight never exceeds the window, or one message when a message is
	// larger than the whole window.
	if max := uint64(64 << 10); s1.MaxInFlight > max {
		t.Errorf("h1 had %d bytes in flight, more than a 1 KiB window allows", s1.MaxInFlight)
	}
}

// TestSequenceGapAcrossHostsFailsOver publishes a forged message with a
// skipped sequence number on the data subject of a live channel between two
// hosts: the receiving subtask fails with a sequence error, the controller
// restarts the job from its latest checkpoint, and the nats sink's output
// stream still holds every record exactly once.
func TestSequenceGapAcrossHostsFailsOver(t *testing.T) {
	tc := newCluster(t, 2, 2)
	const n = 9000
	js := natsStreams(t, tc.srv.URL(), 0)
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	path := filepath.Join(t.TempDir(), "gap.yaml")
	job := fmt.Sprintf(`name: gap
parallelism: 4
checkpoint: {interval: 100ms, storage: jetstream}
restart: {strategy: fixed-delay, attempts: 3, delay: 100ms}
operators:
  - uid: gen
    parallelism: 1
    source: {type: generator, count: %d, rate: 3000, keys: 100}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: nats, url: %q, subject: out.gap}
    inputs: [upper]
`, n, upper, tc.srv.URL())
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running with a checkpoint", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[2].RecordsIn > 0 && len(st.Checkpoints) > 0)
	})
	if st.State != wire.JobRunning {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	// A channel between hosts: gen (one subtask, so that every sink subtask
	// replays its records in the same order after a restore, which the nats
	// sink's exactly-once needs) to an upper subtask b on the other host.
	hostOf := func(op, i int) string { return st.Operators[op].Subtasks[i].Host }
	a, b := -1, -1
	for i := 0; i < 1 && a < 0; i++ {
		for j := 0; j < 4; j++ {
			if hostOf(0, i) != hostOf(1, j) {
				a, b = i, j
				break
			}
		}
	}
	if a < 0 {
		t.Fatalf("no subtasks of gen and upper on different hosts: %+v", st.Operators)
	}
	subj := natsch.ChannelID{Job: id, Attempt: 0, From: "gen", FromSubtask: a, To: "upper", ToSubtask: b, Input: 0}.DataSubject()
	// A watermark with sequence number 1<<40: far ahead of the channel.
	forged := []byte{1, 2}
	forged = binary.LittleEndian.AppendUint64(forged, 1<<40)
	forged = binary.LittleEndian.AppendUint64(forged, 0)
	nc := connect(t, tc.srv.URL())
	if err := nc.Publish(subj, forged); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	st = tc.waitJob(id, "restarted", func(st *wire.JobStatus) bool { return st.Attempt >= 1 || wire.TerminalJobState(st.State) })
	if st.Attempt < 1 || !strings.Contains(st.Attempts[0].Reason, "gap") {
		t.Fatalf("after the forged message on %s: attempt %d, attempts %+v; want attempt 0 failed by a sequence gap", subj, st.Attempt, st.Attempts)
	}
	t.Logf("forged message on %s: %s", subj, st.Attempts[0].Reason)
	st = tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	checkOutStream(t, js, n)
}
