package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

func rec(key, value string, ts int64) Element {
	var k, v []byte
	if key != "" {
		k = []byte(key)
	}
	if value != "" {
		v = []byte(value)
	}
	return RecordElement(abi.Record{Key: k, Value: v, Timestamp: ts})
}

func testChannels() *ChannelState {
	return &ChannelState{
		Inputs: []ChannelData{
			{Operator: "src", Subtask: 1, Input: 0, Elements: []Element{rec("k1", "a", 5), WatermarkElement(4), rec("", "no key", -3)}},
			{Operator: "side", Subtask: 0, Input: 1, Elements: []Element{WatermarkElement(abi.MaxWatermark)}},
		},
		Outputs: []ChannelData{
			{Operator: "sink", Subtask: 2, Input: 0, Elements: []Element{rec("k2", "", 7), withHeaders(rec("k3", "h", 8), "trace", "t-1")}},
		},
	}
}

// withHeaders is e with the header name: value.
func withHeaders(e Element, name, value string) Element {
	e.Record.Headers = abi.AppendHeader(e.Record.Headers, name, []byte(value))
	return e
}

// A record without headers is encoded as kind 1, as before headers; one
// with headers as kind 3; a header block cut short inside its length is
// refused.
func TestChannelStateHeaders(t *testing.T) {
	plain := &ChannelState{Inputs: []ChannelData{{Operator: "src", Elements: []Element{rec("k", "v", 1)}}}}
	b, err := plain.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if kind := b[len(channelMagic)+4+4+minChannelBytes-4+len("src")+4]; kind != byte(ElementRecord) {
		t.Fatalf("a record without headers is encoded as kind %d", kind)
	}
	hs := &ChannelState{Inputs: []ChannelData{{Operator: "src", Elements: []Element{withHeaders(rec("k", "v", 1), "n", "value")}}}}
	b, err = hs.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeChannelState(b)
	if err != nil || !reflect.DeepEqual(got.Inputs, hs.Inputs) {
		t.Fatalf("round trip with headers: %+v, %v", got, err)
	}
	// The header entry's name length made to run past its block, with the
	// checksum fixed up: the block is refused, not read past.
	bad := bytes.Clone(b[:len(b)-4])
	hdr := hs.Inputs[0].Elements[0].Record.Headers
	binary.LittleEndian.PutUint32(bad[len(bad)-len(hdr):], 100)
	bad = binary.LittleEndian.AppendUint32(bad, crc32c(bad))
	if _, err := DecodeChannelState(bad); err == nil || !strings.Contains(err.Error(), "headers") {
		t.Fatalf("a bad header block decodes: %v", err)
	}
}

func TestChannelStateRoundTrip(t *testing.T) {
	c := testChannels()
	b, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != c.EncodedSize() {
		t.Fatalf("encoded %d bytes, EncodedSize says %d", len(b), c.EncodedSize())
	}
	got, err := DecodeChannelState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
	}

	// Inside a state blob, next to operator state: version 2, and back.
	st := &SubtaskState{Operator: &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}, Lists: map[string]*host.ListState{}}, SinkPending: []byte("txn"), Channels: c}
	blob, err := EncodeState(st)
	if err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint32(blob[4:]); v != FormatVersionChannelState {
		t.Fatalf("blob with channel state has version %d, want %d", v, FormatVersionChannelState)
	}
	back, err := DecodeState(blob)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Channels, c) || string(back.SinkPending) != "txn" || back.Operator == nil {
		t.Fatalf("blob round trip: %+v", back)
	}
}

// An aligned checkpoint's blob is what it was before channel state existed:
// version 1, no section 4, whether Channels is nil or empty.
func TestAlignedBlobUnchanged(t *testing.T) {
	// The version 1 blob of SubtaskState{SourcePosition: "pos"}, written
	// out by hand from docs/checkpoint-format.md.
	le := binary.LittleEndian
	old := []byte("SDST")
	old = le.AppendUint32(old, 1)
	old = le.AppendUint32(old, 1)
	old = append(old, tagSourcePosition)
	old = le.AppendUint64(old, 3)
	old = append(old, "pos"...)
	old = le.AppendUint32(old, crc32c(old))
	for _, c := range []*ChannelState{nil, {}} {
		b, err := EncodeState(&SubtaskState{SourcePosition: []byte("pos"), Channels: c})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, old) {
			t.Fatalf("aligned blob (channels %v) changed:\n got %x\nwant %x", c, b, old)
		}
	}
	st, err := DecodeState(old)
	if err != nil || string(st.SourcePosition) != "pos" || st.Channels != nil {
		t.Fatalf("old blob: %+v, %v", st, err)
	}
}

func wantCorrupt(t *testing.T, err error, frag string) {
	t.Helper()
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), frag) {
		t.Fatalf("error %v: want ErrCorrupt containing %q", err, frag)
	}
}

// resum rewrites the trailing crc32c of b, so that a test reaches the checks
// behind the checksum.
func resum(b []byte) []byte {
	b = bytes.Clone(b)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32c(b[:len(b)-4]))
	return b
}

func TestChannelStateCorrupt(t *testing.T) {
	b, err := testChannels().Encode()
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(b)
	flipped[20] ^= 0x40
	_, err = DecodeChannelState(flipped)
	wantCorrupt(t, err, "checksum mismatch")
	_, err = DecodeChannelState(b[:len(b)-7])
	wantCorrupt(t, err, "checksum mismatch")
	_, err = DecodeChannelState(b[:10])
	wantCorrupt(t, err, "truncated: 10 bytes")
	_, err = DecodeChannelState(append([]byte("XXXX"), b[4:]...))
	wantCorrupt(t, err, `not a channel-state section (magic "XXXX")`)

	// Counts and lengths larger than what remains are refused before any
	// allocation, even with a valid checksum.
	le := binary.LittleEndian
	huge := bytes.Clone(b)
	le.PutUint32(huge[8:], 0xffffffff) // input channel count
	_, err = DecodeChannelState(resum(huge))
	wantCorrupt(t, err, "input channel count 4294967295 at byte 8 exceeds")
	huge = bytes.Clone(b)
	le.PutUint32(huge[12:], 0x7fffffff) // length of the first operator name
	_, err = DecodeChannelState(resum(huge))
	wantCorrupt(t, err, "operator name of 2147483647 bytes at byte 12 exceeds")
	huge = bytes.Clone(b)
	le.PutUint32(huge[12+4+3+8:], 0xfffffff0) // element count of channel src[1]
	_, err = DecodeChannelState(resum(huge))
	wantCorrupt(t, err, "element count of input channel (src[1], input 0) 4294967280")
	huge = bytes.Clone(b)
	huge[12+4+3+12] = 9 // kind of the first element
	_, err = DecodeChannelState(resum(huge))
	wantCorrupt(t, err, "input channel (src[1], input 0) element 0: unknown element kind 9")

	// In a blob: the section is checked too, with the blob's own checksum
	// intact.
	blob, err := EncodeState(&SubtaskState{Channels: testChannels()})
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(blob)
	bad[12+9+20] ^= 1 // inside the channel-state section
	_, err = DecodeState(resum(bad))
	wantCorrupt(t, err, "channel state: checksum mismatch")
	_, err = DecodeState(blob[:len(blob)-30])
	wantCorrupt(t, err, "checksum mismatch")
	// Channel state in a version 1 blob is refused.
	v1 := bytes.Clone(blob)
	le.PutUint32(v1[4:], 1)
	_, err = DecodeState(resum(v1))
	wantCorrupt(t, err, "channel state (section tag 4) in a version 1 blob")
}

func TestChannelStateEncodeChecks(t *testing.T) {
	dup := &ChannelState{Inputs: []ChannelData{{Operator: "a", Elements: []Element{WatermarkElement(1)}}, {Operator: "a"}}}
	if _, err := dup.Encode(); err == nil || !strings.Contains(err.Error(), "input channel (a[0], input 0) appears twice") {
		t.Fatalf("duplicate channel: %v", err)
	}
	bad := &ChannelState{Outputs: []ChannelData{{Operator: "a", Elements: []Element{{Kind: 7}}}}}
	if _, err := EncodeState(&SubtaskState{Channels: bad}); err == nil || !strings.Contains(err.Error(), "unknown kind 7") {
		t.Fatalf("bad kind: %v", err)
	}
}

// A checkpoint with channel state: blobs through a Dir and a JetStream
// store, metadata version 2 with inflight_bytes, read back, and an aligned
// one stays version 1.
func TestChannelStateCheckpoint(t *testing.T) {
	t.Run("dir", func(t *testing.T) { testChannelStateCheckpoint(t, openDir(t)) })
	t.Run("jetstream", func(t *testing.T) {
		s, err := OpenJetStream(context.Background(), jetStream(t), "", "job")
		if err != nil {
			t.Fatal(err)
		}
		testChannelStateCheckpoint(t, s)
	})
}

// metadataBytes returns the stored _metadata of md (directory layout only;
// nil for another store).
func metadataBytes(t *testing.T, d Store, md *Metadata) []byte {
	t.Helper()
	if _, ok := d.(*Dir); !ok {
		return nil
	}
	raw, err := os.ReadFile(filepath.Join(md.Location, MetadataFile))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func testChannelStateCheckpoint(t *testing.T, d Store) {
	ctx := context.Background()
	g, err := control.NewJobGraph("job", []*control.Vertex{
		{UID: "src", Parallelism: 1, Kind: control.KindSource},
		{UID: "sink", Parallelism: 1, Kind: control.KindSink, Inputs: []control.Edge{{From: "src", Partition: control.Forward}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	write := func(id int64, ch *ChannelState) *Metadata {
		t.Helper()
		var acks []control.AckedState
		for _, s := range []struct {
			sub control.SubtaskID
			st  *SubtaskState
		}{
			{control.SubtaskID{Operator: "src", Index: 0}, &SubtaskState{SourcePosition: []byte("7")}},
			{control.SubtaskID{Operator: "sink", Index: 0}, &SubtaskState{SinkPending: []byte("txn"), Channels: ch}},
		} {
			ref, err := WriteSubtaskState(ctx, d, control.KindCheckpoint, id, s.sub, s.st)
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, control.AckedState{Subtask: s.sub, StateRef: ref.String(), Size: ref.Size})
		}
		md, err := NewMetadata(g, control.PersistMetadata{ID: id, Kind: control.KindCheckpoint, Acks: acks}, time.Unix(1700000000, 0))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Commit(ctx, md); err != nil {
			t.Fatal(err)
		}
		return md
	}
	ch := &ChannelState{Inputs: []ChannelData{{Operator: "src", Subtask: 0, Input: 0, Elements: []Element{rec("k", "v", 1), WatermarkElement(1)}}}}
	md := write(1, ch)
	if raw := metadataBytes(t, d, md); raw != nil && (!bytes.HasPrefix(raw, []byte("streamd-checkpoint v2 ")) || !bytes.Contains(raw, []byte(`"inflight_bytes": `))) {
		t.Fatalf("metadata with channel state:\n%s", raw)
	}
	back, err := d.Latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if back.Version != FormatVersionChannelState || back.InFlightBytes() != ch.EncodedSize() || back.Operator("src").InFlightBytes() != 0 {
		t.Fatalf("metadata read back: version %d, in flight %d (want %d)", back.Version, back.InFlightBytes(), ch.EncodedSize())
	}
	res, err := LoadRestoreFrom(ctx, d, back, g)
	if err != nil {
		t.Fatal(err)
	}
	sr := res.Subtasks[control.SubtaskID{Operator: "sink", Index: 0}]
	if sr == nil || !reflect.DeepEqual(sr.InFlight, ch.Inputs) || len(sr.SinkPending) != 1 {
		t.Fatalf("restore of the sink: %+v", sr)
	}

	// The metadata's inflight_bytes must agree with the blob.
	sub := back.Operator("sink").Subtasks[0]
	sub.InFlightBytes--
	_, err = d.ReadState(ctx, back, sub)
	wantCorrupt(t, err, "bytes of channel state, the metadata says")

	// Aligned: version 1, no inflight_bytes, nothing in flight on restore.
	md = write(2, nil)
	if raw := metadataBytes(t, d, md); raw != nil && (!bytes.HasPrefix(raw, []byte("streamd-checkpoint v1 ")) || bytes.Contains(raw, []byte("inflight"))) {
		t.Fatalf("aligned metadata:\n%s", raw)
	}
	if back, err = d.Latest(ctx); err != nil || back.Version != FormatVersion {
		t.Fatalf("aligned checkpoint read back: %+v, %v", back, err)
	}
	res, err = LoadRestoreFrom(ctx, d, back, g)
	if err != nil {
		t.Fatal(err)
	}
	if sr := res.Subtasks[control.SubtaskID{Operator: "sink", Index: 0}]; sr == nil || sr.InFlight != nil {
		t.Fatalf("aligned restore of the sink: %+v", sr)
	}
}
