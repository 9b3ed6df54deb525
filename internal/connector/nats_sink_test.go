package connector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/natsutil"
)

// sinkEnv is an embedded JetStream server that a test can restart with the
// same port and store, and stream OUT on "out.>" allowing atomic publish.
type sinkEnv struct {
	t     *testing.T
	mu    sync.Mutex
	srv   *natsutil.Server
	port  int
	store string
	co    natsutil.ConnectOptions
	js    jetstream.JetStream
}

func newSinkEnv(t *testing.T, cfg jetstream.StreamConfig) *sinkEnv {
	t.Helper()
	e := &sinkEnv{t: t, store: t.TempDir(), port: -1}
	e.start()
	t.Cleanup(func() { e.mu.Lock(); e.srv.Shutdown(); e.mu.Unlock() })
	co, err := natsutil.NewConnectOptions(natsutil.URLs(e.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	e.co = co
	nc, err := co.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if e.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if cfg.Name == "" {
		cfg = jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, AllowAtomicPublish: true}
	}
	if _, err := e.js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *sinkEnv) start() {
	s, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: e.port, NoLog: true, StoreDir: e.store})
	if err != nil {
		e.t.Fatal(err)
	}
	e.srv = s
	e.port = s.Addr().(*net.TCPAddr).Port
}

// restart stops the server and starts it again on the same port and store.
func (e *sinkEnv) restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.srv.Shutdown()
	e.start()
}

// sink opens subtask sub of p of operator "sink" of job "job1" (or o's) and
// commits states.
func (e *sinkEnv) sink(o NATSSinkOptions, sub, p int, states ...[]byte) *NATSSink {
	e.t.Helper()
	o.Conn = e.co
	if o.Subject == "" {
		o.Subject = "out.a"
	}
	if o.Job == "" {
		o.Job = "job1"
	}
	if o.Operator == "" {
		o.Operator = "sink"
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = 20 * time.Second
	}
	s, err := NewNATSSink(context.Background(), o, sub, p)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { s.Close() })
	if err := s.CommitPending(states); err != nil {
		e.t.Fatalf("commit pending: %v", err)
	}
	return s
}

// values returns the values of the records on subject, in stream order
// (commit markers are not records).
func (e *sinkEnv) values(subject string) []string {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, "OUT")
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, string(m.Data))
		seq = m.Sequence + 1
	}
}

// exactlyOnce fails unless subject holds every value of want exactly once.
func (e *sinkEnv) exactlyOnce(subject string, want []string) {
	e.t.Helper()
	got := e.values(subject)
	seen := map[string]int{}
	for _, v := range got {
		seen[v]++
	}
	var dup, missing []string
	for v, n := range seen {
		if n > 1 {
			dup = append(dup, v)
		}
	}
	for _, v := range want {
		if seen[v] == 0 {
			missing = append(missing, v)
		}
		delete(seen, v)
	}
	for v := range seen {
		missing = append(missing, "unexpected "+v)
	}
	if len(dup) > 0 || len(missing) > 0 || len(got) != len(want) {
		e.t.Fatalf("%s: %d records for %d: duplicated %v, missing %v", subject, len(got), len(want), dup, missing)
	}
}

func vals(recs []abi.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	return out
}

func mustWrite(t *testing.T, s *NATSSink, recs []abi.Record) {
	t.Helper()
	if err := s.Write(recs); err != nil {
		t.Fatal(err)
	}
}

func mustPreCommit(t *testing.T, s *NATSSink, id int64) []byte {
	t.Helper()
	st, err := s.PreCommit(id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var errCrash = errors.New("crash injected")

// crashAt makes s fail before message msg of batch b (msg = the batch's
// record count: before its marker).
func crashAt(s *NATSSink, b, msg int) {
	s.failHook = func(_ *natsEntry, bb, m int) error {
		if bb == b && m == msg {
			return errCrash
		}
		return nil
	}
}

// TestNATSSinkTwoPhase: nothing is visible before its checkpoint commits;
// a restore commits the pending epoch; committing again, or an older
// state, publishes nothing twice.
func TestNATSSinkTwoPhase(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{})
	s := e.sink(NATSSinkOptions{}, 0, 1)
	mustWrite(t, s, sinkRecs(0, 100))
	st1 := mustPreCommit(t, s, 1)
	if got := e.values("out.a"); len(got) != 0 {
		t.Fatalf("%d records visible before the commit", len(got))
	}
	if err := s.Commit(1); err != nil {
		t.Fatal(err)
	}
	e.exactlyOnce("out.a", vals(sinkRecs(0, 100)))
	mustWrite(t, s, sinkRecs(100, 250))
	st2 := mustPreCommit(t, s, 2)
	mustWrite(t, s, sinkRecs(250, 300)) // after the last checkpoint: lost with the crash, replayed later
	// crash: s is abandoned without Commit(2) or Close
	e.exactlyOnce("out.a", vals(sinkRecs(0, 100)))

	r := e.sink(NATSSinkOptions{}, 0, 1, st2)
	e.exactlyOnce("out.a", vals(sinkRecs(0, 250)))
	e.sink(NATSSinkOptions{}, 0, 1, st2) // once more
	e.sink(NATSSinkOptions{}, 0, 1, st1) // an older checkpoint's state: its epoch is in the stream
	e.exactlyOnce("out.a", vals(sinkRecs(0, 250)))
	mustWrite(t, r, sinkRecs(250, 300)) // the replay
	if err := r.Commit(mustPreCommitID(t, r, 3)); err != nil {
		t.Fatal(err)
	}
	e.exactlyOnce("out.a", vals(sinkRecs(0, 300)))
}

func mustPreCommitID(t *testing.T, s *NATSSink, id int64) int64 {
	mustPreCommit(t, s, id)
	return id
}

// TestNATSSinkCrashPoints: an epoch of 11 batches (BatchSize 10) is
// committed with a crash before, inside and after batches and markers;
// a new sink restored from the checkpoint state finishes it: exactly once.
func TestNATSSinkCrashPoints(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{})
	recs := sinkRecs(0, 95) // 10 batches of 9 records and one of 5
	for i, c := range []struct {
		name   string
		b, msg int // -1: no crash (the crash comes after the commit)
	}{
		{"before the first batch", 0, 0},
		{"inside the first batch", 0, 4},
		{"before the first marker", 0, 9},
		{"inside batch 5", 4, 3},
		{"before batch 6", 5, 0},
		{"before the last marker", 10, 5},
		{"after the commit", -1, 0},
	} {
		{ // no subtest: the env's helpers fail the test itself
			subj := "out.crash" + strconv.Itoa(i)
			o := NATSSinkOptions{Subject: subj, BatchSize: 10}
			s := e.sink(o, 0, 1)
			mustWrite(t, s, recs)
			st := mustPreCommit(t, s, 7)
			if c.b >= 0 {
				crashAt(s, c.b, c.msg)
				if err := s.Commit(7); !errors.Is(err, errCrash) {
					t.Fatalf("%s: commit: %v", c.name, err)
				}
				if n := len(e.values(subj)); n != 9*c.b {
					t.Fatalf("%s: %d records published before the crash, want %d", c.name, n, 9*c.b)
				}
			} else if err := s.Commit(7); err != nil {
				t.Fatal(err)
			}
			r := e.sink(o, 0, 1, st)
			e.exactlyOnce(subj, vals(recs))
			if c.b >= 0 && r.Published() != uint64(95-9*c.b) {
				t.Errorf("%s: restored sink published %d records, want %d", c.name, r.Published(), 95-9*c.b)
			}
		}
	}
}

// TestNATSSinkRetryLongAfter: the stream's duplicate window (100 ms) has
// passed when the commit is retried; nothing is published twice.
func TestNATSSinkRetryLongAfter(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, AllowAtomicPublish: true, Duplicates: 100 * time.Millisecond})
	o := NATSSinkOptions{BatchSize: 10}
	s := e.sink(o, 0, 1)
	mustWrite(t, s, sinkRecs(0, 40))
	st1 := mustPreCommit(t, s, 1)
	if err := s.Commit(1); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, sinkRecs(40, 80))
	st2 := mustPreCommit(t, s, 2)
	crashAt(s, 2, 3) // epoch 2 half published
	if err := s.Commit(2); !errors.Is(err, errCrash) {
		t.Fatal(err)
	}
	// Wait until the stream has forgotten every message id: a message id
	// published once is accepted again only after the window.
	ctx := context.Background()
	probe := &nats.Msg{Subject: "out.probe", Header: nats.Header{}}
	probe.Header.Set(jetstream.MsgIDHeader, "probe")
	if _, err := e.js.PublishMsg(ctx, probe); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ack, err := e.js.PublishMsg(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Duplicate {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the duplicate window never passed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.sink(o, 0, 1, st1)
	e.sink(o, 0, 1, st2)
	e.sink(o, 0, 1, st2)
	e.exactlyOnce("out.a", vals(sinkRecs(0, 80)))
}

// TestNATSSinkRescale: p=2 checkpoints (subtask 1 crashes before its
// commit), restored at p=3 (old state j goes to new subtask j mod 3), which
// checkpoints with subtask 2 crashing mid-commit, restored at p=1.
func TestNATSSinkRescale(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{})
	o := NATSSinkOptions{BatchSize: 8}
	var want []string
	var st5 [][]byte
	for i := 0; i < 2; i++ {
		s := e.sink(o, i, 2)
		recs := sinkRecs(1000*i, 1000*i+30)
		want = append(want, vals(recs)...)
		mustWrite(t, s, recs)
		st5 = append(st5, mustPreCommit(t, s, 5))
		if i == 0 {
			if err := s.Commit(5); err != nil {
				t.Fatal(err)
			}
		}
	}
	var st6 [][]byte
	for i := 0; i < 3; i++ {
		var mine [][]byte
		for j, st := range st5 {
			if j%3 == i {
				mine = append(mine, st)
			}
		}
		s := e.sink(o, i, 3, mine...)
		recs := sinkRecs(5000+1000*i, 5000+1000*i+20)
		want = append(want, vals(recs)...)
		mustWrite(t, s, recs)
		st6 = append(st6, mustPreCommit(t, s, 6))
		if i == 2 {
			crashAt(s, 1, 2)
			if err := s.Commit(6); !errors.Is(err, errCrash) {
				t.Fatal(err)
			}
		} else if i == 0 {
			if err := s.Commit(6); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.sink(o, 0, 1, st6...)
	e.exactlyOnce("out.a", want)
}

// TestNATSSinkReplayOrder: the records after the last checkpoint are
// replayed in another order (and partly by another subtask, as after a
// hash repartition): the stream has each exactly once.
func TestNATSSinkReplayOrder(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{})
	s0, s1 := e.sink(NATSSinkOptions{}, 0, 2), e.sink(NATSSinkOptions{}, 1, 2)
	mustWrite(t, s0, sinkRecs(0, 50))
	mustWrite(t, s1, sinkRecs(50, 100))
	st0, st1 := mustPreCommit(t, s0, 1), mustPreCommit(t, s1, 1)
	for _, s := range []*NATSSink{s0, s1} {
		if err := s.Commit(1); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, s0, sinkRecs(100, 150))
	mustWrite(t, s1, sinkRecs(150, 200))
	// crash before checkpoint 2; restore from 1
	r0, r1 := e.sink(NATSSinkOptions{}, 0, 2, st0), e.sink(NATSSinkOptions{}, 1, 2, st1)
	replay := sinkRecs(100, 200)
	slices.Reverse(replay)
	mustWrite(t, r0, replay[:60]) // a different split between the subtasks
	mustWrite(t, r1, replay[60:])
	for _, s := range []*NATSSink{r0, r1} {
		mustPreCommit(t, s, 2)
		if err := s.Commit(2); err != nil {
			t.Fatal(err)
		}
	}
	e.exactlyOnce("out.a", vals(sinkRecs(0, 200)))
}

// TestNATSSinkServerRestart: the NATS server restarts (same store) in the
// middle of a batch, between two batches and before a batch's marker; the
// commit goes on after it and stays exactly once. "at once": the server is
// back before the sink sends again. "while waiting": it goes down as the
// sink sends and is back 300ms later, while the sink waits for an ack the
// old server will never send; the sink drops that try when the connection
// is lost and goes on once it is back, within its ack timeout (before, each
// lost reply cost a whole ack timeout, the commit's deadline too, so the
// commit failed).
func TestNATSSinkServerRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting bool
	}{{"at once", false}, {"while waiting", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSinkEnv(t, jetstream.StreamConfig{})
			o := NATSSinkOptions{BatchSize: 10, AckTimeout: 10 * time.Second}
			s := e.sink(o, 0, 1)
			mustWrite(t, s, sinkRecs(0, 90))
			st := mustPreCommit(t, s, 1)
			var wg sync.WaitGroup
			restarts := 0
			s.failHook = func(_ *natsEntry, b, msg int) error {
				if restarts == 3 || !(b == 3 && msg == 4 || b == 6 && msg == 0 || b == 8 && msg == 9) {
					return nil
				}
				restarts++
				if !tc.waiting {
					e.restart()
					return nil
				}
				e.mu.Lock()
				e.srv.Shutdown()
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer e.mu.Unlock()
					time.Sleep(300 * time.Millisecond)
					e.start()
				}()
				return nil
			}
			err := s.Commit(1)
			wg.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if restarts != 3 {
				t.Fatalf("%d restarts", restarts)
			}
			e.exactlyOnce("out.a", vals(sinkRecs(0, 90)))
			e.sink(o, 0, 1, st) // and a restore afterwards publishes nothing
			e.exactlyOnce("out.a", vals(sinkRecs(0, 90)))
		})
	}
}

// TestNATSSinkConcurrentCommits: two sinks commit the same restored state
// at once (a restored attempt and a zombie of the failed one): the
// compare-and-swap on the marker subject lets each batch in once.
func TestNATSSinkConcurrentCommits(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{})
	o := NATSSinkOptions{BatchSize: 5}
	s := e.sink(o, 0, 1)
	mustWrite(t, s, sinkRecs(0, 200))
	st := mustPreCommit(t, s, 1)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := o
			o.Conn = e.co
			o.Subject, o.Job, o.Operator = "out.a", "job1", "sink"
			r, err := NewNATSSink(context.Background(), o, 0, 1)
			if err == nil {
				err = r.CommitPending([][]byte{st})
				r.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	e.exactlyOnce("out.a", vals(sinkRecs(0, 200)))
}

// TestNATSSinkWriters: two jobs (or two deployments, by job id) write one
// subject with the same operator uid; their markers are apart and both
// outputs are exactly once.
func TestNATSSinkWriters(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{})
	a := e.sink(NATSSinkOptions{Job: "job-a"}, 0, 1)
	b := e.sink(NATSSinkOptions{Job: "job-b"}, 0, 1)
	if a.Marker() == b.Marker() || !strings.HasPrefix(a.Marker(), "out.a.streamd-commit.") {
		t.Fatalf("markers %s and %s", a.Marker(), b.Marker())
	}
	mustWrite(t, a, sinkRecs(0, 30))
	mustWrite(t, b, sinkRecs(30, 60))
	sa, sb := mustPreCommit(t, a, 4), mustPreCommit(t, b, 4)
	if err := a.Commit(4); err != nil {
		t.Fatal(err)
	}
	e.sink(NATSSinkOptions{Job: "job-a"}, 0, 1, sa)
	e.sink(NATSSinkOptions{Job: "job-b"}, 0, 1, sb)
	e.exactlyOnce("out.a", vals(sinkRecs(0, 60)))
}

func TestNATSSinkStreamErrors(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, AllowAtomicPublish: true})
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "PLAIN", Subjects: []string{"plain.>"}},
		{Name: "EXACT", Subjects: []string{"exact"}, AllowAtomicPublish: true},
	} {
		if _, err := e.js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	open := func(subj string) error {
		_, err := NewNATSSink(ctx, NATSSinkOptions{Conn: e.co, Subject: subj, Job: "j", Operator: "o"}, 0, 1)
		return err
	}
	if err := open("plain.x"); err == nil || !strings.Contains(err.Error(), "stream PLAIN does not allow atomic publish") || !strings.Contains(err.Error(), "allow_atomic") {
		t.Errorf("no atomic publish: %v", err)
	}
	if err := open("exact"); err == nil || !strings.Contains(err.Error(), "stream EXACT does not capture the commit subject exact.streamd-commit.>") {
		t.Errorf("marker not captured: %v", err)
	}
	if err := open("elsewhere"); err == nil || !strings.Contains(err.Error(), "no JetStream stream captures the subject") {
		t.Errorf("no stream: %v", err)
	}
	if _, err := NewNATSSink(ctx, NATSSinkOptions{Conn: e.co, Subject: "exact", CommitSubject: "out.commits", Job: "j", Operator: "o"}, 0, 1); err == nil || !strings.Contains(err.Error(), "does not capture the commit subject out.commits.>") {
		t.Errorf("marker in another stream: %v", err)
	}
	// Direct (no checkpointing) publishes without batches: any stream.
	if _, err := NewNATSSink(ctx, NATSSinkOptions{Conn: e.co, Subject: "plain.x", Job: "j", Operator: "o", Direct: true}, 0, 1); err != nil {
		t.Errorf("direct: %v", err)
	}
	s := e.sink(NATSSinkOptions{}, 0, 1)
	if err := s.Write([]abi.Record{{Value: make([]byte, 2<<20)}}); err == nil || !strings.Contains(err.Error(), "record of 2097152 bytes") {
		t.Errorf("large record: %v", err)
	}
	if err := s.CommitPending([][]byte{{2, 0, 0, 0, 1, 0}}); err == nil || !strings.Contains(err.Error(), "bad nats sink state") {
		t.Errorf("bad state: %v", err)
	}
	// The state of the sink before version 2 (it had published at once) restores as nothing to do.
	if err := s.CommitPending([][]byte{make([]byte, natsSinkStateV1Len)}); err == nil {
		t.Errorf("v1 state with version 0 accepted")
	}
	v1 := make([]byte, natsSinkStateV1Len)
	v1[0] = 1
	if err := s.CommitPending([][]byte{v1}); err != nil {
		t.Errorf("v1 state: %v", err)
	}
}

// TestNATSSinkStateRoundTrip: an encoded state decodes to the same entries.
func TestNATSSinkStateRoundTrip(t *testing.T) {
	e := newSinkEnv(t, jetstream.StreamConfig{})
	s := e.sink(NATSSinkOptions{BatchSize: 4}, 0, 1)
	mustWrite(t, s, sinkRecs(0, 10))
	mustPreCommit(t, s, 1)
	mustWrite(t, s, sinkRecs(10, 11))
	es, err := decodeNATSState(mustPreCommit(t, s, 2))
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].epoch != 1 || !slices.Equal(es[0].batches, []uint32{3, 3, 3, 1}) || es[1].epoch != 2 || es[0].subject != s.Marker() {
		t.Fatalf("entries %+v", es)
	}
	var got []string
	EachStaged(es[0].data, func(r abi.Record) error {
		got = append(got, fmt.Sprintf("%s/%s/%d", r.Key, r.Value, r.Timestamp))
		return nil
	})
	if got[0] != "k0/out-0/0" || got[1] != "/out-1/"+strconv.FormatInt(abi.NoTimestamp, 10) {
		t.Errorf("records %v", got)
	}
}

// TestNATSSinkToSource: what the sink writes, the source reads back with
// the same keys, values and timestamps, skipping the commit markers.
func TestNATSSinkToSource(t *testing.T) {
	co, _, _ := jsServer(t)
	ctx := context.Background()
	for _, direct := range []bool{false, true} {
		subj := "orders.out" + strconv.FormatBool(direct)
		s, err := NewNATSSink(ctx, NATSSinkOptions{Conn: co, Subject: subj, Job: "j", Operator: "o", Direct: direct}, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		recs := sinkRecs(0, 20)
		if err := s.Write(recs); err != nil {
			t.Fatal(err)
		}
		if err := s.CommitFinal(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		src, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", Subject: "orders.>", Bounded: true}, 0, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, eof := readSome(t, src, 8, 100)
		src.Close()
		if !direct && (!eof || len(got) != len(recs)) {
			t.Fatalf("read %d records, eof %v", len(got), eof)
		}
		for i, r := range got[len(got)-len(recs):] {
			if r.value != string(recs[i].Value) || r.key != string(recs[i].Key) || (recs[i].Timestamp != abi.NoTimestamp && r.ts != recs[i].Timestamp) {
				t.Errorf("record %d: %+v, wrote %q/%q@%d", i, r, recs[i].Key, recs[i].Value, recs[i].Timestamp)
			}
		}
	}
}

// BenchmarkNATSSink: records of 100 bytes, a checkpoint every 10 000
// records; direct is the publish-at-once path (the old sink's way), staged
// the two-phase commit.
func BenchmarkNATSSink(b *testing.B) {
	s := natstest.Server(b)
	nc := natstest.Connect(b, s.URL())
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}, AllowAtomicPublish: true}); err != nil {
		b.Fatal(err)
	}
	recs := make([]abi.Record, 100)
	for i := range recs {
		recs[i] = abi.Record{Key: []byte("key"), Value: []byte(strings.Repeat("v", 100)), Timestamp: int64(i)}
	}
	for _, direct := range []bool{true, false} {
		name := "staged"
		if direct {
			name = "direct"
		}
		b.Run(name, func(b *testing.B) {
			sink, err := NewNATSSinkConn(context.Background(), nc, NATSSinkOptions{Subject: "b." + name, Job: "j", Operator: "o", Direct: direct}, 0, 1)
			if err != nil {
				b.Fatal(err)
			}
			defer sink.Close()
			b.ResetTimer()
			var id int64
			for i := 0; i < b.N; i++ {
				if err := sink.Write(recs[i%100 : i%100+1]); err != nil {
					b.Fatal(err)
				}
				if (i+1)%10000 == 0 || i == b.N-1 {
					if direct {
						err = sink.Flush()
					} else {
						id++
						if _, err = sink.PreCommit(id); err == nil {
							err = sink.Commit(id)
						}
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// sinkRecs are records "out-<i>" for i in [from, to); even ones have key
// "k<i>" and timestamp i.
func sinkRecs(from, to int) []abi.Record {
	var recs []abi.Record
	for i := from; i < to; i++ {
		r := abi.Record{Value: fmt.Appendf(nil, "out-%d", i), Timestamp: abi.NoTimestamp}
		if i%2 == 0 {
			r.Key, r.Timestamp = fmt.Appendf(nil, "k%d", i), int64(i)
		}
		recs = append(recs, r)
	}
	return recs
}
