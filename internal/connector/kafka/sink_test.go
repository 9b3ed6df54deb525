package kafka

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func sinkConfig(c *kafkatest.Cluster, topic string) SinkConfig {
	return SinkConfig{Client: ClientConfig{Brokers: c.Brokers}, Topic: topic, Job: "job-1", Operator: "out"}
}

func openSink(t *testing.T, c *kafkatest.Cluster, topic string, subtask, parallelism int) *Sink {
	t.Helper()
	s, err := NewSink(testCtx(t), sinkConfig(c, topic), subtask, parallelism)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// recsN are records "k<i mod 5>"/"<tag>-<i>" with timestamp 1000+i.
func recsN(tag string, n int) []abi.Record {
	var out []abi.Record
	for i := range n {
		out = append(out, abi.Record{Key: []byte("k" + strconv.Itoa(i%5)), Value: []byte(tag + "-" + strconv.Itoa(i)), Timestamp: 1_000 + int64(i)})
	}
	return out
}

// committed is what a read_committed consumer sees of topic, as sorted
// values.
func committed(t *testing.T, c *kafkatest.Cluster, topic string) []string {
	t.Helper()
	var out []string
	for _, r := range c.ReadCommitted(t, topic) {
		out = append(out, string(r.Value))
	}
	slices.Sort(out)
	return out
}

func valuesOf(recs ...[]abi.Record) []string {
	var out []string
	for _, rs := range recs {
		for _, r := range rs {
			out = append(out, string(r.Value))
		}
	}
	slices.Sort(out)
	return out
}

// exactlyOnce fails unless topic holds each of want exactly once.
func exactlyOnce(t *testing.T, c *kafkatest.Cluster, topic string, want []string) {
	t.Helper()
	got := committed(t, c, topic)
	if !slices.Equal(got, want) {
		seen := map[string]int{}
		for _, v := range got {
			seen[v]++
		}
		var dups, missing []string
		for v, n := range seen {
			if n > 1 {
				dups = append(dups, v)
			}
		}
		for _, v := range want {
			if seen[v] == 0 {
				missing = append(missing, v)
			}
		}
		t.Fatalf("%s holds %d records, want %d exactly once: %d duplicated (%v), %d missing (%v)",
			topic, len(got), len(want), len(dups), head(dups), len(missing), head(missing))
	}
}

func head(s []string) []string { return s[:min(len(s), 5)] }

func TestSinkCommitsWhenTheCheckpointCompletes(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 3)
	s := openSink(t, c, "out", 0, 1)
	r1, r2 := recsN("a", 50), recsN("b", 20)
	if err := s.Write(r1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreCommit(1); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(r2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreCommit(2); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, c, "out"); len(got) != 0 {
		t.Fatalf("%d records visible before any checkpoint completed", len(got))
	}
	if err := commitNow(s, 1); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, "out", valuesOf(r1))
	if err := commitNow(s, 2); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, "out", valuesOf(r1, r2))
	if s.Pending() != 0 {
		t.Errorf("%d entries pending after both commits", s.Pending())
	}

	// Keys, timestamps and partitioning by key.
	part := map[string]int32{}
	for _, r := range c.ReadCommitted(t, "out") {
		i, _ := strconv.Atoi(strings.SplitN(string(r.Value), "-", 2)[1])
		if string(r.Key) != "k"+strconv.Itoa(i%5) || r.Timestamp.UnixMilli() != 1_000+int64(i) {
			t.Fatalf("record %q: key %q timestamp %d", r.Value, r.Key, r.Timestamp.UnixMilli())
		}
		if p, ok := part[string(r.Key)]; ok && p != r.Partition {
			t.Fatalf("key %q in partitions %d and %d", r.Key, p, r.Partition)
		}
		part[string(r.Key)] = r.Partition
	}
}

// crash is the error a fail hook returns to stop a commit as a crash would.
var crash = errors.New("crash")

// TestSinkRestoreCommitsExactlyOnce: the job fails between checkpoint 1's
// completion and the end of the sink's commit, at every point of it (before
// the commit, after the records, after the marker, after the transaction
// ended), and a restore from checkpoint 1 commits its records exactly once;
// a second restore from it commits nothing more.
func TestSinkRestoreCommitsExactlyOnce(t *testing.T) {
	for _, point := range []string{"before", hookProduced, hookMarked, "after"} {
		t.Run(point, func(t *testing.T) {
			c := kafkatest.Start(t)
			c.CreateTopic(t, "out", 2)
			recs := recsN("r", 30)
			s1 := openSink(t, c, "out", 0, 1)
			s1.Write(recs)
			state, err := s1.PreCommit(1)
			if err != nil {
				t.Fatal(err)
			}
			switch point {
			case "before":
			case "after":
				if err := commitNow(s1, 1); err != nil {
					t.Fatal(err)
				}
			default:
				s1.failHook = func(p string, _ *entry) error {
					if p == point {
						return crash
					}
					return nil
				}
				if err := commitNow(s1, 1); !errors.Is(err, crash) {
					t.Fatalf("commit with a crash at %s: %v", point, err)
				}
			}
			s1.Close()
			for attempt := 2; attempt <= 3; attempt++ {
				s := openSink(t, c, "out", 0, 1)
				if err := s.CommitPending([][]byte{state}); err != nil {
					t.Fatalf("attempt %d: %v", attempt, err)
				}
				s.Close()
				exactlyOnce(t, c, "out", valuesOf(recs))
			}
		})
	}
}

// TestSinkWithoutMarkerDuplicates is the same restore as above after a
// commit that ended, with the marker check left out: the records are
// produced twice. So the marker is what makes the restore exactly once.
func TestSinkWithoutMarkerDuplicates(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 2)
	recs := recsN("r", 30)
	s1 := openSink(t, c, "out", 0, 1)
	s1.Write(recs)
	state, err := s1.PreCommit(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := commitNow(s1, 1); err != nil {
		t.Fatal(err)
	}
	s1.Close()
	s2 := openSink(t, c, "out", 0, 1)
	s2.skipMarkerCheck = true
	if err := s2.CommitPending([][]byte{state}); err != nil {
		t.Fatal(err)
	}
	got := committed(t, c, "out")
	if len(got) != 2*len(recs) {
		t.Fatalf("without the marker check the restore left %d records, want the %d twice", len(got), len(recs))
	}
}

// TestSinkPartlyCommittedState: a checkpoint holds two entries, the first
// committed before the failure; the restore commits only the second.
func TestSinkPartlyCommittedState(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 2)
	a, b := recsN("a", 10), recsN("b", 10)
	s1 := openSink(t, c, "out", 0, 1)
	s1.Write(a)
	s1.PreCommit(1)
	s1.Write(b)
	state, _ := s1.PreCommit(2) // checkpoint 1's commit is late: both entries
	s1.failHook = func(_ string, e *entry) error {
		if e.epoch == 2 {
			return crash
		}
		return nil
	}
	if err := commitNow(s1, 2); !errors.Is(err, crash) {
		t.Fatalf("commit: %v", err)
	}
	s1.Close()
	// Opening the writer again aborts the transaction the crash left open.
	s2 := openSink(t, c, "out", 0, 1)
	exactlyOnce(t, c, "out", valuesOf(a))
	if err := s2.CommitPending([][]byte{state}); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, "out", valuesOf(a, b))
}

// TestSinkZombieIsFenced: a subtask of a failed attempt goes on (a
// zombie) while the restored attempt opens the same writer. The zombie's
// transaction, open when the new attempt opens, is aborted, and its commit
// fails; the restored attempt commits the checkpoint exactly once.
func TestSinkZombieIsFenced(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 2)
	recs := recsN("r", 30)
	zombie := openSink(t, c, "out", 0, 1)
	zombie.Write(recs)
	state, err := zombie.PreCommit(1)
	if err != nil {
		t.Fatal(err)
	}
	// The zombie is in its transaction (records produced, marker added)
	// when the new attempt opens.
	marked, resume := make(chan struct{}), make(chan struct{})
	zombie.failHook = func(p string, _ *entry) error {
		if p == hookMarked {
			close(marked)
			<-resume
		}
		return nil
	}
	zerr := make(chan error, 1)
	go func() { zerr <- commitNow(zombie, 1) }()
	<-marked
	restored := openSink(t, c, "out", 0, 1) // fences the zombie
	close(resume)
	if err := <-zerr; err == nil {
		t.Fatal("the zombie committed after a new attempt opened its writer")
	} else {
		t.Logf("zombie: %v", err)
	}
	if err := restored.CommitPending([][]byte{state}); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, "out", valuesOf(recs))

	// A zombie that had not begun is fenced as well.
	zombie2 := openSink(t, c, "out", 0, 1)
	zombie2.Write(recsN("z", 5))
	zombie2.PreCommit(2)
	restored2 := openSink(t, c, "out", 0, 1)
	if err := commitNow(zombie2, 2); err == nil {
		t.Fatal("a fenced writer committed")
	}
	if err := restored2.CommitPending(nil); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, "out", valuesOf(recs))
}

// TestSinkRescaleRestore: three writers, one of which committed; restored
// at parallelism 2 (old j to new j mod 2) every entry is committed once,
// under its own writer.
func TestSinkRescaleRestore(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 4)
	var states [][]byte
	var all [][]abi.Record
	for w := range 3 {
		s := openSink(t, c, "out", w, 3)
		recs := recsN("w"+strconv.Itoa(w), 20)
		all = append(all, recs)
		s.Write(recs)
		st, err := s.PreCommit(7)
		if err != nil {
			t.Fatal(err)
		}
		if w == 1 {
			if err := commitNow(s, 7); err != nil {
				t.Fatal(err)
			}
		}
		states = append(states, st)
		s.Close()
	}
	for round := range 2 { // the second round restores again: nothing new
		for i := range 2 {
			var mine [][]byte
			for j, st := range states {
				if j%2 == i {
					mine = append(mine, st)
				}
			}
			s := openSink(t, c, "out", i, 2)
			if err := s.CommitPending(mine); err != nil {
				t.Fatalf("round %d subtask %d: %v", round, i, err)
			}
			s.Close()
		}
		exactlyOnce(t, c, "out", valuesOf(all...))
	}
}

func TestSinkStateRoundTrip(t *testing.T) {
	es := []*entry{{writer: 2, epoch: 9, n: 1}, {writer: 0, epoch: 10}}
	var b stagedBuf
	b.add(abi.Record{Key: []byte("k"), Value: []byte("v"), Timestamp: abi.NoTimestamp})
	es[0].data = b.records()
	es[0].nonce[3] = 7
	got, err := decodeEntries(encodeEntries(es))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(*got[0], *got[1]) != fmt.Sprint(*es[0], *es[1]) {
		t.Errorf("round trip: %v, want %v", got, es)
	}
	for _, bad := range [][]byte{nil, {2, 0, 0, 0, 0}, encodeEntries(es)[:20]} {
		if _, err := decodeEntries(bad); err == nil {
			t.Errorf("%x decodes", bad)
		}
	}
	if n := markerNonce(markerMetadata(es[0])); n != "00000007000000000000000000000000" {
		t.Errorf("marker nonce %q", n)
	}
}

// TestSinkStateInPlace: the state of a checkpoint whose only pending entry
// is the one it sealed is the staged buffer itself with its header filled
// in, byte for byte what encodeEntries writes, and the records written
// after it do not change it.
func TestSinkStateInPlace(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 2)
	s := openSink(t, c, "out", 0, 1)
	if err := s.Write(recsN("a", 30)); err != nil {
		t.Fatal(err)
	}
	st, err := s.PreCommit(1)
	if err != nil {
		t.Fatal(err)
	}
	if want := encodeEntries(s.pending); !bytes.Equal(st, want) {
		t.Fatalf("state of one entry differs from encodeEntries'")
	}
	before := bytes.Clone(st)
	if err := s.Write(recsN("b", 30)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreCommit(2); err != nil {
		t.Fatal(err)
	}
	es, err := decodeEntries(st)
	if err != nil || !bytes.Equal(st, before) || len(es) != 1 || es[0].n != 30 || es[0].epoch != 1 {
		t.Fatalf("checkpoint 1's state changed after later writes (%v)", err)
	}
	// Neither is committed: the state in parts holds both, their records
	// where they were staged.
	parts, err := s.PreCommitParts(3)
	if err != nil {
		t.Fatal(err)
	}
	if es, err = decodeEntries(slices.Concat(parts...)); err != nil || len(es) != 2 || es[0].epoch != 1 || es[1].epoch != 2 || es[1].n != 30 {
		t.Fatalf("state in parts: %d entries (%v)", len(es), err)
	}
	for i, e := range s.pending {
		if len(parts) != 4 || unsafe.SliceData(parts[2*i+1]) != unsafe.SliceData(e.data) {
			t.Fatalf("entry %d of the state in parts is a copy", i)
		}
	}
}

func TestSinkCommitFinal(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 1)
	s := openSink(t, c, "out", 0, 1)
	recs := recsN("f", 10)
	s.Write(recs)
	if err := s.CommitFinal(); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, "out", valuesOf(recs))
}

func TestAtLeastOnceSink(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 2)
	cfg := sinkConfig(c, "out")
	cfg.Delivery = AtLeastOnce
	s, err := NewAnySink(testCtx(t), cfg, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*AtLeastOnceSink); !ok {
		t.Fatalf("NewAnySink gave %T", s)
	}
	recs := recsN("a", 40)
	if err := s.Write(recs); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, "out", valuesOf(recs))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSinkMissingTopic(t *testing.T) {
	c := kafkatest.Start(t)
	_, err := NewSink(testCtx(t), sinkConfig(c, "nope"), 0, 1)
	if err == nil || !strings.Contains(err.Error(), `topic "nope"`) {
		t.Errorf("missing topic: %v", err)
	}
	_ = kgo.Record{}
}

// commitNow is Commit(id) and the wait for its background commit: the
// commit's error.
func commitNow(s *Sink, id int64) error {
	if err := s.Commit(id); err != nil {
		return err
	}
	return s.wait()
}

// TestSinkCommitsInTheBackground: Commit returns while its transaction is
// still open; a checkpoint taken meanwhile still holds the entry being
// committed (a restore from it finds it in Kafka by its marker or commits
// it); the next Commit waits for the running one.
func TestSinkCommitsInTheBackground(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 3)
	s := openSink(t, c, "out", 0, 1)
	r1, r2 := recsN("a", 50), recsN("b", 20)
	inTxn, release := make(chan struct{}), make(chan struct{})
	s.failHook = func(p string, e *entry) error {
		if p == hookProduced && e.epoch == 1 {
			close(inTxn)
			<-release
		}
		return nil
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Write(r1))
	_, err := s.PreCommit(1)
	must(err)
	must(s.Commit(1))
	<-inTxn // Commit returned; its transaction is open
	must(s.Write(r2))
	st, err := s.PreCommit(2)
	must(err)
	es, err := decodeEntries(st)
	must(err)
	if len(es) != 2 || es[0].epoch != 1 || es[1].epoch != 2 {
		t.Fatalf("checkpoint 2 during the commit of 1 holds %d entries, want epochs 1 and 2", len(es))
	}
	close(release)
	must(commitNow(s, 2))
	exactlyOnce(t, c, "out", valuesOf(r1, r2))
	if s.Pending() != 0 {
		t.Errorf("%d entries pending after both commits", s.Pending())
	}
}

// TestSinkLiveTransaction: once checkpoints come often, Write produces an
// epoch's records into the open transaction of its entry (goLive), which
// a read_committed reader does not see before the commit. Committed, each
// record is in Kafka once; a live transaction grown too old is aborted
// and its entry produced anew; and a crash with a live transaction open
// (its entry in a checkpoint, not committed) is restored exactly once: the
// new holder of the transactional id aborts it, the restore commits the
// entry, and the zombie's commit fails.
func TestSinkLiveTransaction(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 3)
	cfg := sinkConfig(c, "out")
	// Long enough that the epochs of a loaded machine count as frequent.
	cfg.TransactionTimeout = 5 * time.Minute
	s, err := NewSink(testCtx(t), cfg, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// uncommitted is how many records the topic holds that a
	// read_committed reader does not see yet (high watermarks minus last
	// stable offsets).
	adm := kadm.NewClient(c.Client(t))
	uncommitted := func() int64 {
		t.Helper()
		hw, err := adm.ListEndOffsets(testCtx(t), "out")
		must(err)
		lso, err := adm.ListCommittedOffsets(testCtx(t), "out")
		must(err)
		var n int64
		hw.Each(func(o kadm.ListedOffset) {
			l, _ := lso.Lookup(o.Topic, o.Partition)
			n += o.Offset - l.Offset
		})
		return n
	}
	epochs := [][]abi.Record{recsN("a", 30), recsN("b", 30), recsN("c", 40), recsN("d", 25), recsN("e", 35)}
	checkpoint := func(id int64) []byte {
		t.Helper()
		st, err := s.PreCommit(id)
		must(err)
		return st
	}
	// Epochs 1 and 2 time the epochs: no live transaction yet.
	for i, recs := range epochs[:2] {
		must(s.Write(recs))
		if s.live != nil {
			t.Fatalf("epoch %d: a live transaction before the epochs are timed", i+1)
		}
		checkpoint(int64(i + 1))
		must(commitNow(s, int64(i+1)))
	}
	// Epoch 3 is produced as written, committed at its checkpoint.
	must(s.Write(epochs[2][:20]))
	if s.live == nil {
		t.Fatal("epoch 3: no live transaction although checkpoints come often")
	}
	must(s.Write(epochs[2][20:]))
	must(s.cl.Flush(testCtx(t)))
	if n := uncommitted(); n != 40 {
		t.Fatalf("epoch 3 written, not committed: %d records in Kafka a reader does not see, want its 40", n)
	}
	checkpoint(3)
	must(commitNow(s, 3))
	exactlyOnce(t, c, "out", valuesOf(epochs[:3]...))
	// Epoch 4's live transaction grows too old: it is no longer filled,
	// the commit aborts it and produces the entry anew.
	must(s.Write(epochs[3][:10]))
	if s.live == nil {
		t.Fatal("epoch 4: no live transaction")
	}
	s.live.start = s.live.start.Add(-s.cfg.TransactionTimeout)
	must(s.Write(epochs[3][10:]))
	if !s.live.stale {
		t.Fatal("epoch 4: a live transaction older than the timeout is still filled")
	}
	checkpoint(4)
	must(commitNow(s, 4))
	exactlyOnce(t, c, "out", valuesOf(epochs[:4]...))
	// Epoch 5: live, in a checkpoint, then the process "crashes" before
	// the commit; the restore commits it once, the zombie cannot.
	must(s.Write(epochs[4]))
	if s.live == nil {
		t.Fatal("epoch 5: no live transaction")
	}
	state := checkpoint(5)
	s2 := openSink(t, c, "out", 0, 1)
	must(s2.CommitPending([][]byte{state}))
	if err := commitNow(s, 5); err == nil {
		t.Error("the zombie committed its live transaction after the restore fenced it")
	}
	exactlyOnce(t, c, "out", valuesOf(epochs...))
}

// TestSinkLiveFromTheStart: a sink told the job's checkpoint interval
// (short against the transaction timeout) produces its first epoch into a
// live transaction, before it timed an epoch; one told an interval too
// long for a transaction to wait does not. Committed, each record is in
// Kafka once.
func TestSinkLiveFromTheStart(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "out", 2)
	for _, tc := range []struct {
		interval time.Duration
		live     bool
	}{{200 * time.Millisecond, true}, {time.Hour, false}} {
		cfg := sinkConfig(c, "out")
		cfg.Operator += tc.interval.String() // a writer of its own
		cfg.CheckpointInterval = tc.interval
		s, err := NewSink(testCtx(t), cfg, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		recs := recsN(tc.interval.String(), 20)
		if err := s.Write(recs); err != nil {
			t.Fatal(err)
		}
		if (s.live != nil) != tc.live {
			t.Fatalf("interval %v: live transaction %v, want %v", tc.interval, s.live != nil, tc.live)
		}
		if _, err := s.PreCommit(1); err != nil {
			t.Fatal(err)
		}
		if err := commitNow(s, 1); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	exactlyOnce(t, c, "out", valuesOf(recsN("200ms", 20), recsN("1h0m0s", 20)))
}
