package dataplane

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
)

func rec(key, value string, ts int64) abi.Record {
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	return abi.Record{Key: k, Value: []byte(value), Timestamp: ts}
}

func TestHashTargetAgreesWithKeyGroupRanges(t *testing.T) {
	for _, maxPar := range []int{1, 7, 128, 1000} {
		for p := 1; p <= maxPar && p <= 17; p++ {
			for i := 0; i < 2000; i++ {
				key := fmt.Sprintf("key-%d", i)
				r := rec(key, "v", 0)
				got := HashTarget(r, maxPar, p)
				kg := abi.KeyGroup([]byte(key), maxPar)
				if rg := abi.RangeForSubtask(got, maxPar, p); !rg.Contains(kg) {
					t.Fatalf("maxPar %d p %d key %q: key group %d sent to subtask %d owning %s", maxPar, p, key, kg, got, rg)
				}
				// No key: the value decides.
				nk := rec("", key, 0)
				if HashTarget(nk, maxPar, p) != got {
					t.Fatalf("record without key %q not partitioned by its value", key)
				}
			}
		}
	}
}

// collect drains a channel's input without a gate.
func drain(t *testing.T, c *LocalChannel) []Event {
	t.Helper()
	var evs []Event
	for {
		ev, ok, err := c.Input().TryRecv()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return evs
		}
		evs = append(evs, ev)
	}
}

func TestPartitionerDistribution(t *testing.T) {
	ctx := context.Background()
	const n, records = 4, 10000
	for _, p := range []Partitioning{Rebalance, Hash, Broadcast} {
		t.Run(p.String(), func(t *testing.T) {
			chans := make([]*LocalChannel, n)
			outs := make([]Output, n)
			for i := range chans {
				chans[i] = NewLocalChannel(fmt.Sprint(i), 1000)
				outs[i] = chans[i].Output()
			}
			w, err := NewRecordWriter(outs, p, WriterOptions{BatchSize: 100, Start: 1})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < records; i++ {
				if err := w.Emit(ctx, rec(fmt.Sprintf("k%d", i%97), fmt.Sprint(i), int64(i))); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Broadcast(ctx, WatermarkEvent(5)); err != nil {
				t.Fatal(err)
			}
			total := 0
			for target, c := range chans {
				evs := drain(t, c)
				last := evs[len(evs)-1]
				if last.Kind != KindWatermark || last.Watermark.TS != 5 {
					t.Fatalf("target %d: last event %s, want watermark(5)", target, last)
				}
				count := 0
				for _, ev := range evs[:len(evs)-1] {
					if ev.Kind != KindRecords {
						t.Fatalf("target %d: unexpected %s before the watermark", target, ev)
					}
					if ev.Batch.Len() > 100 {
						t.Fatalf("batch of %d records > batch size 100", ev.Batch.Len())
					}
					for _, r := range ev.Batch.Records {
						if p == Hash && HashTarget(r, abi.DefaultMaxParallelism, n) != target {
							t.Fatalf("key %s went to %d", r.Key, target)
						}
					}
					count += ev.Batch.Len()
					ev.Batch.Release()
				}
				switch p {
				case Rebalance:
					if count != records/n {
						t.Errorf("rebalance: target %d got %d records, want %d", target, count, records/n)
					}
				case Broadcast:
					if count != records {
						t.Errorf("broadcast: target %d got %d records, want %d", target, count, records)
					}
				case Hash:
					if count == 0 {
						t.Errorf("hash: target %d got no records of 97 keys", target)
					}
				}
				total += count
			}
			want := records
			if p == Broadcast {
				want *= n
			}
			if total != want {
				t.Fatalf("total %d records, want %d", total, want)
			}
		})
	}
}

func TestSequenceGapAndDuplicate(t *testing.T) {
	ctx := context.Background()
	c := NewLocalChannel("a[0]->b[0]", 8)
	for _, seq := range []uint64{1, 2, 4} { // 3 is lost
		if err := c.put(ctx, message{seq: seq, ev: WatermarkEvent(int64(seq))}, true); err != nil {
			t.Fatal(err)
		}
	}
	in := c.Input()
	for i := 0; i < 2; i++ {
		if _, ok, err := in.TryRecv(); !ok || err != nil {
			t.Fatalf("message %d: ok=%v err=%v", i+1, ok, err)
		}
	}
	_, _, err := in.TryRecv()
	if !errors.Is(err, ErrSequence) || !strings.Contains(err.Error(), "gap: got message 4, want 3") {
		t.Fatalf("gap: got %v", err)
	}

	c = NewLocalChannel("dup", 8)
	for _, seq := range []uint64{1, 2, 2} {
		_ = c.put(ctx, message{seq: seq, ev: WatermarkEvent(1)}, true)
	}
	in = c.Input()
	in.TryRecv()
	in.TryRecv()
	if _, _, err := in.TryRecv(); !errors.Is(err, ErrSequence) || !strings.Contains(err.Error(), "duplicate") {
		t.Fatalf("duplicate: got %v", err)
	}

	// The sending side numbers messages 1, 2, 3, ... and refuses to send after EndOfPartition.
	c = NewLocalChannel("ok", 8)
	out := c.Output()
	for _, ev := range []Event{WatermarkEvent(1), EndOfDataEvent(true), EndOfPartitionEvent()} {
		if err := out.Send(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := out.Send(ctx, WatermarkEvent(2)); !errors.Is(err, ErrChannelEnded) {
		t.Fatalf("send after end-of-partition: %v", err)
	}
	if evs := drain(t, c); len(evs) != 3 {
		t.Fatalf("got %d events, want 3", len(evs))
	}
	// A message after EndOfPartition is refused by the receiver too.
	_ = c.put(ctx, message{seq: 4, ev: WatermarkEvent(3)}, true)
	if _, _, err := c.Input().TryRecv(); !errors.Is(err, ErrChannelEnded) {
		t.Fatalf("receive after end-of-partition: %v", err)
	}
}

// TestFlushExpired: a pending batch goes out not full once its first
// record is the buffer timeout old (as of the time FlushExpired is given),
// not before; with a negative timeout, only when full or flushed.
func TestFlushExpired(t *testing.T) {
	ctx := context.Background()
	for _, timeout := range []time.Duration{50 * time.Millisecond, -1} {
		c := NewLocalChannel("slow", 16)
		w, err := NewRecordWriter([]Output{c.Output()}, Hash, WriterOptions{BatchSize: 100, BufferTimeout: timeout, MaxParallelism: 4})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := w.Emit(ctx, rec("k", "v1", 1)); err != nil {
			t.Fatal(err)
		}
		if err := w.Emit(ctx, rec("k", "v2", 2)); err != nil {
			t.Fatal(err)
		}
		if err := w.FlushExpired(ctx, start); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := c.Input().TryRecv(); ok {
			t.Fatalf("timeout %v: a batch went out before its first record was the timeout old", timeout)
		}
		if err := w.FlushExpired(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		ev, ok, err := c.Input().TryRecv()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case timeout > 0 && (!ok || ev.Batch.Len() != 2):
			t.Fatalf("timeout %v: after the timeout got %v (ok %v), want the batch of 2 records", timeout, ev, ok)
		case timeout < 0 && ok:
			t.Fatalf("no timeout: a batch of %d records went out not full", ev.Batch.Len())
		}
	}
}

func TestBackPressure(t *testing.T) {
	const capacity = 3
	c := NewLocalChannel("slow", capacity)
	w, err := NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	blocked := make(chan struct{}, 1)
	c.onBlock = func() {
		select {
		case blocked <- struct{}{}:
		default:
		}
	}
	waitBlocked := func(what string) {
		t.Helper()
		select {
		case <-blocked:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no sender blocked on the full channel within 30s", what)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var emitted atomic.Int64
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 1000; i++ {
			if err := w.Emit(ctx, rec("k", "v", int64(i))); err != nil {
				done <- err
				return
			}
			emitted.Add(1)
		}
		done <- w.Flush(ctx)
	}()
	// The producer fills the channel (capacity batches) plus one pending
	// batch, then blocks: once it waits for room, it can emit no more.
	waitBlocked("producer")
	if n := emitted.Load(); n > (capacity+1)*10 || n < capacity*10 {
		t.Fatalf("producer emitted %d records into a channel of %d batches of 10 without a consumer before it blocked", n, capacity)
	}
	if c.Len() != capacity {
		t.Fatalf("channel holds %d batches, want %d (full)", c.Len(), capacity)
	}
	// A slow consumer lets it advance, never past capacity.
	c.onBlock = nil
	g := NewInputGate([]GateChannel{{In: c.Input()}})
	got := 0
	for got < 1000 {
		if c.Len() > capacity {
			t.Fatalf("channel holds %d > %d", c.Len(), capacity)
		}
		_, ev, err := g.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got += ev.Batch.Len()
		ev.Batch.Release()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A blocked sender returns when its context ends.
	for i := 0; i < capacity; i++ {
		_ = c.Output().Send(ctx, WatermarkEvent(int64(i)))
	}
	errc := make(chan error)
	c.onBlock = func() { blocked <- struct{}{} }
	go func() { errc <- c.Output().Send(ctx, WatermarkEvent(99)) }()
	waitBlocked("send after the channel filled")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("blocked send after cancel: %v", err)
	}
}

func TestGateFairAndBlockable(t *testing.T) {
	ctx := context.Background()
	a, b := NewLocalChannel("a", 100), NewLocalChannel("b", 100)
	g := NewInputGate([]GateChannel{{In: a.Input(), Input: 0}, {In: b.Input(), Input: 1}})
	for i := 0; i < 5; i++ {
		_ = a.Output().Send(ctx, WatermarkEvent(int64(i)))
		_ = b.Output().Send(ctx, WatermarkEvent(int64(100+i)))
	}
	var order []int
	for i := 0; i < 4; i++ {
		ch, _, err := g.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, ch)
	}
	if fmt.Sprint(order) != "[0 1 0 1]" {
		t.Fatalf("gate served channels %v, want alternating", order)
	}
	if g.Input(1) != 1 {
		t.Fatalf("input of channel 1 = %d", g.Input(1))
	}
	g.Block(0)
	for i := 0; i < 3; i++ {
		ch, ev, err := g.Next(ctx)
		if err != nil || ch != 1 {
			t.Fatalf("blocked channel 0 served: ch %d %s %v", ch, ev, err)
		}
	}
	// Only the blocked channel has data: Next must not return it.
	if _, _, ok, _ := g.TryNext(); ok {
		t.Fatal("TryNext returned an event of a blocked channel")
	}
	// Unblocking from another goroutine's point of view: a waiting Next wakes
	// when a new message arrives on an unblocked channel.
	go func() {
		time.Sleep(10 * time.Millisecond)
		_ = b.Output().Send(ctx, EndOfPartitionEvent())
	}()
	ch, ev, err := g.Next(ctx)
	if err != nil || ch != 1 || ev.Kind != KindEndOfPartition {
		t.Fatalf("got ch %d %s %v, want end-of-partition of channel 1", ch, ev, err)
	}
	if _, _, err := g.Next(ctx); err == nil || !strings.Contains(err.Error(), "blocked") {
		t.Fatalf("Next with every open channel blocked: %v", err)
	}
	g.Unblock(0)
	ch, ev, err = g.Next(ctx)
	if err != nil || ch != 0 || ev.Watermark.TS != 2 {
		t.Fatalf("after unblock: ch %d %s %v", ch, ev, err)
	}
	_ = a.Output().Send(ctx, EndOfPartitionEvent())
	for {
		_, _, err := g.Next(ctx)
		if errors.Is(err, ErrGateEnded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestWriterFlushesBeforeControlEvents(t *testing.T) {
	ctx := context.Background()
	c := NewLocalChannel("c", 100)
	w, _ := NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{BatchSize: 4})
	for i := 0; i < 6; i++ {
		_ = w.Emit(ctx, rec("", fmt.Sprint(i), 0))
	}
	_ = w.Broadcast(ctx, BarrierEvent(Barrier{ID: 7, Kind: Savepoint, IsSync: true}))
	_ = w.Emit(ctx, rec("", "6", 0))
	_ = w.Broadcast(ctx, EndOfDataEvent(true))
	var got []string
	for _, ev := range drain(t, c) {
		if ev.Kind == KindRecords {
			for _, r := range ev.Batch.Records {
				got = append(got, string(r.Value))
			}
			got = append(got, "|")
			continue
		}
		got = append(got, ev.String())
	}
	want := "0 1 2 3 | 4 5 | barrier(7, savepoint, sync=true) 6 | end-of-data(drain=true)"
	if s := strings.Join(got, " "); s != want {
		t.Fatalf("got  %s\nwant %s", s, want)
	}
}

func TestBatchReuseDoesNotAllocate(t *testing.T) {
	r := rec("key-42", strings.Repeat("x", 100), 1)
	b := GetBatch()
	fill := func() {
		for i := 0; i < 1024; i++ {
			b.Append(r)
		}
		b.Reset()
	}
	fill()
	fill()
	if n := testing.AllocsPerRun(10, fill); n != 0 {
		t.Fatalf("refilling a batch allocates %v times", n)
	}
	b.Append(rec("", "v", 3))
	if b.Records[0].Key != nil || string(b.Records[0].Value) != "v" || b.Records[0].Timestamp != 3 {
		t.Fatalf("record without key: %+v", b.Records[0])
	}
	b.Release()
}

// TestBatchPoolKeepsArenasAcrossGC: a batch released and taken again keeps
// its arena across garbage collections (which empty a sync.Pool), so a
// channel that collects often still fills batches without allocating; and a
// batch whose records aliased a decoded frame drops those references when
// released.
func TestBatchPoolKeepsArenasAcrossGC(t *testing.T) {
	r := rec("key-42", strings.Repeat("x", 100), 1)
	cycle := func() {
		b := GetBatch()
		for i := 0; i < 1024; i++ {
			b.Append(r)
		}
		b.Release()
		runtime.GC()
		runtime.GC()
	}
	cycle()
	cycle()
	if n := testing.AllocsPerRun(5, cycle); n != 0 {
		t.Fatalf("a batch taken again after two collections allocates %v times", n)
	}

	frame := abi.AppendBatch(nil, []abi.Record{r, r})
	b := GetBatch()
	if err := b.DecodeFrame(frame); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 2 || string(b.Records[1].Value) != string(r.Value) {
		t.Fatalf("decoded %d records, want 2 of %q", b.Len(), r.Value)
	}
	recs := b.Records
	b.Release()
	for i, x := range recs {
		if x.Key != nil || x.Value != nil {
			t.Fatalf("record %d still points into the decoded frame after Release", i)
		}
	}
	if err := GetBatch().DecodeFrame(frame[:len(frame)-1]); !errors.Is(err, abi.ErrFrame) {
		t.Fatalf("truncated frame: got %v, want abi.ErrFrame", err)
	}
}

// TestLocalChannelOvertaking: on a full channel SendNow still queues a batch
// and an unaligned barrier; the receiver takes the barrier ahead with the
// records before it, then receives every record in order with no sequence
// error; a wanted ordinary barrier is taken too, and an unaligned one
// overtakes end-of-data.
func TestLocalChannelOvertaking(t *testing.T) {
	ctx := context.Background()
	c := NewLocalChannel("a[0]->b[0]", 2)
	out, in := c.Output(), c.Input().(Overtakable)
	rec := func(v string) Event {
		b := GetBatch()
		b.Append(abi.Record{Value: []byte(v)})
		return RecordsEvent(b)
	}
	for _, v := range []string{"r1", "r2"} {
		if err := out.Send(ctx, rec(v)); err != nil {
			t.Fatal(err)
		}
	}
	if err := SendNow(ctx, out, rec("r3")); err != nil { // full: goes anyway
		t.Fatal(err)
	}
	if err := SendNow(ctx, out, BarrierEvent(Barrier{ID: 7, Unaligned: true})); err != nil {
		t.Fatal(err)
	}
	if !in.Overtaking() {
		t.Fatal("no overtaking barrier flagged")
	}
	var before []string
	b, ok, err := in.TakeBarrier(func(ev Event) { before = append(before, string(ev.Batch.Records[0].Value)) })
	if err != nil || !ok || b.ID != 7 || strings.Join(before, ",") != "r1,r2,r3" {
		t.Fatalf("take: %v %v %+v, before %v; want barrier 7 after r1,r2,r3", err, ok, b, before)
	}
	if in.Overtaking() {
		t.Fatal("still flagged after the take")
	}
	// An ordinary barrier, wanted after it was queued; an unaligned one
	// overtakes the end-of-data queued before it (a finished sender's
	// checkpoints go on while the receiver drains), which is still
	// delivered in order after the records.
	in.WantBarrier(8)
	go func() { // the channel is over capacity: Send waits for the receiver
		_ = out.Send(ctx, rec("r4"))
		_ = out.Send(ctx, BarrierEvent(Barrier{ID: 8}))
		_ = out.Send(ctx, EndOfDataEvent(true))
		_ = out.Send(ctx, BarrierEvent(Barrier{ID: 9, Unaligned: true}))
	}()
	var got []string
	for !slices.Contains(got, "took 9") || !slices.Contains(got, "end-of-data(drain=true)") {
		if in.Overtaking() {
			if b, ok, err := in.TakeBarrier(func(Event) {}); err != nil {
				t.Fatal(err)
			} else if ok {
				got = append(got, fmt.Sprintf("took %d", b.ID))
			}
			continue
		}
		ev, ok, err := c.Input().TryRecv()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		if ev.Kind == KindRecords {
			got = append(got, string(ev.Batch.Records[0].Value))
			ev.Batch.Release()
		} else {
			got = append(got, ev.String())
		}
	}
	// The barriers are queued behind r4 by another goroutine: barrier 8 may
	// be taken before or after r4 is received, or arrive in order when it
	// reaches the head of the queue first; it comes once, before
	// end-of-data. Barrier 9 is taken once, never delivered in order.
	recv := slices.DeleteFunc(slices.Clone(got), func(s string) bool {
		return s == "took 8" || s == "took 9" || strings.HasPrefix(s, "barrier(8,")
	})
	if s := strings.Join(recv, ","); s != "r1,r2,r3,r4,end-of-data(drain=true)" || len(got) != 7 {
		t.Fatalf("received %s, want r1..r4, barrier 8 once, barrier 9 taken, end-of-data", strings.Join(got, ","))
	}
	if ev, ok, err := c.Input().TryRecv(); ok || err != nil {
		t.Fatalf("after end-of-data: %v %v %v, want nothing (barrier 9 was taken)", ev, ok, err)
	}
}

// TestLocalChannelAnnounces: with announcements on, an aligned barrier
// queued behind records is announced at once (Flink's EventAnnouncement),
// once, and still delivered in order; one queued at the head is not.
func TestLocalChannelAnnounces(t *testing.T) {
	ctx := context.Background()
	c := NewLocalChannel("a->b", 8)
	out, in := c.Output(), c.Input().(*localInput)
	in.AnnounceBarriers()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(out.Send(ctx, BarrierEvent(Barrier{ID: 1})))
	if _, ok := in.Announced(); ok || in.Overtaking() {
		t.Fatal("a barrier at the head of the queue was announced")
	}
	if ev, ok, err := in.TryRecv(); err != nil || !ok || ev.Kind != KindBarrier {
		t.Fatalf("got %v %v %v, want barrier 1", ev, ok, err)
	}
	b := GetBatch()
	b.Append(abi.Record{Value: []byte("r")})
	must(out.Send(ctx, RecordsEvent(b)))
	must(out.Send(ctx, BarrierEvent(Barrier{ID: 2})))
	if !in.Overtaking() {
		t.Fatal("no announcement flagged")
	}
	if got, ok := in.Announced(); !ok || got.ID != 2 {
		t.Fatalf("announced %+v %v, want barrier 2", got, ok)
	}
	if _, ok := in.Announced(); ok {
		t.Fatal("announced twice")
	}
	if _, ok, _ := in.TakeBarrier(func(Event) {}); ok {
		t.Fatal("an announced aligned barrier was taken ahead without being wanted")
	}
	var kinds []Kind
	for len(kinds) < 2 {
		if ev, ok, err := in.TryRecv(); err != nil {
			t.Fatal(err)
		} else if ok {
			kinds = append(kinds, ev.Kind)
		}
	}
	if kinds[0] != KindRecords || kinds[1] != KindBarrier {
		t.Fatalf("delivered %v, want the records, then the barrier", kinds)
	}
}

// TestWriterOverdraft: with an overdraft, emits into a full channel queue
// instead of waiting (up to the overdraft), TryDrain sends what fits and
// names the channel to wait on; an aligned barrier (Broadcast) goes behind
// every queued record, and an unaligned one (CaptureBuffers, then
// BroadcastAhead) ahead of the buffers it captured, which follow it.
func TestWriterOverdraft(t *testing.T) {
	ctx := context.Background()
	// read receives from c until it has n records and the event last.
	read := func(c *LocalChannel, n int, last string) string {
		t.Helper()
		g := NewInputGate([]GateChannel{{In: c.Input()}})
		var got []string
		recs := 0
		for recs < n || len(got) == 0 || got[len(got)-1] != last {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, ev, err := g.Next(rctx)
			cancel()
			if err != nil {
				t.Fatalf("after %v: %v", got, err)
			}
			if ev.Kind == KindRecords {
				for _, r := range ev.Batch.Records {
					got = append(got, string(r.Value))
				}
				recs += ev.Batch.Len()
				got = append(got, "|")
				ev.Batch.Release()
				continue
			}
			got = append(got, ev.String())
		}
		return strings.Join(got, " ")
	}
	emit := func(w *RecordWriter, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := w.Emit(ctx, rec("", fmt.Sprint(i), 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := NewLocalChannel("c", 1)
	c.onBlock = func() { t.Error("a send waited for room within the overdraft") }
	w, _ := NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{BatchSize: 2, Overdraft: 4})
	emit(w, 0, 7) // [0 1] sent, [2 3] [4 5] queued, 6 pending
	if !w.Queued() || c.Len() != 1 {
		t.Fatalf("queued %v, channel %d: want queued batches behind a full channel", w.Queued(), c.Len())
	}
	room, err := w.TryDrain(ctx)
	if err != nil || room == nil {
		t.Fatalf("TryDrain on a full channel: %v, room %v", err, room)
	}
	if err := w.Broadcast(ctx, WatermarkEvent(5)); err != nil { // queued too, 6 before it
		t.Fatal(err)
	}
	c.onBlock = nil
	done := make(chan error, 1)
	go func() { done <- w.Broadcast(ctx, BarrierEvent(Barrier{ID: 1})) }()
	barrier := BarrierEvent(Barrier{ID: 1}).String()
	if s, want := read(c, 7, barrier), "0 1 | 2 3 | 4 5 | 6 | watermark(5) "+barrier; s != want {
		t.Fatalf("aligned barrier behind the overdraft:\ngot  %s\nwant %s", s, want)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Unaligned: the barrier goes ahead of the buffers captured.
	c = NewLocalChannel("c", 1)
	w, _ = NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{BatchSize: 2, Overdraft: 4})
	emit(w, 0, 5) // [0 1] sent, [2 3] queued, 4 pending
	var captured []string
	w.CaptureBuffers(func(out int, ev Event) {
		for _, r := range ev.Batch.Records {
			captured = append(captured, string(r.Value))
		}
	})
	if s := strings.Join(captured, " "); s != "2 3 4" {
		t.Fatalf("captured %q, want the queued and pending records 2 3 4", s)
	}
	ub := BarrierEvent(Barrier{ID: 2, Unaligned: true})
	if err := w.BroadcastAhead(ctx, ub); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := w.Broadcast(ctx, EndOfDataEvent(false)); err != nil { // queued too
			done <- err
			return
		}
		done <- w.Flush(ctx)
	}()
	eod := EndOfDataEvent(false).String()
	if s, want := read(c, 5, eod), "0 1 | "+ub.String()+" 2 3 | 4 | "+eod; s != want {
		t.Fatalf("unaligned barrier ahead of the output buffers:\ngot  %s\nwant %s", s, want)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestWriterOverdraftBytes: the overdraft is bounded in bytes too
// (OverdraftBytes, over all outputs): an emit that takes the queued bytes
// beyond it waits for room until they are back within it, however few
// events are queued; the newest batch alone stays queued however large.
func TestWriterOverdraftBytes(t *testing.T) {
	ctx := context.Background()
	emit := func(w *RecordWriter, from, to int) error {
		for i := from; i < to; i++ {
			if err := w.Emit(ctx, rec("", fmt.Sprintf("value-%04d", i), 0)); err != nil { // 10 bytes
				return err
			}
		}
		return nil
	}
	c := NewLocalChannel("c", 1)
	blocked := make(chan struct{}, 1)
	c.onBlock = func() {
		select {
		case blocked <- struct{}{}:
		default:
		}
	}
	w, _ := NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{BatchSize: 2, Overdraft: 8, OverdraftBytes: 50})
	if err := emit(w, 0, 6); err != nil { // [0 1] sent, [2 3] [4 5] queued: 40 bytes
		t.Fatal(err)
	}
	if w.queuedBytes != 40 || c.Len() != 1 {
		t.Fatalf("%d bytes queued, %d in the channel: want 40 and 1", w.queuedBytes, c.Len())
	}
	done := make(chan error, 1)
	go func() { done <- emit(w, 6, 8) }() // [6 7]: 60 bytes, over the 50
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("an emit beyond the byte budget returned (%v) without waiting for room", err)
	case <-time.After(30 * time.Second):
		t.Fatal("an emit beyond the byte budget neither waited nor returned")
	}
	if ev, ok, err := c.Input().TryRecv(); err != nil || !ok || ev.Batch.Len() != 2 { // room for [2 3]
		t.Fatalf("receive: %v %v", ok, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w.queuedBytes != 40 || len(w.queued[0]) != 2 {
		t.Fatalf("%d bytes in %d batches queued: want [4 5] [6 7], 40 bytes", w.queuedBytes, len(w.queued[0]))
	}
	w.Discard()

	// A batch larger than the budget, queued alone, does not wait.
	c = NewLocalChannel("c", 1)
	c.onBlock = func() { t.Error("a send waited for room with only the newest batch queued") }
	w, _ = NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{BatchSize: 2, Overdraft: 8, OverdraftBytes: 5})
	if err := emit(w, 0, 4); err != nil { // [0 1] sent, [2 3] queued: 20 bytes
		t.Fatal(err)
	}
	if !w.Queued() || w.queuedBytes != 20 {
		t.Fatalf("queued %v, %d bytes: want [2 3] queued", w.Queued(), w.queuedBytes)
	}
	w.Discard()
}
