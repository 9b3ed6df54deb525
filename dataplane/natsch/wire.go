package natsch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
)

// SubjectVersion is the version token of every streamd subject
// (docs/subjects.md). A change to a subject's tokens or to a message encoding
// that an older peer would misread bumps it.
const SubjectVersion = "v1"

// WireVersion is the first byte of every data and credit message.
const WireVersion = 1

// Subject prefixes (docs/subjects.md). Ctl and Hosts are reserved for the
// control API and host heartbeats; this package uses Data and Credit.
const (
	PrefixData   = "streamd." + SubjectVersion + ".data"
	PrefixCredit = "streamd." + SubjectVersion + ".credit"
	PrefixCtl    = "streamd." + SubjectVersion + ".ctl"
	PrefixHosts  = "streamd." + SubjectVersion + ".hosts"
)

// Wire kinds of a data message. They are part of the subject schema and are
// numbered independently of dataplane.Kind.
const (
	wireRecords          byte = 1
	wireWatermark        byte = 2
	wireBarrier          byte = 3
	wireEndOfData        byte = 4
	wireEndOfPartition   byte = 5
	wireCancelCheckpoint byte = 6
	wireRecordPart       byte = 7  // one piece of a records body too large for one message
	wireCreditRequest    byte = 16 // sender -> receiver on the data subject; carries no sequence number
)

// HeaderLen is the size of a data message's fixed header:
//
//	u8 version, u8 kind, u64 sequence (little-endian)
const HeaderLen = 10

// partHeaderLen is the size of a record part's header after the message
// header: u64 total (bytes of the records body the parts carry), u64 offset
// (where this part starts in it).
const partHeaderLen = 16

// recordFrameOverhead is what a batch frame of one record adds to the
// record's key and value bytes: the u32 count and the record header.
const recordFrameOverhead = 4 + 16

// barrierBodyLen is the size of a barrier message's body.
const barrierBodyLen = 8 + 1 + 1

// creditLen is the size of a credit message: u8 version, u64 granted, u32 window.
const creditLen = 1 + 8 + 4

// The finishing handshake (docs/subjects.md "End-of-data acknowledgements").
const (
	// creditAckKind is the kind byte of an acknowledgement on the credit
	// subject: u8 version, u8 kind, u64 the sequence number of the
	// EndOfData message acknowledged. Its size is never creditLen, so a
	// grant (which has no kind byte) is told apart by its size.
	creditAckKind byte = 1
	creditAckLen       = 1 + 1 + 8
	// HeaderAcks on a credit grant: the receiver acknowledges EndOfData.
	HeaderAcks = "Streamd-Acks"
	// HeaderAckRequest on an EndOfData message: the sender waits for its
	// acknowledgement.
	HeaderAckRequest = "Streamd-Ack-Request"
)

// HeaderUnaligned on a barrier message: the barrier of an unaligned
// checkpoint (dataplane.Barrier.Unaligned), which the receiver may take
// ahead of the messages queued before it (docs/subjects.md, "Unaligned
// barriers" under "Data messages"). An older receiver ignores it and delivers the barrier in
// order, which is still correct.
const HeaderUnaligned = "Streamd-Unaligned"

// HeaderWatermarkStatus on a watermark message makes it a watermark-status
// event (dataplane.KindWatermarkStatus): "idle" or "active". The body is
// the watermark MIN, which an older receiver, ignoring the header, takes
// as a watermark that advances nothing (docs/subjects.md).
const HeaderWatermarkStatus = "Streamd-Watermark-Status"

// HeaderCheckpointBase on a barrier message: dataplane.Barrier.Base, the
// completed checkpoint whose shared state files an incremental checkpoint
// may refer to (docs/subjects.md). Absent: none (upload every file).
const HeaderCheckpointBase = "Streamd-Checkpoint-Base"

// creditRequestLen is the size of a credit request: header (seq 0), u64 last sequence sent.
const creditRequestLen = HeaderLen + 8

// ErrWire is wrapped by every decode error of a data or credit message.
var ErrWire = errors.New("natsch: malformed message")

// ChannelID names one channel: the edge (From, To, Input) of one job attempt
// and the sending and receiving subtasks.
type ChannelID struct {
	Job         string // job id: letters, digits, '-' and '_'
	Attempt     int    // job attempt (>= 0): a restarted job talks on new subjects
	From        string // uid of the sending operator
	FromSubtask int
	To          string // uid of the receiving operator
	ToSubtask   int
	Input       int // index of the edge among To's inputs (control.Edge.Input)
}

// Validate checks that every token is a valid subject token.
func (id ChannelID) Validate() error {
	for _, t := range []struct{ what, v string }{{"job", id.Job}, {"from", id.From}, {"to", id.To}} {
		if err := checkToken(t.v); err != nil {
			return fmt.Errorf("natsch: channel %s: %s: %w", id, t.what, err)
		}
	}
	if id.Attempt < 0 || id.FromSubtask < 0 || id.ToSubtask < 0 || id.Input < 0 {
		return fmt.Errorf("natsch: channel %s: negative attempt, subtask or input", id)
	}
	return nil
}

func checkToken(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > 128 {
		return fmt.Errorf("%d bytes, at most 128", len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%q: character %q not allowed (letters, digits, '-', '_')", s, c)
		}
	}
	return nil
}

func (id ChannelID) tokens() string {
	var b strings.Builder
	b.WriteString(id.Job)
	for _, t := range []string{strconv.Itoa(id.Attempt), id.From, strconv.Itoa(id.FromSubtask), id.To, strconv.Itoa(id.ToSubtask), strconv.Itoa(id.Input)} {
		b.WriteByte('.')
		b.WriteString(t)
	}
	return b.String()
}

// DataSubject is where the sender publishes events (and credit requests):
//
//	streamd.v1.data.<job>.<attempt>.<from>.<from-subtask>.<to>.<to-subtask>.<input>
func (id ChannelID) DataSubject() string { return PrefixData + "." + id.tokens() }

// CreditSubject is where the receiver publishes credit grants:
//
//	streamd.v1.credit.<job>.<attempt>.<from>.<from-subtask>.<to>.<to-subtask>.<input>
func (id ChannelID) CreditSubject() string { return PrefixCredit + "." + id.tokens() }

// String names the channel in errors, e.g. "wc/2: split[0]->count[1] (input 0)".
func (id ChannelID) String() string {
	return fmt.Sprintf("%s/%d: %s[%d]->%s[%d] (input %d)", id.Job, id.Attempt, id.From, id.FromSubtask, id.To, id.ToSubtask, id.Input)
}

// AppendEvent appends the data message of ev with sequence number seq to dst:
// the header (version, kind, seq) and the body of the kind:
//
//	records            abi batch frame
//	watermark          i64 ts
//	barrier            i64 id, u8 kind (0 checkpoint, 1 savepoint), u8 is_sync (0/1)
//	end-of-data        u8 drain (0/1)
//	end-of-partition   nothing
//	cancel-checkpoint  i64 id
//
// all little-endian. A record too large for one message is not an event of
// its own: the sender splits its records body into record parts
// (appendPartHeader), which the receiver reassembles.
func AppendEvent(dst []byte, seq uint64, ev dataplane.Event) ([]byte, error) {
	var k byte
	switch ev.Kind {
	case dataplane.KindRecords:
		k = wireRecords
	case dataplane.KindWatermark, dataplane.KindWatermarkStatus:
		k = wireWatermark
	case dataplane.KindBarrier:
		k = wireBarrier
	case dataplane.KindEndOfData:
		k = wireEndOfData
	case dataplane.KindEndOfPartition:
		k = wireEndOfPartition
	case dataplane.KindCancelCheckpoint:
		k = wireCancelCheckpoint
	default:
		return dst, fmt.Errorf("natsch: cannot encode event %s", ev)
	}
	dst = appendHeader(dst, k, seq)
	switch ev.Kind {
	case dataplane.KindRecords:
		var recs []abi.Record
		if ev.Batch != nil {
			recs = ev.Batch.Records
		}
		dst = abi.AppendBatch(dst, recs)
	case dataplane.KindWatermark:
		dst = binary.LittleEndian.AppendUint64(dst, uint64(ev.Watermark.TS))
	case dataplane.KindWatermarkStatus: // the header HeaderWatermarkStatus says which
		dst = binary.LittleEndian.AppendUint64(dst, 1<<63) // abi.MinWatermark
	case dataplane.KindBarrier:
		dst = binary.LittleEndian.AppendUint64(dst, uint64(ev.Barrier.ID))
		dst = append(dst, byte(ev.Barrier.Kind), b2u(ev.Barrier.IsSync))
	case dataplane.KindEndOfData:
		dst = append(dst, b2u(ev.EndOfData.Drain))
	case dataplane.KindCancelCheckpoint:
		dst = binary.LittleEndian.AppendUint64(dst, uint64(ev.Cancel.ID))
	}
	return dst, nil
}

func appendHeader(dst []byte, kind byte, seq uint64) []byte {
	dst = append(dst, WireVersion, kind)
	return binary.LittleEndian.AppendUint64(dst, seq)
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// DecodeEvent parses a data message. A records event's batch comes from
// dataplane.GetBatch and its keys and values alias data. Credit requests are
// not events: DecodeEvent rejects them.
func DecodeEvent(data []byte) (seq uint64, ev dataplane.Event, err error) {
	kind, seq, body, err := decodeHeader(data)
	if err != nil {
		return 0, ev, err
	}
	ev, err = decodeBody(kind, body)
	if err != nil {
		return 0, ev, err
	}
	return seq, ev, nil
}

// decodeBody parses the body of a data message of kind (any but a record
// part or a credit request).
func decodeBody(kind byte, body []byte) (ev dataplane.Event, err error) {
	fixed := func(n int) error {
		if len(body) != n {
			return fmt.Errorf("%w: %d-byte body for kind %d, want %d", ErrWire, len(body), kind, n)
		}
		return nil
	}
	switch kind {
	case wireRecords:
		b := dataplane.GetBatch()
		if err := b.DecodeFrame(body); err != nil {
			b.Release()
			return ev, fmt.Errorf("%w: records: %w", ErrWire, err)
		}
		return dataplane.RecordsEvent(b), nil
	case wireWatermark:
		if err := fixed(8); err != nil {
			return ev, err
		}
		return dataplane.WatermarkEvent(int64(binary.LittleEndian.Uint64(body))), nil
	case wireBarrier:
		if err := fixed(barrierBodyLen); err != nil {
			return ev, err
		}
		bk := dataplane.BarrierKind(body[8])
		if bk != dataplane.Checkpoint && bk != dataplane.Savepoint || body[9] > 1 {
			return ev, fmt.Errorf("%w: barrier kind %d, sync %d", ErrWire, body[8], body[9])
		}
		return dataplane.BarrierEvent(dataplane.Barrier{ID: int64(binary.LittleEndian.Uint64(body)), Kind: bk, IsSync: body[9] == 1}), nil
	case wireEndOfData:
		if err := fixed(1); err != nil {
			return ev, err
		}
		if body[0] > 1 {
			return ev, fmt.Errorf("%w: end-of-data drain %d", ErrWire, body[0])
		}
		return dataplane.EndOfDataEvent(body[0] == 1), nil
	case wireEndOfPartition:
		if err := fixed(0); err != nil {
			return ev, err
		}
		return dataplane.EndOfPartitionEvent(), nil
	case wireCancelCheckpoint:
		if err := fixed(8); err != nil {
			return ev, err
		}
		return dataplane.CancelCheckpointEvent(int64(binary.LittleEndian.Uint64(body))), nil
	}
	if kind == wireRecordPart {
		return ev, fmt.Errorf("%w: a record part is not an event by itself (a Receiver reassembles parts)", ErrWire)
	}
	return ev, fmt.Errorf("%w: unknown kind %d", ErrWire, kind)
}

func decodeHeader(data []byte) (kind byte, seq uint64, body []byte, err error) {
	if len(data) < HeaderLen {
		return 0, 0, nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrWire, len(data), HeaderLen)
	}
	if data[0] != WireVersion {
		return 0, 0, nil, fmt.Errorf("%w: version %d, want %d", ErrWire, data[0], WireVersion)
	}
	return data[1], binary.LittleEndian.Uint64(data[2:]), data[HeaderLen:], nil
}

// appendPartHeader appends the header of the record part at offset of a
// records body of total bytes, whose message has sequence number seq; the
// part's bytes follow it.
func appendPartHeader(dst []byte, seq uint64, total, offset uint64) []byte {
	dst = appendHeader(dst, wireRecordPart, seq)
	dst = binary.LittleEndian.AppendUint64(dst, total)
	return binary.LittleEndian.AppendUint64(dst, offset)
}

// decodePart splits a record part's body into its header and bytes.
func decodePart(body []byte) (total, offset uint64, part []byte, err error) {
	if len(body) <= partHeaderLen {
		return 0, 0, nil, fmt.Errorf("%w: record part of %d bytes: want a %d-byte part header and at least one byte", ErrWire, len(body), partHeaderLen)
	}
	return binary.LittleEndian.Uint64(body), binary.LittleEndian.Uint64(body[8:]), body[partHeaderLen:], nil
}

func appendCreditRequest(dst []byte, lastSent uint64) []byte {
	dst = appendHeader(dst, wireCreditRequest, 0)
	return binary.LittleEndian.AppendUint64(dst, lastSent)
}

// appendCredit encodes a grant: the receiver has granted granted bytes in
// total since the channel started, and keeps a window of window bytes.
func appendCredit(dst []byte, granted uint64, window uint32) []byte {
	dst = append(dst, WireVersion)
	dst = binary.LittleEndian.AppendUint64(dst, granted)
	return binary.LittleEndian.AppendUint32(dst, window)
}

// appendCreditAck encodes the acknowledgement of the EndOfData message of
// sequence number seq.
func appendCreditAck(dst []byte, seq uint64) []byte {
	dst = append(dst, WireVersion, creditAckKind)
	return binary.LittleEndian.AppendUint64(dst, seq)
}

// decodeCreditAck decodes an acknowledgement (a credit-subject message that
// is no grant).
func decodeCreditAck(data []byte) (seq uint64, err error) {
	if len(data) != creditAckLen || data[0] != WireVersion || data[1] != creditAckKind {
		return 0, fmt.Errorf("%w: credit-subject message of %d bytes (version %d): neither a %d-byte grant nor a %d-byte end-of-data acknowledgement of version %d", ErrWire, len(data), first(data), creditLen, creditAckLen, WireVersion)
	}
	return binary.LittleEndian.Uint64(data[2:]), nil
}

func decodeCredit(data []byte) (granted uint64, window uint32, err error) {
	if len(data) != creditLen || data[0] != WireVersion {
		return 0, 0, fmt.Errorf("%w: credit message of %d bytes (version %d), want %d bytes of version %d", ErrWire, len(data), first(data), creditLen, WireVersion)
	}
	return binary.LittleEndian.Uint64(data[1:]), binary.LittleEndian.Uint32(data[9:]), nil
}

func first(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}
