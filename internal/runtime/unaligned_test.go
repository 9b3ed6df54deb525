package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// The tests of this file are in the shape of Flink's
// UnalignedCheckpointITCase: sources at p=4 that finish at different times
// while unaligned checkpoints run under back-pressure (a slow stage, one of
// its subtasks slower than the rest), a failure injected after the short
// sources finished, rebalanced and keyed edges; checked: no record lost or
// duplicated (a keyed running count, exactly once in the committed output),
// none out of order per channel and per key (order checkers on the way),
// and the same after a restore at another parallelism.

// seqLog collects the order violations the checkers saw.
type seqLog struct {
	mu  sync.Mutex
	bad []string
	n   atomic.Int64 // records checked
}

func (l *seqLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bad) < 20 {
		l.bad = append(l.bad, fmt.Sprintf(format, args...))
	}
}

func (l *seqLog) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bad) > 0 {
		t.Fatalf("records out of order:\n%s", strings.Join(l.bad, "\n"))
	}
	if l.n.Load() == 0 {
		t.Fatal("the order checkers saw no record")
	}
}

// seqOf parses the generator's n out of a value "<prefix>-<n>[@m]".
func seqOf(v []byte) (prefix string, n int64, via string, err error) {
	s := string(v)
	if i := strings.IndexByte(s, '@'); i >= 0 {
		s, via = s[:i], s[i+1:]
	}
	i := strings.IndexByte(s, '-')
	if i < 0 {
		return "", 0, "", fmt.Errorf("value %q: no sequence number", v)
	}
	n, err = strconv.ParseInt(s[i+1:], 10, 64)
	return s[:i], n, via, err
}

// slowStage is a stateless map with two inputs: it checks that the records
// of each source subtask arrive in order on each channel (the generator's
// subtask s of p produces n = s, s+p, ...: n mod 4 names it), sleeps per
// batch (subtask 0 three times longer: the skewed one) and tags each value
// with its subtask ("@m"), so the checker downstream knows the channel.
// With perKey (a rescaled restore) the order is checked per key and source
// subtask, on the keyed input only: a channel replays first the in-flight
// records of several old channels one after the other, which keeps the
// order of each key behind a hash edge (and of each old channel), not that
// across keys; behind the rebalance edge the records of one key went to
// several old channels, whose replays are not ordered among themselves
// (rebalance promises no order across subtasks).
type slowStage struct {
	noop
	perKey bool
	log    *seqLog
	sub    int
	delay  time.Duration
	last   map[string]int64 // "<prefix>/<s>" -> last n
	out    []abi.Record
	buf    []byte
}

func newSlowStage(log *seqLog, delay time.Duration, perKey bool) NativeFactory {
	return func(info SubtaskInfo) NativeOperator {
		d := delay
		if info.Subtask == 0 {
			d *= 3
		}
		return &slowStage{log: log, sub: info.Subtask, delay: d, last: map[string]int64{}, perKey: perKey}
	}
}

func (s *slowStage) Process(_ context.Context, input int, recs []abi.Record, emit Emitter) error {
	time.Sleep(s.delay)
	s.out, s.buf = s.out[:0], s.buf[:0]
	for _, r := range recs {
		prefix, n, _, err := seqOf(r.Value)
		if err != nil {
			return err
		}
		k := fmt.Sprintf("%s/%d", prefix, n%4)
		if s.perKey {
			k += "/" + string(r.Key)
		}
		if s.perKey && input == 0 {
			// rebalanced: no order across the old channels
		} else if last, ok := s.last[k]; ok && n <= last {
			s.log.add("slow[%d] input %d: %s-%d after %s-%d from the same source subtask", s.sub, input, prefix, n, prefix, last)
		}
		s.last[k] = n
		s.log.n.Add(1)
		s.buf = fmt.Appendf(s.buf, "%s@%d", r.Value, s.sub)
	}
	off := 0
	for _, r := range recs {
		n := len(r.Value) + 1 + len(strconv.Itoa(s.sub))
		s.out = append(s.out, abi.Record{Key: r.Key, Value: s.buf[off : off+n], Timestamp: r.Timestamp})
		off += n
	}
	emit(s.out)
	return nil
}

// keyOrder checks, behind a keyed edge, that the records of each key from
// each source subtask through each slow subtask arrive in order; records
// whose value starts with skip (those of a rebalanced input replayed after
// a rescaled restore: slowStage) are not checked.
type keyOrder struct {
	noop
	log  *seqLog
	sub  int
	skip string
	last map[string]int64
}

func newKeyOrder(log *seqLog, skip string) NativeFactory {
	return func(info SubtaskInfo) NativeOperator {
		return &keyOrder{log: log, sub: info.Subtask, skip: skip, last: map[string]int64{}}
	}
}

func (o *keyOrder) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	for _, r := range recs {
		prefix, n, via, err := seqOf(r.Value)
		if err != nil {
			return err
		}
		k := fmt.Sprintf("%s/%s/%d/%s", r.Key, prefix, n%4, via)
		if o.skip != "" && prefix == o.skip {
			continue
		}
		if last, ok := o.last[k]; ok && n <= last {
			o.log.add("check[%d] key %s: %s-%d after %s-%d from the same source subtask through slow[%s]", o.sub, r.Key, prefix, n, prefix, last, via)
		}
		o.last[k] = n
	}
	emit(recs)
	return nil
}

// unalignedGraph: short (p=4) -rebalance-> slow <-hash- long (p=4);
// slow -hash-> check -hash-> count (failonce, keyed running count) -rebalance-> out.
func unalignedGraph(t *testing.T, p int, log *seqLog, failAt int, out string, perKey bool) *control.JobGraph {
	const keys = 40
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	short := &jobfile.SourceSpec{Type: "generator", Count: 4000, Rate: 20000, KeyPattern: "key-{k}", ValuePattern: "s-{n}", Keys: keys, TSStep: 1}
	long := &jobfile.SourceSpec{Type: "generator", Count: 24000, Rate: 20000, KeyPattern: "key-{k}", ValuePattern: "l-{n}", Keys: keys, TSStep: 1}
	return graph(t,
		src("short", 4, short),
		src("long", 4, long),
		op("slow", p, newSlowStage(log, 3*time.Millisecond, perKey), control.Edge{From: "short", Partition: control.Rebalance, Input: 0}, control.Edge{From: "long", Partition: control.Hash, Input: 1}),
		op("check", p, newKeyOrder(log, map[bool]string{true: "s"}[perKey]), in("slow", control.Hash)),
		op("count", p, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"fail_at": strconv.Itoa(failAt), "mode": "count"}}, in("check", control.Hash)),
		sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("count", control.Rebalance)),
	)
}

// wantCounts is the committed output of an exactly-once run: every count
// 1..N of every key.
func wantCounts() []string {
	per := map[string]int{}
	var want []string
	for _, c := range []struct {
		count int64
	}{{4000}, {24000}} {
		for n := int64(0); n < c.count; n++ {
			k := fmt.Sprintf("key-%d", n%40)
			per[k]++
			_ = k
		}
	}
	for k, n := range per {
		for i := 1; i <= n; i++ {
			want = append(want, fmt.Sprintf("%s=%d", k, i))
		}
	}
	return want
}

func TestUnalignedCheckpointsExactlyOnce(t *testing.T) {
	for _, c := range []struct {
		name    string
		mode    control.AlignmentMode
		timeout time.Duration
	}{
		{"unaligned", control.AlignUnaligned, 0},
		{"aligned_timeout", control.AlignAligned, time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			log := &seqLog{}
			// count's subtasks see about 7000 records each; the short
			// sources end after about a fifth of the run.
			g := unalignedGraph(t, 4, log, 4000, out, false)
			var mu sync.Mutex
			var inflight []int64
			var afterShort bool
			stats, err := Run(context.Background(), g, Options{
				Engine: cachedEngine(t), BatchSize: 64, ChannelCapacity: 4,
				Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 40 * time.Millisecond, Tick: 5 * time.Millisecond,
					Mode: c.mode, AlignedTimeout: c.timeout,
					OnComplete: func(md *checkpoint.Metadata) {
						mu.Lock()
						defer mu.Unlock()
						inflight = append(inflight, md.InFlightBytes())
						if om := md.Operator("short"); om != nil && om.Finished == control.OperatorFullyFinished {
							afterShort = true
						}
					}},
				Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
			})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Restarts != 1 {
				t.Fatalf("restarts %d, want 1 (the injected failure)", stats.Restarts)
			}
			checkExactlyOnce(t, committed(t, out), wantCounts())
			log.check(t)
			mu.Lock()
			defer mu.Unlock()
			var total int64
			with := 0
			for _, b := range inflight {
				total += b
				if b > 0 {
					with++
				}
			}
			if with == 0 {
				t.Fatalf("%d checkpoints, none with in-flight records: the barriers overtook nothing", len(inflight))
			}
			if !afterShort {
				t.Fatalf("no checkpoint completed after the short sources finished")
			}
			t.Logf("%d checkpoints, %d with channel state (%d bytes in all), elapsed %v", len(inflight), with, total, stats.Elapsed)
		})
	}
}

// TestUnalignedRestoreRescaled: an unaligned checkpoint with in-flight
// records, taken while the short sources had finished, restores with the
// operators behind the sources at parallelism 3 and 5: the in-flight
// records are redistributed by their edges' partitioning and the output
// of both runs together is exactly once.
func TestUnalignedRestoreRescaled(t *testing.T) {
	for _, p := range []int{3, 5} {
		t.Run(fmt.Sprintf("p%d", p), func(t *testing.T) {
			dir := t.TempDir()
			out, chk := filepath.Join(dir, "out"), filepath.Join(dir, "chk")
			log := &seqLog{}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var taken *checkpoint.Metadata
			stop := errors.New("test: a checkpoint with in-flight records after the short sources finished")
			_, err := Run(ctx, unalignedGraph(t, 4, log, 0, out, false), Options{
				Engine: cachedEngine(t), BatchSize: 64, ChannelCapacity: 4,
				Checkpoint: &CheckpointOptions{Store: openStore(t, chk), Interval: 40 * time.Millisecond, Tick: 5 * time.Millisecond,
					Mode: control.AlignUnaligned,
					OnComplete: func(md *checkpoint.Metadata) {
						om := md.Operator("short")
						if taken == nil && md.InFlightBytes() > 0 && om != nil && om.Finished == control.OperatorFullyFinished {
							taken = md
							cancel(stop)
						}
					}},
			})
			if !errors.Is(err, stop) && !errors.Is(context.Cause(ctx), stop) {
				t.Fatalf("first run: %v (no checkpoint with in-flight records after the short sources finished?)", err)
			}
			if taken == nil {
				t.Fatal("no checkpoint with in-flight records")
			}
			g := unalignedGraph(t, p, log, 0, out, true)
			rs, err := checkpoint.LoadRestore(context.Background(), taken.Location, g)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, sr := range rs.Subtasks {
				for _, cd := range sr.InFlight {
					n += len(cd.Elements)
				}
			}
			if n == 0 {
				t.Fatalf("checkpoint %d: %d bytes in flight, but nothing to replay", taken.ID, taken.InFlightBytes())
			}
			if _, err := Run(context.Background(), g, Options{
				Engine: cachedEngine(t), BatchSize: 64, ChannelCapacity: 4, Restore: rs,
				Checkpoint: &CheckpointOptions{Store: openStore(t, chk), Interval: 40 * time.Millisecond, Tick: 5 * time.Millisecond, Mode: control.AlignUnaligned},
			}); err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, committed(t, out), wantCounts())
			log.check(t)
			t.Logf("restored checkpoint %d (%d bytes, %d elements in flight) at p=%d", taken.ID, taken.InFlightBytes(), n, p)
		})
	}
}

// TestUnalignedRefusesForwardRescale: in-flight records on a forward edge
// restore only at unchanged parallelism; otherwise the restore is refused
// before anything runs, naming the edge.
func TestUnalignedRefusesForwardRescale(t *testing.T) {
	dir := t.TempDir()
	out, chk := filepath.Join(dir, "out"), filepath.Join(dir, "chk")
	log := &seqLog{}
	mk := func(p int) *control.JobGraph {
		gen := &jobfile.SourceSpec{Type: "generator", Count: 40000, Rate: 40000, KeyPattern: "key-{k}", ValuePattern: "l-{n}", Keys: 40, TSStep: 1}
		// The slow stage behind the forward edge back-pressures it: its
		// channels are full when the barriers come.
		return graph(t,
			src("long", 4, gen),
			op("check", p, newKeyOrder(log, ""), in("long", control.Hash)),
			op("slow", p, newSlowStage(log, 3*time.Millisecond, false), in("check", control.Forward)),
			sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("slow", control.Forward)),
		)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var taken *checkpoint.Metadata
	_, _ = Run(ctx, mk(4), Options{
		Engine: cachedEngine(t), BatchSize: 64, ChannelCapacity: 4,
		Checkpoint: &CheckpointOptions{Store: openStore(t, chk), Interval: 30 * time.Millisecond, Tick: 5 * time.Millisecond, Mode: control.AlignUnaligned,
			OnComplete: func(md *checkpoint.Metadata) {
				if taken == nil && forwardInFlight(md) {
					taken = md
					cancel(errors.New("test: done"))
				}
			}},
	})
	if taken == nil {
		t.Fatal("no checkpoint with in-flight records on the forward edge")
	}
	_, err := checkpoint.LoadRestore(context.Background(), taken.Location, mk(2))
	// Both edges behind the source are forward; the refusal names one that
	// holds in-flight records.
	if err == nil || !strings.Contains(err.Error(), "is forward") ||
		!strings.Contains(err.Error(), `"check" -> "slow"`) && !strings.Contains(err.Error(), `"slow" -> "out"`) {
		t.Fatalf("restore at p=2: %v, want a refusal naming a forward edge (check -> slow or slow -> out)", err)
	}
	if _, err := checkpoint.LoadRestore(context.Background(), taken.Location, mk(4)); err != nil {
		t.Fatalf("restore at the same parallelism: %v", err)
	}
	_ = os.RemoveAll(out)
}

// forwardInFlight reports whether md's "slow" subtasks hold channel state
// (their only input is the forward edge from check).
func forwardInFlight(md *checkpoint.Metadata) bool {
	om := md.Operator("slow")
	return om != nil && slices.ContainsFunc(om.Subtasks, func(s checkpoint.SubtaskMeta) bool { return s.InFlightBytes > 0 })
}

// TestTimedOutputOvertakes: with metrics on, outputs are wrapped to time
// back-pressure; the wrapper still lets unaligned sends through without
// waiting for room.
func TestTimedOutputOvertakes(t *testing.T) {
	c := dataplane.NewLocalChannel("a[0]->b[0]", 1)
	o := timedOutput{Output: c.Output()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := o.Send(ctx, dataplane.WatermarkEvent(1)); err != nil {
		t.Fatal(err)
	}
	// The channel is full: a Send would wait; SendNow must not.
	if err := dataplane.SendNow(ctx, o, dataplane.BarrierEvent(dataplane.Barrier{ID: 1, Unaligned: true})); err != nil {
		t.Fatalf("SendNow through the metrics wrapper: %v", err)
	}
	if c.Len() != 2 {
		t.Fatalf("%d queued, want 2 (past the capacity of 1)", c.Len())
	}
}

// TestUnalignedLargeRecordsInFlight is issue 24's pipeline: 20 KB records,
// generator -hash-> Rust uppercase -> discard, p=2, unaligned checkpoints,
// the source unthrottled so records queue. A checkpoint completes with
// in-flight records, and its channel state holds them intact: the records
// are held in their batches, not copied, until written, so a batch reused
// too early would show as a foreign record. Every record is a generator
// record (value-N padded with dots, upper-cased after the map), on a channel
// from a generator subtask in increasing order, and the in-flight bytes
// cover the records stored.
func TestUnalignedLargeRecordsInFlight(t *testing.T) {
	const valueSize = 20000
	wasm := testwasm.Path(t, "examples/wasm/uppercase-rust/uppercase_rust.wasm")
	g := graph(t,
		src("gen", 2, &jobfile.SourceSpec{Type: "generator", Count: 1_000_000, KeyPattern: "key-{k}", ValuePattern: "value-{n}",
			Keys: 1000, ValueSize: valueSize, TSStep: 1}),
		op("upper", 2, &jobfile.WasmSpec{Path: wasm}, in("gen", control.Hash)),
		sink("out", 2, &jobfile.SinkSpec{Type: "discard"}, in("upper", control.Forward)),
	)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop := errors.New("test: a checkpoint with in-flight records")
	var taken *checkpoint.Metadata
	_, err := Run(ctx, g, Options{Engine: cachedEngine(t), BatchSize: 16, ChannelCapacity: 4,
		Checkpoint: &CheckpointOptions{Store: openStore(t, t.TempDir()), Interval: 100 * time.Millisecond, Mode: control.AlignUnaligned,
			OnComplete: func(md *checkpoint.Metadata) {
				if taken == nil && md.InFlightBytes() > 0 {
					taken = md
					cancel(stop)
				}
			}}})
	if taken == nil {
		t.Fatalf("no checkpoint with in-flight records before the run ended: %v", err)
	}
	rs, err := checkpoint.LoadRestore(context.Background(), taken.Location, g)
	if err != nil {
		t.Fatal(err)
	}
	var records, bytes int64
	for to, sr := range rs.Subtasks {
		for _, cd := range sr.InFlight {
			last := int64(-1)
			for i, e := range cd.Elements {
				if e.Kind != checkpoint.ElementRecord {
					continue
				}
				records++
				bytes += int64(len(e.Record.Key) + len(e.Record.Value))
				v := string(e.Record.Value)
				digits := strings.TrimRight(strings.TrimPrefix(strings.TrimPrefix(v, "value-"), "VALUE-"), ".")
				n, perr := strconv.ParseInt(digits, 10, 64)
				if len(v) != valueSize || perr != nil || !strings.HasPrefix(strings.ToLower(v), "value-") {
					t.Fatalf("checkpoint %d, channel %s[%d] -> %v: element %d is not a generator record: %.40q... (%d bytes)", taken.ID, cd.Operator, cd.Subtask, to, i, v, len(v))
				}
				// A channel from a generator subtask carries its records
				// in order (a map subtask's output interleaves two).
				if cd.Operator == "gen" && n <= last {
					t.Fatalf("checkpoint %d, channel %s[%d] -> %v: element %d is record %d after %d: the channel state is not the channel's records in order", taken.ID, cd.Operator, cd.Subtask, to, i, n, last)
				}
				last = n
			}
		}
	}
	if records == 0 || taken.InFlightBytes() < bytes {
		t.Fatalf("checkpoint %d: %d in-flight bytes, %d records (%d bytes) in its channel state", taken.ID, taken.InFlightBytes(), records, bytes)
	}
	t.Logf("checkpoint %d: %d records, %d bytes in flight", taken.ID, records, taken.InFlightBytes())
}
