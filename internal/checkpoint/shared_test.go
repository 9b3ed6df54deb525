package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
)

// commitShared commits checkpoint id of a one-subtask operator whose state
// refers to files: their keys (uploading the new ones, "name" -> content).
func commitShared(t *testing.T, d SharedStore, id int64, reuse []SharedRef, upload map[string]string) *Metadata {
	t.Helper()
	ctx := context.Background()
	refs := slices.Clone(reuse)
	for name, content := range upload {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		key := sharedKey(id, control.SubtaskID{Operator: "op", Index: 0}, name)
		n, _, err := d.PutShared(ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, SharedRef{Name: key, Size: n})
	}
	ref, err := d.WriteState(ctx, control.KindCheckpoint, id, control.SubtaskID{Operator: "op"}, []byte("blob"))
	if err != nil {
		t.Fatal(err)
	}
	md := &Metadata{Job: "j", ID: id, Kind: control.KindCheckpoint, Operators: []OperatorMeta{{UID: "op", Parallelism: 1, MaxParallelism: 128,
		Subtasks: []SubtaskMeta{{Index: 0, Ref: ref.Name, Size: ref.Size, CRC32C: ref.CRC32C, Shared: refs}}}}}
	if err := d.Commit(ctx, md); err != nil {
		t.Fatal(err)
	}
	waitCleanup(t, d)
	return md
}

func sharedNames(t *testing.T, d *Dir) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.Root(), SharedDir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func refNames(mds ...*Metadata) []string {
	var out []string
	for _, md := range mds {
		for _, r := range md.SharedFiles() {
			if !slices.Contains(out, r.Name) {
				out = append(out, r.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestSharedFilesCollected: with retention 1, a commit deletes the shared
// files only the retired checkpoint referred to, keeps the ones the new one
// reuses, and keeps files uploaded by a newer checkpoint still in progress;
// the files of an upload whose checkpoint never committed (a crash before
// its metadata) go with the next commit; a crash half way through the
// deletions leaves only unreferenced files, which the next commit deletes.
// The metadata's versions and sizes say full and incremental.
func TestSharedFilesCollected(t *testing.T) {
	d, err := OpenDir(t.TempDir(), WithRetain(1))
	if err != nil {
		t.Fatal(err)
	}
	md1 := commitShared(t, d, 1, nil, map[string]string{"a.sst": "aaaa", "b.sst": "bb"})
	if md1.Version != FormatVersionShared || md1.FullSize() != md1.IncrementalSize() {
		t.Fatalf("checkpoint 1: version %d, full %d, incremental %d", md1.Version, md1.FullSize(), md1.IncrementalSize())
	}
	var a SharedRef
	for _, r := range md1.SharedFiles() {
		if r.Size == 4 {
			a = r
		}
	}
	// Checkpoint 3 uploads (it is in progress) while 2 commits.
	p := filepath.Join(t.TempDir(), "d.sst")
	os.WriteFile(p, []byte("ddd"), 0o644)
	inProgress := sharedKey(3, control.SubtaskID{Operator: "op"}, "d.sst")
	if _, _, err := d.PutShared(context.Background(), inProgress, p); err != nil {
		t.Fatal(err)
	}
	md2 := commitShared(t, d, 2, []SharedRef{a}, map[string]string{"c.sst": "c"})
	if got, want := md2.IncrementalSize(), md2.FullSize()-4; got != want {
		t.Fatalf("checkpoint 2: incremental %d, want full %d - 4 reused", got, md2.FullSize())
	}
	want := append(refNames(md2), inProgress)
	slices.Sort(want)
	if got := sharedNames(t, d); !slices.Equal(got, want) {
		t.Fatalf("after checkpoint 2: shared files %v, want %v (b.sst gone, a.sst reused, 3's upload kept)", got, want)
	}
	// Checkpoint 3 never commits (a crash after its upload); 4 does.
	md4 := commitShared(t, d, 4, md2.SharedFiles(), map[string]string{"e.sst": "eeeee"})
	if got := sharedNames(t, d); !slices.Equal(got, refNames(md4)) {
		t.Fatalf("after checkpoint 4: shared files %v, want %v (3's orphaned upload gone)", got, refNames(md4))
	}
	// A crash after the first deletion of the commit of 5.
	deleted := 0
	d.removeShared = func(path string) error {
		if deleted++; deleted > 1 {
			panic("crash")
		}
		return os.Remove(path)
	}
	func() {
		defer func() { recover() }()
		commitShared(t, d, 5, nil, map[string]string{"f.sst": "f"})
	}()
	// The restarted process: checkpoint 5 is complete and whole.
	d, err = OpenDir(d.Root(), WithRetain(1))
	if err != nil {
		t.Fatal(err)
	}
	md5, err := d.Latest(context.Background())
	if err != nil || md5.ID != 5 {
		t.Fatalf("latest %v, %v; want checkpoint 5", md5, err)
	}
	got := sharedNames(t, d)
	for _, n := range refNames(md5) {
		if !slices.Contains(got, n) {
			t.Fatalf("checkpoint 5's file %s is missing after the crash", n)
		}
	}
	if len(got) <= len(refNames(md5)) {
		t.Fatalf("the crash left no unreferenced file (%v): the test did not crash half way", got)
	}
	md6 := commitShared(t, d, 6, md5.SharedFiles(), nil)
	if got := sharedNames(t, d); !slices.Equal(got, refNames(md6)) {
		t.Fatalf("after checkpoint 6: shared files %v, want %v", got, refNames(md6))
	}
}

// streamStores opens both stores that stream blobs: a directory, and the
// prefix "job" of bucket on an embedded JetStream.
func streamStores(t *testing.T, bucket string) (*Dir, *JetStream) {
	t.Helper()
	jss, err := OpenJetStream(context.Background(), jetStream(t), bucket, "job")
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d, jss
}

// TestWriteStateFrom: both stores write a blob streamed by encodeStateTo
// that is byte for byte EncodeState's, readable as such; a write that fails
// half way leaves no blob behind.
func TestWriteStateFrom(t *testing.T) {
	d, jss := streamStores(t, "streamtest")
	snaps, _ := keyedSnapshots(rand.New(rand.NewPCG(1, 2)), 1, 128, 500)
	st := &SubtaskState{Operator: snaps[0], SourcePosition: []byte("pos"), SinkPending: []byte("pending")}
	want, err := EncodeState(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []interface {
		Store
		StreamStore
	}{d, jss} {
		ctx := context.Background()
		sub := control.SubtaskID{Operator: "op"}
		ref, err := s.WriteStateFrom(ctx, control.KindSavepoint, 3, sub, func(w io.Writer) error { return encodeStateTo(w, st) })
		if err != nil {
			t.Fatal(err)
		}
		if ref.Size != int64(len(want)) || ref.CRC32C != crc32c(want) {
			t.Fatalf("%T: streamed blob of %d bytes crc %08x, EncodeState %d bytes crc %08x", s, ref.Size, ref.CRC32C, len(want), crc32c(want))
		}
		md := &Metadata{Job: "job", ID: 3, Kind: control.KindSavepoint, Time: time.Unix(1700000000, 0).UTC(),
			Operators: []OperatorMeta{{UID: "op", Parallelism: 1, MaxParallelism: 128, Subtasks: []SubtaskMeta{{Index: 0, Ref: ref.Name, Size: ref.Size, CRC32C: ref.CRC32C}}}}}
		if err := s.Commit(ctx, md); err != nil {
			t.Fatal(err)
		}
		got, err := s.ReadState(ctx, md, md.Operators[0].Subtasks[0])
		if err != nil {
			t.Fatal(err)
		}
		if again, err := EncodeState(got); err != nil || !bytes.Equal(again, want) {
			t.Fatalf("%T: the streamed blob reads back differently", s)
		}
		if _, err := s.WriteStateFrom(ctx, control.KindCheckpoint, 4, sub, func(w io.Writer) error {
			w.Write([]byte("SDST partial"))
			return errors.New("disk on fire")
		}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Fatalf("%T: a failed write: err %v", s, err)
		}
	}
	if _, err := os.Stat(filepath.Join(d.Root(), "chk-4", "op-op-0.state")); !os.IsNotExist(err) {
		t.Fatalf("a failed streamed write left its blob: %v", err)
	}
}

// TestWriteSubtaskStateStreamsSinkPending: a sink's pending-commit data of
// streamSinkPending bytes or more goes to either store without being copied
// into a blob first, and the blob is byte for byte EncodeState's, with and
// without a source position and channel state.
func TestWriteSubtaskStateStreamsSinkPending(t *testing.T) {
	d, jss := streamStores(t, "sinkstream")
	pending := make([]byte, streamSinkPending+17)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range pending {
		pending[i] = byte(rng.Uint32())
	}
	ch := &ChannelState{Inputs: []ChannelData{{Operator: "src", Elements: []Element{rec("k", "v", 1), WatermarkElement(1)}}}}
	for i, st := range []*SubtaskState{
		{SinkPending: pending},
		{SinkPending: pending, SourcePosition: []byte("pos")},
		{SinkPending: pending, Channels: ch},
		{SinkPending: pending[:100]}, // small: copied into a blob, the same bytes
		{SinkPendingParts: [][]byte{pending[:10], pending[10:]}},
		{SinkPendingParts: [][]byte{pending[:10], pending[10:100]}},
	} {
		// In parts, the blob is the one of the parts joined.
		joined := *st
		if st.SinkPendingParts != nil {
			joined.SinkPending, joined.SinkPendingParts = slices.Concat(st.SinkPendingParts...), nil
		}
		want, err := EncodeState(&joined)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []Store{d, jss} {
			ctx := context.Background()
			sub := control.SubtaskID{Operator: "sink"}
			ref, err := WriteSubtaskState(ctx, s, control.KindCheckpoint, int64(i+1), sub, st)
			if err != nil {
				t.Fatal(err)
			}
			if ref.Size != int64(len(want)) || ref.CRC32C != crc32c(want) {
				t.Fatalf("%T, state %d: blob of %d bytes crc %08x, EncodeState %d bytes crc %08x", s, i, ref.Size, ref.CRC32C, len(want), crc32c(want))
			}
			md := &Metadata{Job: "job", ID: int64(i + 1), Kind: control.KindCheckpoint, Time: time.Unix(1700000000, 0).UTC(),
				Operators: []OperatorMeta{{UID: "sink", Parallelism: 1, MaxParallelism: 128, Subtasks: []SubtaskMeta{{Index: 0, Ref: ref.Name, Size: ref.Size, CRC32C: ref.CRC32C, InFlightBytes: ref.InFlight}}}}}
			if err := s.Commit(ctx, md); err != nil {
				t.Fatal(err)
			}
			got, err := s.ReadState(ctx, md, md.Operators[0].Subtasks[0])
			if err != nil {
				t.Fatalf("%T, state %d: %v", s, i, err)
			}
			if !bytes.Equal(got.SinkPending, joined.SinkPending) || !bytes.Equal(got.SourcePosition, st.SourcePosition) || got.Channels.Empty() != st.Channels.Empty() {
				t.Fatalf("%T, state %d: read back differently", s, i)
			}
		}
	}
}

// TestJetStreamSharedFiles: the JetStream store keeps shared files under
// PREFIX/shared/, a checkpoint read back fetches them with their checksum,
// and a commit deletes those no retained checkpoint refers to (keeping a
// newer uploader's).
func TestJetStreamSharedFiles(t *testing.T) {
	ctx := context.Background()
	js := jetStream(t)
	s, err := OpenJetStream(ctx, js, "sharedtest", "job-1", WithRetain(1))
	if err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		obs, err := js.ObjectStore(ctx, "sharedtest")
		if err != nil {
			t.Fatal(err)
		}
		infos, _ := obs.List(ctx)
		var out []string
		for _, in := range infos {
			if k, ok := strings.CutPrefix(in.Name, "job-1/"+SharedDir+"/"); ok && !in.Deleted {
				out = append(out, k)
			}
		}
		slices.Sort(out)
		return out
	}
	md1 := commitShared(t, s, 1, nil, map[string]string{"a.sst": "aaaa", "b.sst": "bb"})
	p := filepath.Join(t.TempDir(), "d.sst")
	os.WriteFile(p, []byte("ddd"), 0o644)
	newer := sharedKey(3, control.SubtaskID{Operator: "op"}, "d.sst")
	if _, _, err := s.PutShared(ctx, newer, p); err != nil {
		t.Fatal(err)
	}
	var a SharedRef
	for _, r := range md1.SharedFiles() {
		if r.Size == 4 {
			a = r
		}
	}
	md2 := commitShared(t, s, 2, []SharedRef{a}, map[string]string{"c.sst": "c"})
	want := append(refNames(md2), newer)
	slices.Sort(want)
	if got := names(); !slices.Equal(got, want) {
		t.Fatalf("shared objects %v, want %v", got, want)
	}
	// The store's root, and a fetch that checks what it reads.
	root, open := jsShared(md2, s.obs, "sharedtest", "job-1/chk-2")
	if root != s.Root() || !InStore(s, md2) {
		t.Fatalf("shared root %q, store root %q (in store: %v)", root, s.Root(), InStore(s, md2))
	}
	r, err := open(ctx, a.Name)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(r)
	r.Close()
	if string(data) != "aaaa" {
		t.Fatalf("shared file %s reads %q", a.Name, data)
	}
}
