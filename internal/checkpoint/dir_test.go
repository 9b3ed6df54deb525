package checkpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
)

func openDir(t *testing.T, opts ...DirOption) *Dir {
	t.Helper()
	d, err := OpenDir(t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func states(n int) []*SubtaskState {
	out := make([]*SubtaskState, n)
	for i := range out {
		out[i] = &SubtaskState{SourcePosition: []byte{byte(i), 1, 2, 3}}
	}
	return out
}

func wantErr(t *testing.T, err error, target error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", parts)
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error %q does not match %v", err, target)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

func TestCommitAndResolve(t *testing.T) {
	d := openDir(t)
	md := writeCheckpoint(t, d, control.KindCheckpoint, 7, []*SubtaskState{{SourcePosition: []byte("pos0")}, nil})
	chk := filepath.Join(d.Root(), "chk-7")
	if md.Location != chk {
		t.Fatalf("Location = %q, want %q", md.Location, chk)
	}
	ents, _ := os.ReadDir(chk)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"_metadata", "op-op-0.state"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("chk-7 holds %v, want %v (no temporary files)", names, want)
	}
	for _, p := range []string{d.Root(), chk, filepath.Join(chk, MetadataFile)} {
		got, err := Resolve(p)
		if err != nil {
			t.Fatalf("Resolve(%s): %v", p, err)
		}
		got.Location, md.Location = "", ""
		if !reflect.DeepEqual(got, md) {
			t.Fatalf("Resolve(%s) =\n%+v\nwant\n%+v", p, got, md)
		}
		md.Location = chk
	}
	s, err := ReadState(md, md.Operators[0].Subtasks[0])
	if err != nil || string(s.SourcePosition) != "pos0" {
		t.Fatalf("ReadState = %+v, %v", s, err)
	}
	if err := Verify(md); err != nil {
		t.Fatal(err)
	}
	// The metadata file starts with its versioned header and is JSON after it.
	data, _ := os.ReadFile(filepath.Join(chk, MetadataFile))
	if !strings.HasPrefix(string(data), "streamd-checkpoint v1 size=") || !strings.Contains(string(data), `"finished": "running"`) {
		t.Fatalf("metadata file:\n%s", data)
	}
	// A second commit of the same id is refused.
	wantErr(t, d.Commit(context.Background(), &Metadata{Version: 1, ID: 7, Kind: control.KindCheckpoint}), nil, "already exists")
}

func TestCorruptMetadata(t *testing.T) {
	d := openDir(t)
	writeCheckpoint(t, d, control.KindCheckpoint, 1, states(2))
	meta := filepath.Join(d.Root(), "chk-1", MetadataFile)
	orig, _ := os.ReadFile(meta)

	// One flipped byte in the JSON.
	c := append([]byte{}, orig...)
	c[len(c)-10] ^= 1
	os.WriteFile(meta, c, 0o644)
	_, err := Resolve(d.Root())
	wantErr(t, err, ErrCorrupt, meta, "checksum mismatch")

	// Truncated anywhere.
	for _, n := range []int{0, 10, len(orig) / 2, len(orig) - 1} {
		os.WriteFile(meta, orig[:n], 0o644)
		_, err := Resolve(filepath.Join(d.Root(), "chk-1"))
		wantErr(t, err, ErrCorrupt, meta, "truncated")
	}
	// Not ours at all.
	os.WriteFile(meta, []byte("hello\nworld"), 0o644)
	_, err = Resolve(d.Root())
	wantErr(t, err, ErrCorrupt, meta, "not a streamd checkpoint metadata file")
}

func TestCorruptBlob(t *testing.T) {
	d := openDir(t)
	md := writeCheckpoint(t, d, control.KindCheckpoint, 3, states(2))
	blob := filepath.Join(d.Root(), "chk-3", "op-op-1.state")
	orig, _ := os.ReadFile(blob)

	os.WriteFile(blob, orig[:len(orig)-3], 0o644)
	_, err := ReadState(md, md.Operators[0].Subtasks[1])
	wantErr(t, err, ErrCorrupt, blob, "truncated")
	wantErr(t, Verify(md), ErrCorrupt, blob, "truncated")

	c := append([]byte{}, orig...)
	c[len(c)/2] ^= 0x80
	os.WriteFile(blob, c, 0o644)
	_, err = ReadState(md, md.Operators[0].Subtasks[1])
	wantErr(t, err, ErrCorrupt, blob, "checksum mismatch")
	wantErr(t, Verify(md), ErrCorrupt, blob, "checksum mismatch")

	os.Remove(blob)
	_, err = ReadState(md, md.Operators[0].Subtasks[1])
	wantErr(t, err, os.ErrNotExist, blob)
}

func TestNoCompletedCheckpoint(t *testing.T) {
	d := openDir(t)
	_, err := Resolve(d.Root())
	wantErr(t, err, ErrNoCheckpoint, "no completed checkpoint in "+d.Root())
	_, err = d.Latest(context.Background())
	wantErr(t, err, ErrNoCheckpoint, d.Root())

	// An incomplete checkpoint (blobs, no _metadata) is never visible.
	if _, err := d.WriteState(context.Background(), control.KindCheckpoint, 4, control.SubtaskID{Operator: "op"}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	_, err = Resolve(d.Root())
	wantErr(t, err, ErrNoCheckpoint, "no completed checkpoint in "+d.Root(), "1 incomplete")
	_, err = Resolve(filepath.Join(d.Root(), "chk-4"))
	wantErr(t, err, ErrNoCheckpoint, "chk-4 is incomplete", "_metadata")
	if got, _ := d.Completed(context.Background()); len(got) != 0 {
		t.Fatalf("Completed = %v", got)
	}
	// A leftover temporary metadata file is not a commit either.
	os.WriteFile(filepath.Join(d.Root(), "chk-4", "_metadata.tmp-0000"), []byte("streamd-checkpoint v1"), 0o644)
	_, err = Resolve(d.Root())
	wantErr(t, err, ErrNoCheckpoint)

	// A completed older checkpoint is found behind a newer incomplete one.
	writeCheckpoint(t, d, control.KindCheckpoint, 2, states(1))
	os.MkdirAll(filepath.Join(d.Root(), "chk-9"), 0o755)
	md, err := Resolve(d.Root())
	if err != nil || md.ID != 2 {
		t.Fatalf("Resolve = %v, %v; want checkpoint 2", md, err)
	}
	if n, _ := d.NextID(context.Background()); n != 10 {
		t.Fatalf("NextID = %d, want 10", n)
	}
	writeCheckpoint(t, d, control.KindSavepoint, 12, states(1))
	if n, _ := d.NextID(context.Background()); n != 13 {
		t.Fatalf("NextID after savepoint 12 = %d, want 13", n)
	}
	_, err = Resolve(filepath.Join(d.Root(), "missing"))
	wantErr(t, err, os.ErrNotExist, "missing")
}

func TestRetention(t *testing.T) {
	spDir := t.TempDir()
	d := openDir(t, WithRetain(2), WithSavepointDir(spDir))
	ctx := context.Background()
	// An incomplete leftover older than what commits next is cleaned.
	d.WriteState(ctx, control.KindCheckpoint, 1, control.SubtaskID{Operator: "op"}, []byte("x"))
	sp := writeCheckpoint(t, d, control.KindSavepoint, 2, states(1))
	for id := int64(3); id <= 6; id++ {
		writeCheckpoint(t, d, control.KindCheckpoint, id, states(2))
	}
	// A pending newer checkpoint is left alone.
	d.WriteState(ctx, control.KindCheckpoint, 8, control.SubtaskID{Operator: "op"}, []byte("x"))
	writeCheckpoint(t, d, control.KindCheckpoint, 7, states(1))

	ents, _ := os.ReadDir(d.Root())
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"chk-6", "chk-7", "chk-8"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("root holds %v, want %v", names, want)
	}
	all, err := d.Completed(ctx)
	if err != nil || len(all) != 2 || all[0].ID != 6 || all[1].ID != 7 {
		t.Fatalf("Completed = %v, %v", all, err)
	}
	// The savepoint stays, in its own directory, and resolves.
	if !strings.HasPrefix(sp.Location, filepath.Join(spDir, "savepoint-2-")) {
		t.Fatalf("savepoint at %s", sp.Location)
	}
	got, err := Resolve(sp.Location)
	if err != nil || got.Kind != control.KindSavepoint || got.ID != 2 {
		t.Fatalf("Resolve(savepoint) = %+v, %v", got, err)
	}
	wantErr(t, d.Delete(ctx, got), nil, "never deleted")
	if err := d.Delete(ctx, all[0]); err != nil {
		t.Fatal(err)
	}
	if latest, _ := d.Latest(ctx); latest.ID != 7 {
		t.Fatalf("Latest = %d", latest.ID)
	}
}

// The checkpoint just written survives retention even when a newer one is
// already complete.
func TestRetentionKeepsJustWritten(t *testing.T) {
	d := openDir(t)
	writeCheckpoint(t, d, control.KindCheckpoint, 5, states(1))
	writeCheckpoint(t, d, control.KindCheckpoint, 4, states(1))
	for _, id := range []string{"chk-4", "chk-5"} {
		if _, err := os.Stat(filepath.Join(d.Root(), id, MetadataFile)); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
}

func TestDiscard(t *testing.T) {
	d := openDir(t)
	ctx := context.Background()
	ref, err := d.WriteState(ctx, control.KindSavepoint, 3, control.SubtaskID{Operator: "op", Index: 2}, []byte("abc"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Discard(ctx, control.KindSavepoint, 3, ref.String()); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(d.Root()); len(ents) != 0 {
		t.Fatalf("root not empty after discard: %v", ents)
	}
	// A committed checkpoint's blobs cannot be discarded.
	md := writeCheckpoint(t, d, control.KindCheckpoint, 4, states(1))
	s := md.Operators[0].Subtasks[0]
	wantErr(t, d.Discard(ctx, control.KindCheckpoint, 4, BlobRef{Name: s.Ref, Size: s.Size, CRC32C: s.CRC32C}.String()), nil, "committed")
}

func TestCommitChecksBlobs(t *testing.T) {
	d := openDir(t)
	ctx := context.Background()
	md := &Metadata{Version: FormatVersion, Job: "j", ID: 1, Kind: control.KindCheckpoint, Time: time.Now(),
		Operators: []OperatorMeta{{UID: "op", Parallelism: 1, MaxParallelism: 128, Subtasks: []SubtaskMeta{{Index: 0, Ref: "op-op-0.state", Size: 3}}}}}
	wantErr(t, d.Commit(ctx, md), os.ErrNotExist, "op/0")
	if _, err := Resolve(d.Root()); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("a failed commit is visible: %v", err)
	}
}

func TestNewMetadata(t *testing.T) {
	g := testGraph(t, 2, 3, 2)
	ref := func(name string) string { return BlobRef{Name: name, Size: 10, CRC32C: 7}.String() }
	a := control.PersistMetadata{
		ID: 5, Kind: control.KindCheckpoint,
		Acks: []control.AckedState{
			{Subtask: control.SubtaskID{Operator: "count", Index: 0}, StateRef: ref("op-count-0.state"), Size: 10},
			{Subtask: control.SubtaskID{Operator: "count", Index: 2}, StateRef: ref("op-count-2.state"), Size: 10, Finished: true},
			{Subtask: control.SubtaskID{Operator: "sink", Index: 0}, StateRef: ref("op-sink-0.state"), Size: 10},
			{Subtask: control.SubtaskID{Operator: "sink", Index: 1}, StateRef: ref("op-sink-1.state"), Size: 10},
		},
		Finished:          []control.SubtaskID{{Operator: "src", Index: 0}, {Operator: "src", Index: 1}, {Operator: "count", Index: 1}},
		FullyFinished:     []string{"src"},
		PartiallyFinished: []string{"count"},
	}
	md, err := NewMetadata(g, a, time.Unix(10, 0))
	if err != nil {
		t.Fatal(err)
	}
	if md.Job != "job" || md.ID != 5 || md.Kind != control.KindCheckpoint || md.Version != FormatVersion {
		t.Fatalf("md = %+v", md)
	}
	src, count, sink := md.Operator("src"), md.Operator("count"), md.Operator("sink")
	if src.Finished != control.OperatorFullyFinished || len(src.Subtasks) != 0 || src.FinishedString() != "fully" {
		t.Errorf("src = %+v", src)
	}
	if count.Finished != control.OperatorPartiallyFinished || count.FinishedString() != "partially (2 of 3)" || count.StateSize() != 20 {
		t.Errorf("count = %+v %s", count, count.FinishedString())
	}
	if got := count.Subtasks[2]; got.Ref != "op-count-2.state" || !got.Finished || got.CRC32C != 7 {
		t.Errorf("count/2 = %+v", got)
	}
	if sink.Finished != control.OperatorRunning || sink.FinishedString() != "running" || md.StateSize() != 40 {
		t.Errorf("sink = %+v", sink)
	}
	a.Acks[0].StateRef = "garbage"
	_, err = NewMetadata(g, a, time.Now())
	wantErr(t, err, nil, "count/0", "garbage")
	a.Acks[0].Subtask.Index = 9
	_, err = NewMetadata(g, a, time.Now())
	wantErr(t, err, nil, "count/9")
}

// testGraph is src (pSrc) -hash-> count (pCount) -forward?-> sink (pSink).
func testGraph(t *testing.T, pSrc, pCount, pSink int) *control.JobGraph {
	t.Helper()
	part := control.Rebalance
	g, err := control.NewJobGraph("job", []*control.Vertex{
		{UID: "src", Parallelism: pSrc, Kind: control.KindSource},
		{UID: "count", Parallelism: pCount, Kind: control.KindOperator, Inputs: []control.Edge{{From: "src", Partition: control.Hash}}},
		{UID: "sink", Parallelism: pSink, Kind: control.KindSink, Inputs: []control.Edge{{From: "count", Partition: part}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// commitEmpty commits a checkpoint or savepoint of job with one stateless
// operator (no blobs) into d.
func commitEmpty(t *testing.T, d *Dir, kind control.CheckpointKind, id int64, job string) *Metadata {
	t.Helper()
	md := &Metadata{Version: FormatVersion, Job: job, ID: id, Kind: kind, Time: time.Unix(1700000000, 0).UTC(),
		Operators: []OperatorMeta{{UID: "op", Parallelism: 1, MaxParallelism: 128, Subtasks: []SubtaskMeta{{Index: 0}}}}}
	if err := d.Commit(context.Background(), md); err != nil {
		t.Fatal(err)
	}
	return md
}

// A directory resolves to its completed checkpoint or savepoint with the
// highest id (one sequence per job), and NewerThan finds what a restore of
// an explicitly named older one would write again.
func TestResolveNewestByID(t *testing.T) {
	type ck struct {
		kind control.CheckpointKind
		id   int64
		job  string // default "job"
	}
	cp := func(id int64) ck { return ck{kind: control.KindCheckpoint, id: id} }
	sp := func(id int64) ck { return ck{kind: control.KindSavepoint, id: id} }
	for _, tc := range []struct {
		name   string
		dir    []ck
		want   int64           // Resolve(root)
		newer  map[int64]int64 // NewerThan(id) -> id (0: none)
		spOnly bool            // root holds only savepoints
	}{
		{name: "savepoint 5 after chk-3", dir: []ck{cp(3), sp(5)}, want: 5, newer: map[int64]int64{3: 5, 5: 0}},
		{name: "chk-7 after savepoint 5", dir: []ck{sp(5), cp(7)}, want: 7, newer: map[int64]int64{5: 7, 7: 0}},
		{name: "retained chk-2 chk-3, savepoint 4", dir: []ck{cp(2), cp(3), sp(4)}, want: 4, newer: map[int64]int64{2: 4, 3: 4}},
		{name: "savepoints only", dir: []ck{sp(2), sp(9)}, want: 9, newer: map[int64]int64{2: 9}},
		{name: "another job's newer savepoint", dir: []ck{cp(3), {kind: control.KindSavepoint, id: 8, job: "other"}},
			want: 8, newer: map[int64]int64{3: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := openDir(t, WithRetain(3))
			byID := map[int64]*Metadata{}
			for _, c := range tc.dir {
				job := c.job
				if job == "" {
					job = "job"
				}
				byID[c.id] = commitEmpty(t, d, c.kind, c.id, job)
			}
			// An incomplete savepoint with a higher id is never chosen.
			if _, err := d.WriteState(context.Background(), control.KindSavepoint, 99, control.SubtaskID{Operator: "op"}, []byte("x")); err != nil {
				t.Fatal(err)
			}
			got, err := Resolve(d.Root())
			if err != nil || got.ID != tc.want || got.Kind != byID[tc.want].Kind || got.Location != byID[tc.want].Location {
				t.Fatalf("Resolve(root) = %v, %v; want %s %d at %s", got, err, byID[tc.want].Kind, tc.want, byID[tc.want].Location)
			}
			for id, wantNewer := range tc.newer {
				// The explicit path restores what it names.
				md, err := Resolve(byID[id].Location)
				if err != nil || md.ID != id {
					t.Fatalf("Resolve(%s) = %v, %v", byID[id].Location, md, err)
				}
				n, err := NewerThan(md)
				switch {
				case err != nil:
					t.Fatalf("NewerThan(%d): %v", id, err)
				case wantNewer == 0 && n != nil:
					t.Errorf("NewerThan(%d) = %s %d, want none", id, n.Kind, n.ID)
				case wantNewer != 0 && (n == nil || n.ID != wantNewer || n.Location != byID[wantNewer].Location):
					t.Errorf("NewerThan(%d) = %+v, want %d at %s", id, n, wantNewer, byID[wantNewer].Location)
				}
			}
			// What Resolve(root) returns has nothing newer beside it
			// (unless it is another job's).
			if n, err := NewerThan(got); err != nil || n != nil {
				t.Errorf("NewerThan(Resolve(root)) = %v, %v", n, err)
			}
		})
	}
}

// The Store's Latest (failover within a run) still means the newest
// checkpoint: savepoints are not checkpoints.
func TestLatestIgnoresSavepoints(t *testing.T) {
	d := openDir(t)
	commitEmpty(t, d, control.KindCheckpoint, 3, "job")
	commitEmpty(t, d, control.KindSavepoint, 5, "job")
	if md, err := d.Latest(context.Background()); err != nil || md.ID != 3 {
		t.Fatalf("Latest = %v, %v; want checkpoint 3", md, err)
	}
}

// A corrupt _metadata of the newest completed checkpoint or savepoint is
// refused when resolving the directory, as before savepoints counted: no
// silent fall back to an older one. The older one still restores when
// named, and NewerThan reports the corrupt newer one as an error.
func TestResolveCorruptNewest(t *testing.T) {
	for _, kind := range []control.CheckpointKind{control.KindSavepoint, control.KindCheckpoint} {
		t.Run(string(kind), func(t *testing.T) {
			d := openDir(t, WithRetain(2))
			old := commitEmpty(t, d, control.KindCheckpoint, 3, "job")
			newest := commitEmpty(t, d, kind, 5, "job")
			meta := filepath.Join(newest.Location, MetadataFile)
			data, _ := os.ReadFile(meta)
			data[len(data)-10] ^= 1
			must(t, os.WriteFile(meta, data, 0o644))

			_, err := Resolve(d.Root())
			wantErr(t, err, ErrCorrupt, meta, "checksum mismatch")
			md, err := Resolve(old.Location)
			if err != nil || md.ID != 3 {
				t.Fatalf("Resolve(%s) = %v, %v", old.Location, md, err)
			}
			_, err = NewerThan(md)
			wantErr(t, err, ErrCorrupt, "newer than "+old.Location, meta)
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The checkpoint directory of deployed jobs holds one directory per job
// (DIR/JOB_ID): the directory resolves to the checkpoint that completed
// last among the jobs' newest, whatever its id, and the job id recorded in
// the metadata reads back.
func TestResolveJobDirectories(t *testing.T) {
	root := t.TempDir()
	commit := func(job string, id int64, at time.Time) *Metadata {
		d, err := OpenDir(filepath.Join(root, job))
		if err != nil {
			t.Fatal(err)
		}
		md := &Metadata{Version: FormatVersion, Job: "wc", JobID: job, ID: id, Kind: control.KindCheckpoint, Time: at.UTC(),
			Operators: []OperatorMeta{{UID: "op", Parallelism: 1, MaxParallelism: 128, Subtasks: []SubtaskMeta{{Index: 0}}}}}
		if err := d.Commit(context.Background(), md); err != nil {
			t.Fatal(err)
		}
		return md
	}
	t0 := time.Unix(1700000000, 0)
	commit("wc-aaaa", 9, t0)
	want := commit("wc-bbbb", 2, t0.Add(time.Minute)) // later, lower id
	if err := os.MkdirAll(filepath.Join(root, "empty-job"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := Resolve(root)
	if err != nil || got.Location != want.Location || got.JobID != "wc-bbbb" {
		t.Fatalf("Resolve(root) = %+v, %v; want wc-bbbb's chk-2 at %s", got, err, want.Location)
	}
	if _, err := Resolve(filepath.Join(root, "empty-job")); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("Resolve(empty job dir) = %v, want ErrNoCheckpoint", err)
	}
	if _, err := Resolve(t.TempDir()); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("Resolve(empty dir) = %v, want ErrNoCheckpoint", err)
	}
}
