package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

func TestStateRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	snaps, _ := keyedSnapshots(rng, 1, 128, 200)
	snaps[0].Lists["offsets"] = &host.ListState{Mode: abi.ListSplit, Entries: [][]byte{[]byte("a"), {}}}
	cases := map[string]*SubtaskState{
		"empty":    {},
		"operator": {Operator: snaps[0]},
		"source":   {SourcePosition: []byte{1, 2, 3}},
		"all":      {Operator: snaps[0], SourcePosition: []byte{}, SinkPending: []byte("pending")},
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeState(s)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeState(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalize(got), normalize(s)) {
				t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, s)
			}
			// Every single-byte corruption and every truncation is refused.
			for i := 0; i < len(b); i += 1 + len(b)/50 {
				c := append([]byte{}, b...)
				c[i] ^= 0x40
				if _, err := DecodeState(c); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("byte %d flipped: err = %v, want ErrCorrupt", i, err)
				}
				if _, err := DecodeState(b[:i]); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("truncated to %d: err = %v, want ErrCorrupt", i, err)
				}
			}
		})
	}
}

// normalize makes empty and nil maps compare equal and sorts nothing (the
// encoding keeps order).
func normalize(s *SubtaskState) *SubtaskState {
	c := *s
	if c.Operator != nil {
		o := c.Operator.Clone()
		for _, g := range o.KeyGroups {
			sortTimers(g.Timers)
		}
		c.Operator = o
	}
	return &c
}

func TestBlobRefString(t *testing.T) {
	r := BlobRef{Name: "op-count-1.state", Size: 1234, CRC32C: 0xdeadbeef}
	s := r.String()
	if s != "op-count-1.state?size=1234&crc32c=deadbeef" {
		t.Fatalf("String = %q", s)
	}
	got, err := ParseBlobRef(s)
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("ParseBlobRef(%q) = %+v, %v", s, got, err)
	}
	r.Shared = []SharedRef{{Name: "7-count-0-0a1b2c3d-000012.sst", Size: 99}, {Name: "9-count-0-00000000-000020.sst", Size: 0}}
	if got, err := ParseBlobRef(r.String()); err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("ParseBlobRef(%q) = %+v, %v", r.String(), got, err)
	}
	for _, bad := range []string{"a?size=1&crc32c=0&shared=x.sst:1", "a?size=1&crc32c=0&shared=1-a:b", "a?size=1&crc32c=0&shared=1-a/../b:1", "", "x", "../a?size=1&crc32c=0", "a?size=-1&crc32c=0", "a?size=1", "_metadata?size=1&crc32c=0", "a/b?size=1&crc32c=0"} {
		if _, err := ParseBlobRef(bad); err == nil || !strings.Contains(err.Error(), "checkpoint:") {
			t.Errorf("ParseBlobRef(%q) err = %v, want an error", bad, err)
		}
	}
}

// EncodeState embeds host.Snapshot's own encoding, byte for byte.
func TestSnapshotEncodingMatchesHost(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	snaps, _ := keyedSnapshots(rng, 1, 64, 500)
	s := snaps[0]
	s.Lists["u"] = &host.ListState{Mode: abi.ListUnion, Entries: [][]byte{[]byte("x"), nil}}
	s.Lists["nil"] = nil
	s.KeyGroups[63] = nil
	s.KeyGroups[1] = &host.KeyGroupState{Entries: map[string]map[string][]byte{"empty": {}, "nilval": {"k": nil}}}
	withProc := s.Clone()
	withProc.KeyGroups[2] = &host.KeyGroupState{ProcTimers: []host.Timer{{Key: []byte("b"), TS: 3}, {Key: []byte("a"), TS: 3}}}
	for _, snap := range []*host.Snapshot{s, {}, withProc} {
		want, err := snap.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := appendSnapshot(nil, snap, true)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("appendSnapshot differs from host.Snapshot.MarshalBinary (%d vs %d bytes)", len(got), len(want))
		}
		// A checkpoint's encoding (keys in map order) is as long and
		// decodes to the same state.
		unsorted, _, err := appendSnapshot(nil, snap, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(unsorted) != len(want) {
			t.Fatalf("unsorted encoding: %d bytes, sorted %d", len(unsorted), len(want))
		}
		var back host.Snapshot
		if err := back.UnmarshalBinary(unsorted); err != nil {
			t.Fatalf("unsorted encoding does not decode: %v", err)
		}
		again, err := back.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, want) {
			t.Fatal("unsorted encoding decodes to a different state")
		}
	}
}

// The encoding buffers are kept, largest first, at most maxPooledBlobs.
func TestBlobBufList(t *testing.T) {
	var l bufList
	if l.get() != nil {
		t.Fatal("an empty list gave a buffer")
	}
	for _, n := range []int{10, 50, 20, 40, 30, 0} {
		l.put(make([]byte, min(3, n), n))
	}
	if len(l.bufs) != maxPooledBlobs {
		t.Fatalf("kept %d buffers, want %d", len(l.bufs), maxPooledBlobs)
	}
	for _, want := range []int{50, 40, 30, 20} {
		b := l.get()
		if cap(b) != want || len(b) != 0 {
			t.Fatalf("got a buffer of len %d cap %d, want len 0 cap %d", len(b), cap(b), want)
		}
	}
	if l.get() != nil {
		t.Fatal("the list gave more buffers than it kept")
	}
}

// WriteSubtaskState checksums the blob as it encodes it: the ref's CRC32C
// is that of the file written, and the blob's own trailer verifies, with
// and without other sections after the operator snapshot.
func TestWriteSubtaskStateChecksum(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	snaps, _ := keyedSnapshots(rng, 1, 64, 2000)
	d, err := OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range []*SubtaskState{
		{Operator: snaps[0]},
		{Operator: snaps[0], SourcePosition: []byte("pos"), SinkPending: []byte("pending")},
		{SourcePosition: []byte("only")},
	} {
		for _, kind := range []control.CheckpointKind{control.KindCheckpoint, control.KindSavepoint} {
			sub := control.SubtaskID{Operator: "op", Index: i}
			ref, err := WriteSubtaskState(context.Background(), d, kind, int64(i+1), sub, st)
			if err != nil {
				t.Fatal(err)
			}
			dir, err := d.checkpointDir(kind, int64(i+1), false)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(dir, ref.Name))
			if err != nil {
				t.Fatal(err)
			}
			if crc32c(data) != ref.CRC32C || int64(len(data)) != ref.Size {
				t.Fatalf("state %d (%s): ref says crc %08x size %d, the file has %08x %d", i, kind, ref.CRC32C, ref.Size, crc32c(data), len(data))
			}
			if _, err := DecodeState(data); err != nil {
				t.Fatalf("state %d (%s): %v", i, kind, err)
			}
		}
	}
}
