// Package natsch is the NATS implementation of dataplane channels, for
// subtasks on different hosts (subtasks on one host keep using
// dataplane.LocalChannel). The subjects and message encodings are a
// versioned contract, documented in docs/subjects.md.
//
// A channel is a Sender (dataplane.Output) on the sending host and a Receiver
// (dataplane.Input) on the receiving host. The sender publishes every event as
// one NATS message on the channel's data subject, numbered 1, 2, 3, ...; a
// records event's batch is cut, between records, into messages of at most
// SplitMessage bytes (16 KiB by default), a record larger than that goes
// alone in a message, and a record too large for one message travels as a
// run of record parts, reassembled by the receiver. The
// receiver checks the numbers with
// dataplane.CheckSeq: a gap (core NATS dropped a message) or a duplicate fails
// the receiving subtask, which triggers failover, never silent loss.
//
// Flow control is credit-based, in payload bytes: the receiver grants a window
// (default 4 MiB) and re-grants as its subtask consumes; the sender blocks in
// Send until the message fits in the credit it has, or, with TrySend (a
// dataplane.TrySender, which a RecordWriter with an overdraft uses), does
// not send and lets its subtask wait for Room in its own loop, where
// checkpoint triggers and unaligned barriers are taken at once. Grants are cumulative
// ("you may have sent G bytes in total"), so a lost or duplicated grant is
// harmless, and a sender that waits for credit re-asks periodically (a credit
// request on the data subject, which also says how many messages it has sent,
// so a dropped last message is noticed too). With credits the bytes queued at
// a receiver never exceed its window (but for what SendNow sends beyond it,
// an unaligned checkpoint's barrier and output buffers, and one event larger
// than half the window that TrySend sent), and the receiving
// subscription's pending limits are set well above that, so NATS never drops
// a message as a slow consumer; should it happen anyway, the channel fails
// with the NATS error.
//
// Unaligned checkpoints: the sender marks an unaligned barrier with the header
// Streamd-Unaligned (Sender.SendNow), and the receiving subtask takes such a
// barrier, or the one it waits for, out of the queue ahead of the messages
// before it (Receiver.TakeBarrier), with copies of their records.
//
// Lock order: Transport.mu is never held while taking a Sender's or
// Receiver's mu, nor the other way round.
package natsch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
)

// DefaultWindow is the credit a receiver grants by default: 4 MiB.
const DefaultWindow = 4 << 20

// DefaultMaxMessage caps a data message's payload by default (1 MiB, NATS's
// default max_payload); the connection's max payload caps it too.
const DefaultMaxMessage = 1 << 20

// DefaultSplitMessage is the size a records message is cut at, between
// records, by default: a batch whose frame is larger goes out as several
// messages of about this size (a record larger than it alone in one message,
// up to the max message). A message that fits in the NATS server's and
// client's read buffers (64 KiB and 32 KiB) is parsed where it was read; a
// larger one the server first copies into a buffer of its own, allocated for
// it (issue 28: with 1024-record batches of 100-byte records, ~118 KiB a
// message, that copy was 40% of the bytes allocated by the two-host
// benchmark, and garbage collection and its write barriers a fifth of its CPU).
const DefaultSplitMessage = 16 << 10

// headerReserve is what a transport with a SendHeader hook keeps free of
// payload in each message for the headers the hook adds.
const headerReserve = 1 << 10

// DefaultCreditRetry is how often a sender blocked on credit asks again.
const DefaultCreditRetry = 200 * time.Millisecond

// Options configures a Transport.
type Options struct {
	// Window is the credit in bytes each receiver grants its sender.
	Window int
	// MaxMessage caps a data message's payload; larger batches are split.
	MaxMessage int
	// SplitMessage is the payload size at which a records message is cut
	// between records (at most MaxMessage); default DefaultSplitMessage.
	SplitMessage int
	// CreditRetry is how often a sender waiting for credit asks again.
	CreditRetry time.Duration
	// MaxRecord is max_record_bytes: a sender refuses a larger record, and a
	// receiver refuses record parts announcing one (so it never buffers more
	// for one record); default abi.DefaultMaxRecordBytes.
	MaxRecord int
	// MergeRecords caps the records of a batch a receiver merges from the
	// records messages queued one behind the other (Receiver.TryRecv);
	// default dataplane.DefaultBatchSize.
	MergeRecords int
	// SendHeader, if set, is called before every data message is published,
	// with Send's ctx, the event (for a split batch: the whole batch) and a
	// fresh header to fill (trace context); payloads are then kept 1 KiB
	// below the server's max_payload, room for the headers. Without it
	// messages carry no header (but a barrier's trace context).
	SendHeader func(ctx context.Context, ev dataplane.Event, h nats.Header)
	// RecvHeader, if set, is called by TryRecv with each event it returns and
	// the header of its message (nil when the message had none).
	RecvHeader func(ev dataplane.Event, h nats.Header)
}

// Option sets and validates one option.
type Option func(*Options) error

// Window sets the credit window in bytes (at least 1 KiB, at most 1 GiB).
func Window(bytes int) Option {
	return func(o *Options) error {
		if bytes < 1<<10 || bytes > 1<<30 {
			return fmt.Errorf("natsch: window %d bytes: want 1 KiB to 1 GiB", bytes)
		}
		o.Window = bytes
		return nil
	}
}

// MaxMessage caps a data message's payload (at least 1 KiB).
func MaxMessage(bytes int) Option {
	return func(o *Options) error {
		if bytes < 1<<10 {
			return fmt.Errorf("natsch: max message %d bytes: want at least 1 KiB", bytes)
		}
		o.MaxMessage = bytes
		return nil
	}
}

// SplitMessage sets the payload size at which a records message is cut
// between records (at least 1 KiB; MaxMessage caps it).
func SplitMessage(bytes int) Option {
	return func(o *Options) error {
		if bytes < 1<<10 {
			return fmt.Errorf("natsch: split message %d bytes: want at least 1 KiB", bytes)
		}
		o.SplitMessage = bytes
		return nil
	}
}

// CreditRetry sets how often a sender blocked on credit asks again.
func CreditRetry(d time.Duration) Option {
	return func(o *Options) error {
		if d <= 0 {
			return fmt.Errorf("natsch: credit retry %s: want > 0", d)
		}
		o.CreditRetry = d
		return nil
	}
}

// MaxRecord sets max_record_bytes, the largest record (key and value bytes)
// a channel carries (1 byte to abi.MaxMaxRecordBytes). Given to NewSender or
// NewReceiver it applies to that channel only.
func MaxRecord(bytes int) Option {
	return func(o *Options) error {
		if err := abi.CheckMaxRecordBytes("natsch: max record", int64(bytes)); err != nil {
			return err
		}
		o.MaxRecord = bytes
		return nil
	}
}

// MergeRecords caps the records of a batch a receiver merges from queued
// messages (at least 1). The runtime gives its batch size, so a subtask
// that receives over NATS gets batches no larger than from an in-process
// channel: a receiving subtask that has fallen behind would otherwise take
// up to dataplane.DefaultBatchSize records in one call, and an overtaking
// barrier (or a checkpoint trigger) would wait for all of them. Given to
// NewReceiver it applies to that channel only.
func MergeRecords(n int) Option {
	return func(o *Options) error {
		if n < 1 {
			return fmt.Errorf("natsch: merge records %d: want at least 1", n)
		}
		o.MergeRecords = n
		return nil
	}
}

// SendHeader sets the hook that fills each data message's header.
func SendHeader(fn func(ctx context.Context, ev dataplane.Event, h nats.Header)) Option {
	return func(o *Options) error { o.SendHeader = fn; return nil }
}

// RecvHeader sets the hook that reads each received message's header.
func RecvHeader(fn func(ev dataplane.Event, h nats.Header)) Option {
	return func(o *Options) error { o.RecvHeader = fn; return nil }
}

// Transport makes channels over one NATS connection. It installs an async
// error handler on the connection (chained to the one it had) that fails the
// channel whose subscription NATS reports, e.g. as a slow consumer.
type Transport struct {
	senders    senderTotals // of every sender made here (SenderStats)
	nc         *nats.Conn
	opts       Options
	maxMessage int
	split      int // records messages are cut at this payload size
	prevErrCB  nats.ErrHandler

	mu     sync.Mutex
	subs   map[*nats.Subscription]failer // every open channel's subscription
	closed bool
}

type failer interface{ fail(error) }

// NewTransport returns a transport over nc, which stays the caller's to
// close (after the transport).
func NewTransport(nc *nats.Conn, opts ...Option) (*Transport, error) {
	if nc == nil {
		return nil, errors.New("natsch: nil connection")
	}
	o := Options{Window: DefaultWindow, MaxMessage: DefaultMaxMessage, SplitMessage: DefaultSplitMessage, CreditRetry: DefaultCreditRetry, MaxRecord: abi.DefaultMaxRecordBytes,
		MergeRecords: dataplane.DefaultBatchSize}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	t := &Transport{nc: nc, opts: o, subs: map[*nats.Subscription]failer{}}
	t.maxMessage = o.MaxMessage
	if mp := int(nc.MaxPayload()); mp > 0 {
		if o.SendHeader != nil {
			mp -= headerReserve // the server counts headers in max_payload
		}
		t.maxMessage = min(t.maxMessage, mp)
	}
	if t.maxMessage < HeaderLen+partHeaderLen+64 {
		return nil, fmt.Errorf("natsch: server max payload %d is too small", t.maxMessage)
	}
	t.split = min(o.SplitMessage, t.maxMessage)
	t.prevErrCB = nc.Opts.AsyncErrorCB
	nc.SetErrorHandler(t.asyncError)
	return t, nil
}

// channelOptions are the transport's options with opts, a channel's own,
// applied on top. Window, MaxRecord and MergeRecords may differ per channel; MaxMessage
// stays the transport's.
func (t *Transport) channelOptions(opts []Option) (Options, error) {
	o := t.opts
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Conn is the transport's connection.
func (t *Transport) Conn() *nats.Conn { return t.nc }

// MaxMessage is the largest data message payload the transport sends.
func (t *Transport) MaxMessage() int { return t.maxMessage }

func (t *Transport) asyncError(nc *nats.Conn, sub *nats.Subscription, err error) {
	if sub != nil {
		t.mu.Lock()
		f := t.subs[sub]
		t.mu.Unlock()
		if f != nil {
			f.fail(fmt.Errorf("natsch: subscription %s: %w", sub.Subject, err))
		}
	}
	if t.prevErrCB != nil {
		t.prevErrCB(nc, sub, err)
	}
}

func (t *Transport) register(sub *nats.Subscription, f failer) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("natsch: transport closed")
	}
	t.subs[sub] = f
	return nil
}

func (t *Transport) unregister(sub *nats.Subscription) {
	t.mu.Lock()
	delete(t.subs, sub)
	t.mu.Unlock()
}

// Close unsubscribes every open channel of the transport (their pending
// Sends fail) and restores the connection's error handler.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	subs := t.subs
	t.subs = map[*nats.Subscription]failer{}
	t.mu.Unlock()
	var errs []error
	for sub, f := range subs {
		f.fail(errors.New("natsch: transport closed"))
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			errs = append(errs, fmt.Errorf("natsch: unsubscribe %s: %w", sub.Subject, err))
		}
	}
	t.nc.SetErrorHandler(t.prevErrCB)
	return errors.Join(errs...)
}

// Channel is both ends of a NATS channel in one process (tests, `streamd
// run` over an embedded server); it implements dataplane.Channel. On two
// hosts, each builds its own end with NewSender or NewReceiver.
type Channel struct {
	S *Sender
	R *Receiver
}

// NewChannel builds the receiver, then the sender, of id, both with opts.
func (t *Transport) NewChannel(id ChannelID, opts ...Option) (*Channel, error) {
	r, err := t.NewReceiver(id, opts...)
	if err != nil {
		return nil, err
	}
	s, err := t.NewSender(id, opts...)
	if err != nil {
		r.Close()
		return nil, err
	}
	return &Channel{S: s, R: r}, nil
}

// Output returns the sender.
func (c *Channel) Output() dataplane.Output { return c.S }

// Input returns the receiver.
func (c *Channel) Input() dataplane.Input { return c.R }

var _ dataplane.Channel = (*Channel)(nil)
