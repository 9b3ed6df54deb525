package natsch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
)

// flushTimeout bounds the wait for the server to confirm the last message.
const flushTimeout = 30 * time.Second

// Sender is the sending side of a NATS channel: a dataplane.Output. One
// goroutine sends on it; the credit subscription's goroutine updates the
// credit under mu.
type Sender struct {
	t        *Transport
	id       ChannelID
	name     string
	dataSubj string
	sub      *nats.Subscription // credit grants
	// maxRecord is max_record_bytes; records larger than a message go out as
	// record parts.
	maxRecord int

	mu      sync.Mutex
	granted uint64 // cumulative bytes the receiver allows
	window  uint64 // the receiver's window; 0 until the first grant
	err     error  // a failure reported asynchronously
	wake    chan struct{}
	// The finishing handshake: peerAcks, the receiver's grants said it
	// acknowledges EndOfData; eodSeq, the EndOfData message's sequence
	// number (0: not sent); acked, its acknowledgement arrived; onAck, the
	// callback of NotifyEndOfDataAck.
	peerAcks bool
	eodSeq   uint64
	acked    bool
	onAck    func()
	ackRetry *time.Timer // while waiting: a credit request every CreditRetry, answered with the acknowledgement again
	ackStop  bool        // closed: no more retries

	// Owned by the sending goroutine.
	seq    uint64
	sent   uint64 // payload bytes published
	ended  bool
	closed bool
	buf    []byte
	timer  *time.Timer
	// TrySend's wait for credit: short, it found none since the last
	// send; asked, when it last asked for credit; retry wakes Room to ask
	// again after CreditRetry.
	short bool
	asked time.Time
	retry *time.Timer

	stats struct {
		messages, bytes, maxInFlight, creditWaits, creditRequests, parts atomic.Uint64
	}
}

// NewSender subscribes to id's credit subject and returns the sending side.
// It sends nothing until the receiver's first grant arrives. opts override
// the transport's options for this channel (MaxRecord, Window).
func (t *Transport) NewSender(id ChannelID, opts ...Option) (*Sender, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	o, err := t.channelOptions(opts)
	if err != nil {
		return nil, err
	}
	s := &Sender{t: t, id: id, name: "nats " + id.String(), dataSubj: id.DataSubject(), wake: make(chan struct{}, 1), maxRecord: o.MaxRecord}
	sub, err := t.nc.Subscribe(id.CreditSubject(), s.onCredit)
	if err != nil {
		return nil, fmt.Errorf("natsch: %s: subscribe to credit: %w", s.name, err)
	}
	s.sub = sub
	if err := t.register(sub, s); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	return s, nil
}

// Name names the channel in errors.
func (s *Sender) Name() string { return s.name }

// ID is the channel's id.
func (s *Sender) ID() ChannelID { return s.id }

func (s *Sender) onCredit(m *nats.Msg) {
	if len(m.Data) != creditLen {
		s.takeAck(m)
		return
	}
	granted, window, err := decodeCredit(m.Data)
	if err != nil {
		s.fail(fmt.Errorf("natsch: %s: %w", s.name, err))
		return
	}
	s.mu.Lock()
	if granted > s.granted {
		s.granted = granted
	}
	if m.Header.Get(HeaderAcks) == "1" {
		s.peerAcks = true
	}
	s.window = uint64(window)
	s.mu.Unlock()
	s.signal()
}

// takeAck takes the receiver's acknowledgement of EndOfData.
func (s *Sender) takeAck(m *nats.Msg) {
	seq, err := decodeCreditAck(m.Data)
	if err != nil {
		s.fail(fmt.Errorf("natsch: %s: %w", s.name, err))
		return
	}
	s.mu.Lock()
	if s.acked && seq == s.eodSeq {
		s.mu.Unlock()
		return // repeated for a credit request
	}
	if s.eodSeq == 0 || seq != s.eodSeq {
		eod := s.eodSeq
		s.mu.Unlock()
		s.fail(fmt.Errorf("natsch: %s: %w: end-of-data acknowledgement of message %d, but end-of-data was message %d (0: not sent)", s.name, ErrWire, seq, eod))
		return
	}
	s.acked = true
	f := s.onAck
	s.onAck = nil
	if s.ackRetry != nil {
		s.ackRetry.Stop()
	}
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// NotifyEndOfDataAck implements dataplane.AckNotifier: false when the
// receiver's grants did not say it acknowledges (an older receiver). Called
// before EndOfData is published (a RecordWriter with an overdraft queued it
// behind records the credit had no room for), it waits for the publish:
// then f is called once the acknowledgement comes, or at once if the
// receiver turns out not to acknowledge.
func (s *Sender) NotifyEndOfDataAck(f func()) bool {
	s.mu.Lock()
	if s.eodSeq == 0 {
		s.onAck = f
		s.mu.Unlock()
		return true
	}
	if !s.peerAcks {
		s.mu.Unlock()
		return false
	}
	if !s.acked {
		s.onAck = f
		s.armAckRetryLocked()
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	f()
	return true
}

// armAckRetryLocked asks again, every CreditRetry until it comes, for an
// acknowledgement of EndOfData lost on the way, like a lost grant: the
// receiver answers a credit request with both (s.mu held).
func (s *Sender) armAckRetryLocked() {
	eod := s.eodSeq
	var retry func()
	retry = func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.acked || s.ackStop {
			return
		}
		var b [creditRequestLen]byte
		_ = s.t.nc.Publish(s.dataSubj, appendCreditRequest(b[:0], eod))
		s.ackRetry = time.AfterFunc(s.t.opts.CreditRetry, retry)
	}
	s.ackRetry = time.AfterFunc(s.t.opts.CreditRetry, retry)
}

// sentEndOfData records that EndOfData went out as message s.seq, and
// carries out a NotifyEndOfDataAck that came before.
func (s *Sender) sentEndOfData() {
	s.mu.Lock()
	s.eodSeq = s.seq
	f := s.onAck
	switch {
	case f == nil || s.acked:
	case !s.peerAcks: // an older receiver: no acknowledgement will come
		s.onAck = nil
		s.mu.Unlock()
		f()
		return
	default:
		s.armAckRetryLocked()
	}
	s.mu.Unlock()
}

func (s *Sender) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Sender) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.signal()
}

// Send publishes ev as the next message(s) of the channel, blocking until the
// receiver has granted credit for it. A batch is released once published
// (the receiver gets its own copy). When Send fails the batch stays the
// caller's, as with dataplane.LocalChannel: the caller (RecordWriter)
// releases it, and releasing it here too would put it into the pool twice,
// so that two later GetBatch calls (of any subtask of any attempt in this
// process) share one batch and records reach the wrong receiver. After
// EndOfPartition, Send flushes the connection and releases the credit
// subscription.
func (s *Sender) Send(ctx context.Context, ev dataplane.Event) error { return s.send(ctx, ev, true) }

// SendNow implements dataplane.Overtaker: Send without waiting for credit
// (only for the receiver's first grant, which says it has subscribed). The
// bytes count in the credit all the same, so the Sends after it wait until
// the receiver's grants have caught up. A records event goes out split as in
// Send. An unaligned barrier (Barrier.Unaligned) carries the header
// Streamd-Unaligned: 1 (with Send too), for the receiver to take it ahead
// (Receiver.TakeBarrier). The receiver's queue may exceed its window by what
// is sent this way: the output buffer (a RecordWriter's pending batch, below
// dataplane.MaxBatchBytes) and the barrier of each unaligned checkpoint.
func (s *Sender) SendNow(ctx context.Context, ev dataplane.Event) error {
	return s.send(ctx, ev, false)
}

// send is Send, and with !wait SendNow.
func (s *Sender) send(ctx context.Context, ev dataplane.Event, wait bool) error {
	if s.ended {
		return fmt.Errorf("%w: %s: send %s after end-of-partition", dataplane.ErrChannelEnded, s.name, ev)
	}
	if ev.Kind == dataplane.KindRecords {
		if err := s.sendRecords(ctx, ev, wait); err != nil {
			return err
		}
		if ev.Batch != nil {
			ev.Batch.Release()
		}
		return nil
	}
	var err error
	s.buf, err = AppendEvent(s.buf[:0], s.seq+1, ev)
	if err != nil {
		return err
	}
	if err := s.publish(ctx, ev, s.buf, wait); err != nil {
		return err
	}
	if ev.Kind == dataplane.KindEndOfData {
		s.sentEndOfData()
	}
	if ev.Kind == dataplane.KindEndOfPartition {
		s.ended = true
		// nats.go needs a deadline; ctx's own, if earlier, still applies.
		fctx, cancel := context.WithTimeout(ctx, flushTimeout)
		err := s.t.nc.FlushWithContext(fctx)
		cancel()
		if err != nil {
			return fmt.Errorf("natsch: %s: flush after end-of-partition: %w", s.name, err)
		}
		s.Close()
	}
	return nil
}

// TrySend implements dataplane.TrySender: ev goes out at once, as with
// SendNow, when the credit has room for all of its messages, or, for an
// event larger than half the window, for half the window (so that the
// receiver's re-grants, each a quarter of the window, always make room in
// the end); else TrySend sends nothing, asks the receiver for credit (at
// once, then every CreditRetry, waking Room to be called again) and
// returns false. An event larger than the window plus
// dataplane.MaxBatchBytes (a record of tens of MiB), more than the
// receiving subscription's pending limits allow for, is sent as Send sends
// it, waiting for credit message by message. So a receiver's queue exceeds
// its window by one event at most (and by less than the window plus
// MaxBatchBytes), plus what SendNow sends.
func (s *Sender) TrySend(ctx context.Context, ev dataplane.Event) (bool, error) {
	if s.ended || s.closed {
		return true, s.send(ctx, ev, false) // fails, saying why
	}
	size, err := s.eventBytes(ev)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	g, w, err := s.granted, s.window, s.err
	s.mu.Unlock()
	if err != nil {
		return false, err
	}
	if w > 0 && size > w+dataplane.MaxBatchBytes {
		s.short = false
		return true, s.send(ctx, ev, true)
	}
	if w > 0 && s.sent+min(size, w/2) <= g {
		s.short = false
		return true, s.send(ctx, ev, false)
	}
	now := time.Now()
	if !s.short {
		s.short = true
		s.stats.creditWaits.Add(1)
		s.t.senders.creditWaits.Add(1)
	} else if now.Sub(s.asked) < s.t.opts.CreditRetry {
		return false, nil
	}
	// Ask at once: the receiver's first grant may have been published
	// before this sender subscribed, and a grant may have been lost.
	s.asked = now
	s.requestCredit()
	if s.retry == nil {
		s.retry = time.AfterFunc(s.t.opts.CreditRetry, s.signal)
	} else {
		s.retry.Reset(s.t.opts.CreditRetry)
	}
	return false, nil
}

// Room implements dataplane.TrySender: ready when a grant or a failure
// came, or when it is time to ask for credit again, since TrySend found
// none.
func (s *Sender) Room() <-chan struct{} { return s.wake }

// eventBytes is the payload bytes of the messages ev goes out as.
func (s *Sender) eventBytes(ev dataplane.Event) (uint64, error) {
	if ev.Kind != dataplane.KindRecords {
		var err error
		s.buf, err = AppendEvent(s.buf[:0], s.seq+1, ev)
		return uint64(len(s.buf)), err
	}
	var recs []abi.Record
	if ev.Batch != nil {
		recs = ev.Batch.Records
	}
	limit := s.t.maxMessage - HeaderLen
	chunk := uint64(s.t.maxMessage - HeaderLen - partHeaderLen)
	var total uint64
	for first := true; first || len(recs) > 0; first = false {
		n, size, err := s.nextMessage(recs)
		if err != nil {
			return 0, err
		}
		if size > limit { // record parts of one record
			parts := (uint64(size) + chunk - 1) / chunk
			total += uint64(size) + parts*(HeaderLen+partHeaderLen)
		} else {
			total += uint64(HeaderLen + size)
		}
		recs = recs[n:]
	}
	return total, nil
}

// nextMessage returns how many records of recs go in the next records
// message, and the size of their batch frame: as many as fit in the
// transport's split size, at least one (a frame over the max message is
// one record, sent as record parts).
func (s *Sender) nextMessage(recs []abi.Record) (n, size int, err error) {
	split := s.t.split - HeaderLen
	size = 4
	for n < len(recs) {
		if abi.RecordBytes(recs[n]) > s.maxRecord {
			return 0, 0, fmt.Errorf("natsch: %s: %w", s.name, abi.CheckRecordBytes(recs[n], s.maxRecord))
		}
		rs := abi.RecordSize(recs[n])
		if n > 0 && size+rs > split {
			break
		}
		size += rs
		n++
	}
	return n, size, nil
}

// sendRecords publishes a batch as one message, or as several when its
// frame exceeds the transport's split size: cut between records, a record
// larger than the split size alone in a message, and a record that does not
// fit in a message alone as record parts.
func (s *Sender) sendRecords(ctx context.Context, ev dataplane.Event, wait bool) error {
	var recs []abi.Record
	if ev.Batch != nil {
		recs = ev.Batch.Records
	}
	limit := s.t.maxMessage - HeaderLen
	// An empty batch still goes out, as one empty message.
	for first := true; first || len(recs) > 0; first = false {
		n, size, err := s.nextMessage(recs)
		if err != nil {
			return err
		}
		if size > limit { // n == 1
			if err := s.sendParts(ctx, ev, recs[0], wait); err != nil {
				return err
			}
			recs = recs[1:]
			continue
		}
		need := HeaderLen + size
		if cap(s.buf) < need {
			s.buf = make([]byte, need, need+need/4)
		}
		s.buf = appendHeader(s.buf[:0], wireRecords, s.seq+1)
		s.buf = s.buf[:need]
		abi.PutBatch(s.buf[HeaderLen:], recs[:n])
		if err := s.publish(ctx, ev, s.buf, wait); err != nil {
			return err
		}
		recs = recs[n:]
	}
	return nil
}

// sendParts publishes the batch frame of the one record r, which does not
// fit in a message, as consecutive record parts of at most a message each,
// copied straight from r (the whole frame is never built).
func (s *Sender) sendParts(ctx context.Context, ev dataplane.Event, r abi.Record, wait bool) error {
	var head [4 + 8 + 4]byte // count 1, timestamp, key length
	kl := uint32(len(r.Key))
	if len(r.Headers) > 0 {
		kl |= abi.HeadersFlag
	}
	binary.LittleEndian.PutUint32(head[0:], 1)
	binary.LittleEndian.PutUint64(head[4:], uint64(r.Timestamp))
	binary.LittleEndian.PutUint32(head[12:], kl)
	var vlen, hlen [4]byte
	binary.LittleEndian.PutUint32(vlen[:], uint32(len(r.Value)))
	segs := [][]byte{head[:], r.Key, vlen[:], r.Value}
	if len(r.Headers) > 0 {
		binary.LittleEndian.PutUint32(hlen[:], uint32(len(r.Headers)))
		segs = append(segs, hlen[:], r.Headers)
	}
	total := uint64(4 + abi.RecordSize(r))
	chunk := uint64(s.t.maxMessage - HeaderLen - partHeaderLen)
	if cap(s.buf) < s.t.maxMessage {
		s.buf = make([]byte, 0, s.t.maxMessage)
	}
	for off := uint64(0); off < total; {
		n := min(chunk, total-off)
		s.buf = appendPartHeader(s.buf[:0], s.seq+1, total, off)
		s.buf = appendSegments(s.buf, segs, off, n)
		if err := s.publish(ctx, ev, s.buf, wait); err != nil {
			return err
		}
		s.stats.parts.Add(1)
		s.t.senders.parts.Add(1)
		off += n
	}
	return nil
}

// appendSegments appends n bytes of the concatenation of segs, starting at
// offset off, to dst.
func appendSegments(dst []byte, segs [][]byte, off, n uint64) []byte {
	for _, seg := range segs {
		if n == 0 {
			break
		}
		if l := uint64(len(seg)); off >= l {
			off -= l
			continue
		}
		k := min(uint64(len(seg))-off, n)
		dst = append(dst, seg[off:off+k]...)
		off, n = 0, n-k
	}
	return dst
}

// publish waits for credit for data (whose seq is s.seq+1), with !wait
// only for the first grant, and publishes it.
func (s *Sender) publish(ctx context.Context, ev dataplane.Event, data []byte, wait bool) error {
	if s.closed {
		return fmt.Errorf("natsch: %s: send on a closed sender", s.name)
	}
	size := uint64(len(data))
	consumed, err := s.waitCredit(ctx, size, wait)
	if err != nil {
		return err
	}
	eod := ev.Kind == dataplane.KindEndOfData
	unaligned := ev.Kind == dataplane.KindBarrier && ev.Barrier.Unaligned
	base := int64(0)
	if ev.Kind == dataplane.KindBarrier {
		base = ev.Barrier.Base
	}
	status := ev.Kind == dataplane.KindWatermarkStatus
	if h, tr := s.t.opts.SendHeader, barrierTrace(ev); h != nil || tr != nil || eod || unaligned || base > 0 || status {
		m := &nats.Msg{Subject: s.dataSubj, Data: data, Header: nats.Header{}}
		for k, v := range tr {
			m.Header[k] = []string{v}
		}
		if eod {
			m.Header.Set(HeaderAckRequest, "1")
		}
		if unaligned {
			m.Header.Set(HeaderUnaligned, "1")
		}
		if base > 0 {
			m.Header.Set(HeaderCheckpointBase, strconv.FormatInt(base, 10))
		}
		if status {
			m.Header.Set(HeaderWatermarkStatus, statusWord(ev.Status.Idle))
		}
		if h != nil {
			h(ctx, ev, m.Header)
		}
		err = s.t.nc.PublishMsg(m)
	} else {
		err = s.t.nc.Publish(s.dataSubj, data)
	}
	if err != nil {
		return fmt.Errorf("natsch: %s: publish message %d: %w", s.name, s.seq+1, err)
	}
	s.seq++
	s.sent += size
	s.stats.messages.Add(1)
	s.stats.bytes.Add(size)
	s.t.senders.messages.Add(1)
	s.t.senders.bytes.Add(size)
	if inFlight := s.sent - consumed; inFlight > s.stats.maxInFlight.Load() {
		s.stats.maxInFlight.Store(inFlight)
		for cur := s.t.senders.maxInFlight.Load(); inFlight > cur && !s.t.senders.maxInFlight.CompareAndSwap(cur, inFlight); {
			cur = s.t.senders.maxInFlight.Load()
		}
	}
	return nil
}

// waitCredit blocks until a message of size bytes may be sent: when it fits
// in the credit (sent+size <= granted), or, for a message larger than the
// whole window, when nothing is in flight; with !wait (SendNow) as soon as
// the first grant has come. It returns the bytes the receiver has consumed
// as far as the sender knows (granted - window).
func (s *Sender) waitCredit(ctx context.Context, size uint64, wait bool) (uint64, error) {
	waited := false
	for {
		s.mu.Lock()
		g, w, err := s.granted, s.window, s.err
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if w > 0 && (!wait || s.sent+size <= g || size > w && s.sent+w <= g) {
			return g - w, nil
		}
		if !waited {
			waited = true
			s.stats.creditWaits.Add(1)
			s.t.senders.creditWaits.Add(1)
			// Ask at once: the receiver's first grant may have been published
			// before this sender subscribed.
			s.requestCredit()
			if s.timer == nil {
				s.timer = time.NewTimer(s.t.opts.CreditRetry)
			} else {
				s.timer.Reset(s.t.opts.CreditRetry)
			}
		}
		select {
		case <-s.wake:
		case <-s.timer.C:
			s.requestCredit()
			s.timer.Reset(s.t.opts.CreditRetry)
		case <-ctx.Done():
			s.timer.Stop()
			return 0, fmt.Errorf("natsch: %s: waiting for credit for message %d (%d bytes; sent %d, granted %d): %w", s.name, s.seq+1, size, s.sent, g, context.Cause(ctx))
		}
	}
}

func (s *Sender) requestCredit() {
	var b [creditRequestLen]byte
	s.stats.creditRequests.Add(1)
	s.t.senders.creditRequests.Add(1)
	// A failed publish shows again in the next Publish; nothing to do here.
	_ = s.t.nc.Publish(s.dataSubj, appendCreditRequest(b[:0], s.seq))
}

// SenderStats are counters of a Sender.
type SenderStats struct {
	Messages, Bytes uint64 // data messages and payload bytes published
	// MaxInFlight is the most payload bytes ever sent but not known to be
	// consumed (granted - window): never more than the window, unless a
	// single message is larger than the window or SendNow went beyond the
	// credit.
	MaxInFlight    uint64
	CreditWaits    uint64 // sends that had to wait for credit
	CreditRequests uint64
	Parts          uint64 // record-part messages (of records too large for one message), counted in Messages too
}

// Stats returns the sender's counters; any goroutine may call it.
func (s *Sender) Stats() SenderStats {
	return SenderStats{
		Messages: s.stats.messages.Load(), Bytes: s.stats.bytes.Load(), MaxInFlight: s.stats.maxInFlight.Load(),
		CreditWaits: s.stats.creditWaits.Load(), CreditRequests: s.stats.creditRequests.Load(), Parts: s.stats.parts.Load(),
	}
}

// senderTotals are the counters of every sender of a Transport.
type senderTotals struct {
	messages, bytes, maxInFlight, creditWaits, creditRequests, parts atomic.Uint64
}

// SenderStats returns the counters of every sender this transport made,
// added up (MaxInFlight: the largest of any sender); any goroutine may call
// it.
func (t *Transport) SenderStats() SenderStats {
	return SenderStats{
		Messages: t.senders.messages.Load(), Bytes: t.senders.bytes.Load(), MaxInFlight: t.senders.maxInFlight.Load(),
		CreditWaits: t.senders.creditWaits.Load(), CreditRequests: t.senders.creditRequests.Load(), Parts: t.senders.parts.Load(),
	}
}

// Close releases the credit subscription; Send fails afterwards. Call it
// from the sending goroutine (or after it stopped).
func (s *Sender) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.retry != nil {
		s.retry.Stop()
	}
	s.mu.Lock()
	s.ackStop = true
	if s.ackRetry != nil {
		s.ackRetry.Stop()
	}
	s.mu.Unlock()
	s.t.unregister(s.sub)
	if err := s.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("natsch: %s: %w", s.name, err)
	}
	return nil
}

var (
	_ dataplane.Output      = (*Sender)(nil)
	_ dataplane.Overtaker   = (*Sender)(nil)
	_ dataplane.TrySender   = (*Sender)(nil)
	_ dataplane.AckNotifier = (*Sender)(nil)
)

// barrierTrace is the trace context of a barrier event (nil for anything
// else): it travels as the message's headers (traceparent, tracestate).
func barrierTrace(ev dataplane.Event) map[string]string {
	if ev.Kind != dataplane.KindBarrier {
		return nil
	}
	return ev.Barrier.Trace
}
