package natsch

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
)

// bigRecord is a record of size value bytes with a short key, its bytes a
// pattern that shows a misplaced part.
func bigRecord(i, size int) abi.Record {
	v := make([]byte, size)
	for j := range v {
		v[j] = byte('a' + (j/1021+i)%26)
	}
	return abi.Record{Key: []byte{'k', byte('0' + i)}, Value: v, Timestamp: int64(1000 + i)}
}

// TestRecordsOfAnySizeAcrossHosts sends records of 0 B, 1 MiB, 8 MiB and 40
// MiB, alone and between small records, at the default max_payload (1 MiB)
// from one connection to another (as between two hosts). They arrive whole
// and in order; the receiver's reassembly buffer is the record's frame and no
// more, and credits still bound what is in flight and queued.
func TestRecordsOfAnySizeAcrossHosts(t *testing.T) {
	s := startServer(t, 0)
	st := transport(t, connect(t, s))
	if st.MaxMessage() != 1<<20 {
		t.Fatalf("max message %d, want the default 1 MiB", st.MaxMessage())
	}
	r, snd := channelEnds(t, transport(t, connect(t, s)), st)
	sizes := []int{0, 1 << 20, 8 << 20, 40 << 20}
	var evs []dataplane.Event
	var want []abi.Record
	for i, n := range sizes {
		want = append(want, bigRecord(i, n))
		evs = append(evs, dataplane.RecordsEvent(batchOf(want[i])))
	}
	mixed := []abi.Record{rec(1, 10), bigRecord(7, 8<<20), rec(2, 10), rec(3, 10)}
	want = append(want, mixed...)
	evs = append(evs, dataplane.RecordsEvent(batchOf(mixed...)), dataplane.EndOfPartitionEvent())
	got := exchange(t, snd, r, evs)
	sameRecords(t, got, want)
	ss, rs := snd.Stats(), r.Stats()
	// 1 MiB, 8 MiB, 40 MiB and 8 MiB more than fit in a message.
	if rs.Parted != 4 {
		t.Errorf("%d records reassembled, want 4", rs.Parted)
	}
	if frame := uint64(recordFrameOverhead + 2 + 40<<20); rs.MaxPartial != frame {
		t.Errorf("largest reassembly buffer %d bytes, want the 40 MiB record's frame, %d", rs.MaxPartial, frame)
	}
	if ss.MaxInFlight > DefaultWindow || rs.MaxQueued > DefaultWindow {
		t.Errorf("in flight %d, queued %d: over the %d-byte window", ss.MaxInFlight, rs.MaxQueued, DefaultWindow)
	}
	if ss.Messages != rs.Messages || ss.Bytes != rs.Bytes {
		t.Errorf("sent %d messages (%d bytes), received %d (%d bytes)", ss.Messages, ss.Bytes, rs.Messages, rs.Bytes)
	}
}

// TestRecordHeadersAcrossHosts: records with headers, small ones in one
// message and one large enough to go as record parts, arrive with their
// headers.
func TestRecordHeadersAcrossHosts(t *testing.T) {
	s := startServer(t, 0)
	st := transport(t, connect(t, s))
	r, snd := channelEnds(t, transport(t, connect(t, s)), st)
	withH := func(r abi.Record, i int) abi.Record {
		r.Headers = abi.AppendHeader(abi.AppendHeader(nil, "trace", fmt.Appendf(nil, "t-%d", i)), "empty", nil)
		return r
	}
	want := []abi.Record{withH(rec(1, 10), 1), rec(2, 10), withH(bigRecord(3, 3<<20), 3), withH(rec(4, 10), 4)}
	got := exchange(t, snd, r, []dataplane.Event{dataplane.RecordsEvent(batchOf(want...)), dataplane.EndOfPartitionEvent()})
	sameRecords(t, got, want)
	if rs := r.Stats(); rs.Parted != 1 {
		t.Errorf("%d records reassembled, want the large one", rs.Parted)
	}
}

// TestRecordOverMaxRecord: a sender refuses a record over max_record_bytes,
// and a receiver refuses parts announcing one before it buffers anything.
func TestRecordOverMaxRecord(t *testing.T) {
	s := startServer(t, 0)
	st := transport(t, connect(t, s))
	rt := transport(t, connect(t, s), MaxRecord(1<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The sender's limit, per channel.
	lim, err := st.NewSender(ChannelID{Job: "j", From: "a", To: "b"}, MaxRecord(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	big := batchOf(abi.Record{Value: make([]byte, 1<<20+1)})
	err = lim.Send(ctx, dataplane.RecordsEvent(big))
	if !errors.Is(err, abi.ErrRecordTooLarge) || !strings.Contains(err.Error(), "a record of 1048577 bytes") || !strings.Contains(err.Error(), "max_record_bytes 1048576") {
		t.Errorf("error %v: want a record-too-large error naming the size and the limit", err)
	}
	big.Release()

	// The receiver's limit: the sender (default 64 MiB) sends parts.
	r, snd := channelEnds(t, rt, st)
	go snd.Send(ctx, dataplane.RecordsEvent(batchOf(bigRecord(1, 2<<20))))
	_, err = recvErr(t, r)
	if !errors.Is(err, abi.ErrRecordTooLarge) || !strings.Contains(err.Error(), "a record of 2097154 bytes") || !strings.Contains(err.Error(), "map[0]->sink[1]") {
		t.Errorf("error %v: want a record-too-large error naming the channel and size", err)
	}
	if st := r.Stats(); st.MaxPartial != 0 {
		t.Errorf("the receiver buffered %d bytes of a record it refuses", st.MaxPartial)
	}
}

// channelEnds makes testID's receiver on rt, then its sender on st.
func channelEnds(t *testing.T, rt, st *Transport) (*Receiver, *Sender) {
	t.Helper()
	r, err := rt.NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	snd, err := st.NewSender(testID)
	if err != nil {
		t.Fatal(err)
	}
	return r, snd
}

// sendAll sends evs on snd from a goroutine; the channel gets the first
// error, or nil.
func sendAll(ctx context.Context, snd dataplane.Output, evs []dataplane.Event) <-chan error {
	done := make(chan error, 1)
	go func() {
		for _, ev := range evs {
			if err := snd.Send(ctx, ev); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// part is the data message of one record part, possibly malformed.
func part(seq, total, off uint64, data []byte) []byte {
	return append(appendPartHeader(nil, seq, total, off), data...)
}

func event(t *testing.T, seq uint64, ev dataplane.Event) []byte {
	data, err := AppendEvent(nil, seq, ev)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestBrokenRecordParts: every way a run of record parts can be malformed or
// cut short fails the receiver with a clear error (never a crash, never a
// record made of the wrong bytes).
func TestBrokenRecordParts(t *testing.T) {
	frame := abi.AppendBatch(nil, []abi.Record{bigRecord(1, 3000)})
	total := uint64(len(frame))
	twoRecs := abi.AppendBatch(nil, []abi.Record{{Value: []byte("x")}})
	binary.LittleEndian.PutUint32(twoRecs, 2) // says 2 records, holds 1
	cases := []struct {
		name string
		msgs func(t *testing.T) [][]byte
		want string
	}{
		{"interrupted by an event", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 0, frame[:1000]), event(t, 2, dataplane.WatermarkEvent(5))}
		}, "broken off after 1000 of its 3022 bytes by a message of kind 2 (seq 2)"},
		{"end of partition mid-record", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 0, frame[:1000]), part(2, total, 1000, frame[1000:2000]), event(t, 3, dataplane.EndOfPartitionEvent())}
		}, "broken off after 2000 of its 3022 bytes by a message of kind 5 (seq 3)"},
		{"first part not at 0", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 1000, frame[1000:2000])}
		}, "at offset 1000 of 3022 bytes, but no record is being reassembled"},
		{"a part skipped", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 0, frame[:1000]), part(2, total, 2000, frame[2000:])}
		}, "broken off after 1000 of its 3022 bytes by a part (seq 2) at offset 2000 of 3022 bytes"},
		{"total changes", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 0, frame[:1000]), part(2, total+1, 1000, frame[1000:])}
		}, "by a part (seq 2) at offset 1000 of 3023 bytes"},
		{"part past the total", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 0, frame[:1000]), part(2, total, 1000, append(frame[1000:], 'x'))}
		}, "record part (seq 2) of 2023 bytes at offset 1000 runs past the announced 3022 bytes"},
		{"empty part", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 0, nil)}
		}, "record part of 16 bytes: want a 16-byte part header and at least one byte"},
		{"total below a frame", func(t *testing.T) [][]byte {
			return [][]byte{part(1, 3, 0, []byte{1, 2, 3})}
		}, "announce 3 bytes, less than one record's frame"},
		{"not a batch frame", func(t *testing.T) [][]byte {
			return [][]byte{part(1, uint64(len(twoRecs)), 0, twoRecs)}
		}, "the record of parts 1 to 1"},
		{"gap between parts", func(t *testing.T) [][]byte {
			return [][]byte{part(1, total, 0, frame[:1000]), part(3, total, 1000, frame[1000:])}
		}, "gap: got message 3, want 2"},
		{"part alone to DecodeEvent", nil, "a record part is not an event by itself"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.msgs == nil {
				_, _, err := DecodeEvent(part(1, total, 0, frame))
				if !errors.Is(err, ErrWire) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("DecodeEvent: %v, want %q", err, c.want)
				}
				return
			}
			nc := connect(t, startServer(t, 0))
			r, err := transport(t, nc).NewReceiver(testID)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range c.msgs(t) {
				if err := nc.Publish(testID.DataSubject(), m); err != nil {
					t.Fatal(err)
				}
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			got, err := recvErr(t, r)
			if len(got) != 0 {
				t.Errorf("events before the error: %v", got)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "map[0]->sink[1]") {
				t.Errorf("error %q: want %q, naming the channel", err, c.want)
			}
			if !errors.Is(err, ErrWire) && !errors.Is(err, dataplane.ErrSequence) {
				t.Errorf("error %v wraps neither ErrWire nor ErrSequence", err)
			}
		})
	}
}

// TestPartsKeepHeaders: the receiver's header hook sees the reassembled
// record with the header of its last part.
func TestPartsKeepHeaders(t *testing.T) {
	nc := connect(t, startServer(t, 8192))
	var seen []string
	tr := transport(t, nc,
		SendHeader(func(_ context.Context, ev dataplane.Event, h nats.Header) { h.Set("X-Kind", ev.Kind.String()) }),
		RecvHeader(func(ev dataplane.Event, h nats.Header) { seen = append(seen, ev.String()+":"+h.Get("X-Kind")) }))
	ch, err := tr.NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		if err := ch.S.Send(ctx, dataplane.RecordsEvent(batchOf(bigRecord(1, 20000)))); err != nil {
			t.Error(err)
		}
		ch.S.Send(ctx, dataplane.EndOfPartitionEvent())
	}()
	if _, err := recvAll(ctx, ch.R, 0); err != nil {
		t.Fatal(err)
	}
	if strings.Join(seen, " ") != "records(1):records end-of-partition:end-of-partition" {
		t.Errorf("header hook saw %v", seen)
	}
	if ch.S.t.MaxMessage() != 8192-headerReserve || ch.S.Stats().Parts != 3 {
		t.Errorf("max message %d, %d parts: want room for headers and 3 parts", ch.S.t.MaxMessage(), ch.S.Stats().Parts)
	}
}

// TestBatchCutAtSplitSize sends a batch of 1000 records of 100 bytes (a
// frame of about 116 KiB) and, in a second batch, a record of 40 KiB
// between two small ones. The first goes out as messages of at most the
// split size (16 KiB by default), cut between records; the 40 KiB record,
// over the split size but within the max message, goes whole in a message
// of its own, not as parts. Every record arrives, in order.
func TestBatchCutAtSplitSize(t *testing.T) {
	s := startServer(t, 0)
	st := transport(t, connect(t, s))
	r, snd := channelEnds(t, transport(t, connect(t, s)), st)
	var many []abi.Record
	for i := 0; i < 1000; i++ {
		many = append(many, rec(i, 100))
	}
	mixed := []abi.Record{rec(1, 10), bigRecord(3, 40<<10), rec(2, 10)}
	want := append(append([]abi.Record{}, many...), mixed...)
	evs := []dataplane.Event{dataplane.RecordsEvent(batchOf(many...)), dataplane.RecordsEvent(batchOf(mixed...)), dataplane.EndOfPartitionEvent()}
	got := exchange(t, snd, r, evs)
	sameRecords(t, got, want)
	ss := snd.Stats()
	if min := abi.BatchSize(many)/DefaultSplitMessage + 1; ss.Messages < uint64(min+3) {
		t.Errorf("%d messages, want at least %d (the first batch cut in %d or more, the second in 2, end-of-partition)", ss.Messages, min+3, min)
	}
	if avg := ss.Bytes / ss.Messages; avg > DefaultSplitMessage {
		t.Errorf("messages of %d bytes on average, over the split size %d", avg, DefaultSplitMessage)
	}
	if p := snd.Stats().Parts; p != 0 {
		t.Errorf("%d record parts sent, want none (the 40 KiB record fits in a message)", p)
	}
}

// sameRecords checks that the records events of got carry want, in order.
func sameRecords(t *testing.T, got []dataplane.Event, want []abi.Record) {
	t.Helper()
	next := 0
	for _, ev := range got {
		if ev.Kind != dataplane.KindRecords {
			continue
		}
		for _, g := range ev.Batch.Records {
			if next >= len(want) {
				t.Fatalf("more records than sent")
			}
			w := want[next]
			if !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || g.Timestamp != w.Timestamp || !bytes.Equal(g.Headers, w.Headers) {
				t.Fatalf("record %d: key %q, %d value bytes, ts %d; want key %q, %d bytes, ts %d (or the bytes differ)",
					next, g.Key, len(g.Value), g.Timestamp, w.Key, len(w.Value), w.Timestamp)
			}
			next++
		}
	}
	if next != len(want) {
		t.Fatalf("received %d records, want %d", next, len(want))
	}
}

// exchange sends evs on snd while receiving them all on r, within 60 s.
func exchange(t *testing.T, snd dataplane.Output, r dataplane.Input, evs []dataplane.Event) []dataplane.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := sendAll(ctx, snd, evs)
	got, err := recvAll(ctx, r, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return got
}
