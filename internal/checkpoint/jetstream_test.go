package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/natstest"
)

// jetStream starts an embedded NATS server with JetStream and returns a
// JetStream context on it.
func jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	return natstest.JetStream(t, natstest.Server(t))
}

// commitTo writes one blob per non-nil state for operator "op" into s and
// commits the metadata.
func commitTo(t *testing.T, s Store, kind control.CheckpointKind, id int64, states []*SubtaskState) *Metadata {
	t.Helper()
	ctx := context.Background()
	md := &Metadata{Version: FormatVersion, Job: "job", ID: id, Kind: kind, Time: time.Unix(1700000000, 0).UTC()}
	op := OperatorMeta{UID: "op", Parallelism: len(states), MaxParallelism: 128}
	for i, st := range states {
		sm := SubtaskMeta{Index: i}
		if st != nil {
			b, err := EncodeState(st)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := s.WriteState(ctx, kind, id, control.SubtaskID{Operator: "op", Index: i}, b)
			if err != nil {
				t.Fatal(err)
			}
			sm.Ref, sm.Size, sm.CRC32C = ref.Name, ref.Size, ref.CRC32C
		}
		op.Subtasks = append(op.Subtasks, sm)
	}
	md.Operators = []OperatorMeta{op}
	if err := s.Commit(ctx, md); err != nil {
		t.Fatal(err)
	}
	waitCleanup(t, s)
	return md
}

// waitCleanup waits for the retention a JetStream store applies in the
// background after a commit.
func waitCleanup(t *testing.T, s Store) {
	t.Helper()
	if js, ok := s.(*JetStream); ok {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := js.WaitCleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestJetStreamStore(t *testing.T) {
	ctx := context.Background()
	js := jetStream(t)
	// Two processes (a host writing blobs, the controller committing) with
	// their own handles on one prefix; another job's prefix beside it.
	host, err := OpenJetStream(ctx, js, "", "wc", WithSavepointSuffix("wc-1"))
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := OpenJetStream(ctx, js, DefaultBucket, "wc", WithRetain(2), WithSavepointSuffix("wc-1"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := OpenJetStream(ctx, js, "", "other/job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.Latest(ctx); err == nil || !strings.Contains(err.Error(), "no completed checkpoint in jetstream://STREAMD_CHECKPOINTS/wc") {
		t.Fatalf("Latest of an empty store: %v", err)
	}
	commitTo(t, other, control.KindCheckpoint, 40, states(1))

	// Blobs from the "host", metadata from the "controller".
	var mds []*Metadata
	for id := int64(1); id <= 3; id++ {
		md := &Metadata{Version: FormatVersion, Job: "wc", ID: id, Kind: control.KindCheckpoint, Time: time.Unix(1700000000, 0).UTC()}
		op := OperatorMeta{UID: "op", Parallelism: 2, MaxParallelism: 128}
		for i := 0; i < 2; i++ {
			b, _ := EncodeState(&SubtaskState{SourcePosition: []byte{byte(id), byte(i)}})
			ref, err := host.WriteState(ctx, control.KindCheckpoint, id, control.SubtaskID{Operator: "op", Index: i}, b)
			if err != nil {
				t.Fatal(err)
			}
			op.Subtasks = append(op.Subtasks, SubtaskMeta{Index: i, Ref: ref.Name, Size: ref.Size, CRC32C: ref.CRC32C})
		}
		md.Operators = []OperatorMeta{op}
		if err := ctl.Commit(ctx, md); err != nil {
			t.Fatal(err)
		}
		waitCleanup(t, ctl)
		if want := "jetstream://STREAMD_CHECKPOINTS/wc/chk-" + string(rune('0'+id)); md.Location != want {
			t.Fatalf("Location %q, want %q", md.Location, want)
		}
		mds = append(mds, md)
	}
	// Retention 2: chk-1 is gone, chk-2 and chk-3 stay.
	got, err := ctl.Completed(ctx)
	if err != nil || len(got) != 2 || got[0].ID != 2 || got[1].ID != 3 {
		t.Fatalf("Completed = %v, %v; want checkpoints 2 and 3", got, err)
	}
	if !reflect.DeepEqual(got[1], mds[2]) {
		t.Fatalf("Completed[1] =\n%+v\nwant\n%+v", got[1], mds[2])
	}
	// A second commit of the same id is refused.
	wantErr(t, ctl.Commit(ctx, mds[2]), nil, "already exists")
	// An incomplete checkpoint 4 stays invisible; ids go on after it.
	if _, err := host.WriteState(ctx, control.KindCheckpoint, 4, control.SubtaskID{Operator: "op"}, []byte("partial")); err != nil {
		t.Fatal(err)
	}
	if md, err := host.Latest(ctx); err != nil || md.ID != 3 {
		t.Fatalf("Latest = %v, %v; want 3", md, err)
	}
	if n, err := ctl.NextID(ctx); err != nil || n != 5 {
		t.Fatalf("NextID = %d, %v; want 5", n, err)
	}
	// Resolve: a checkpoint, its _metadata, the prefix (the latest).
	for loc, want := range map[string]int64{
		"jetstream://STREAMD_CHECKPOINTS/wc/chk-2":           2,
		"jetstream://STREAMD_CHECKPOINTS/wc/chk-2/_metadata": 2,
		"jetstream://STREAMD_CHECKPOINTS/wc":                 3,
		"jetstream://STREAMD_CHECKPOINTS/wc/":                3,
		"jetstream://STREAMD_CHECKPOINTS/other/job":          40,
	} {
		md, err := ResolveJetStream(ctx, js, loc)
		if err != nil || md.ID != want {
			t.Fatalf("Resolve(%s) = %v, %v; want %d", loc, md, err, want)
		}
		if err := VerifyFrom(ctx, JetStreamReader{JS: js}, md); err != nil {
			t.Fatalf("VerifyFrom(%s): %v", loc, err)
		}
	}
	_, err = ResolveJetStream(ctx, js, "jetstream://STREAMD_CHECKPOINTS/wc/chk-4")
	wantErr(t, err, ErrNoCheckpoint, "chk-4 is incomplete")
	_, err = ResolveJetStream(ctx, js, "jetstream://NOPE/wc")
	wantErr(t, err, nil, "bucket NOPE")
	// State reads back through any handle.
	st, err := ctl.ReadState(ctx, mds[2], mds[2].Operators[0].Subtasks[1])
	if err != nil || !reflect.DeepEqual(st.SourcePosition, []byte{3, 1}) {
		t.Fatalf("ReadState = %+v, %v", st, err)
	}
	// Committing checkpoint 5 removes the incomplete 4 and the complete 2.
	commitTo(t, ctl, control.KindCheckpoint, 5, states(1))
	if _, err := ResolveJetStream(ctx, js, "jetstream://STREAMD_CHECKPOINTS/wc/chk-2"); err == nil {
		t.Fatal("chk-2 still resolves after retention")
	}
	if _, err := ctl.ReadState(ctx, mds[1], mds[1].Operators[0].Subtasks[0]); err == nil {
		t.Fatal("a blob of the deleted chk-2 is still readable")
	}

	// A savepoint, named by the suffix, written by host and committed by ctl.
	b, _ := EncodeState(&SubtaskState{SinkPending: []byte("pending")})
	ref, err := host.WriteState(ctx, control.KindSavepoint, 6, control.SubtaskID{Operator: "op"}, b)
	if err != nil {
		t.Fatal(err)
	}
	sp := &Metadata{Version: FormatVersion, Job: "wc", ID: 6, Kind: control.KindSavepoint, Time: time.Now().UTC(),
		Operators: []OperatorMeta{{UID: "op", Parallelism: 1, MaxParallelism: 128,
			Subtasks: []SubtaskMeta{{Index: 0, Ref: ref.Name, Size: ref.Size, CRC32C: ref.CRC32C}}}}}
	if err := ctl.Commit(ctx, sp); err != nil {
		t.Fatal(err)
	}
	if sp.Location != "jetstream://STREAMD_CHECKPOINTS/wc/savepoint-6-wc-1" {
		t.Fatalf("savepoint at %s", sp.Location)
	}
	if md, err := ctl.Latest(ctx); err != nil || md.ID != 5 {
		t.Fatalf("Latest after a savepoint = %v, %v; want checkpoint 5 (savepoints are not checkpoints)", md, err)
	}
	wantErr(t, ctl.Delete(ctx, sp), nil, "never deleted")
	if n, _ := ctl.NextID(ctx); n != 7 {
		t.Fatalf("NextID after savepoint 6 = %d", n)
	}
	md, err := ResolveJetStream(ctx, js, sp.Location)
	if err != nil || md.Kind != control.KindSavepoint {
		t.Fatalf("Resolve(savepoint) = %v, %v", md, err)
	}
	// The prefix resolves to the newest by id, checkpoint or savepoint:
	// savepoint 6, not checkpoint 5; restoring 5 would write again what
	// the sink committed at 6.
	md, err = ResolveJetStream(ctx, js, "jetstream://STREAMD_CHECKPOINTS/wc")
	if err != nil || md.ID != 6 || md.Location != sp.Location {
		t.Fatalf("Resolve(prefix) after savepoint 6 = %v, %v; want the savepoint", md, err)
	}
	if n, err := NewerThanIn(ctx, JetStreamReader{JS: js}, md); err != nil || n != nil {
		t.Fatalf("NewerThan(savepoint 6) = %v, %v; want none", n, err)
	}
	chk3, err := ResolveJetStream(ctx, js, "jetstream://STREAMD_CHECKPOINTS/wc/chk-3")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []StateReader{JetStreamReader{JS: js}, ctl} {
		if n, err := NewerThanIn(ctx, r, chk3); err != nil || n == nil || n.Location != sp.Location {
			t.Fatalf("NewerThanIn(%T, chk-3) = %v, %v; want savepoint 6", r, n, err)
		}
	}
	// Checkpoint 5 is of job "job" (commitTo): job wc's savepoint 6 does
	// not make it older.
	chk5, err := ResolveJetStream(ctx, js, "jetstream://STREAMD_CHECKPOINTS/wc/chk-5")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := NewerThanIn(ctx, ctl, chk5); err != nil || n != nil {
		t.Fatalf("NewerThan(chk-5 of another job) = %v, %v; want none", n, err)
	}
	_, err = NewerThanIn(ctx, FileReader, chk5)
	wantErr(t, err, nil, "no JetStream")
	// Discard of an uncommitted blob; refused for a committed one.
	if _, err := host.WriteState(ctx, control.KindCheckpoint, 8, control.SubtaskID{Operator: "op"}, b); err != nil {
		t.Fatal(err)
	}
	if err := host.Discard(ctx, control.KindCheckpoint, 8, ref.String()); err != nil {
		t.Fatal(err)
	}
	if n, _ := ctl.NextID(ctx); n != 7 {
		t.Fatalf("NextID after the discard = %d, want 7", n)
	}
	wantErr(t, ctl.Discard(ctx, control.KindCheckpoint, 5, ref.String()), nil, "committed")
	// The other prefix was never touched by retention.
	if md, err := other.Latest(ctx); err != nil || md.ID != 40 {
		t.Fatalf("other prefix: %v, %v", md, err)
	}
}

func TestJetStreamCorruptBlob(t *testing.T) {
	ctx := context.Background()
	js := jetStream(t)
	s, err := OpenJetStream(ctx, js, "", "job")
	if err != nil {
		t.Fatal(err)
	}
	md := commitTo(t, s, control.KindCheckpoint, 1, states(2))
	// Overwrite a committed blob with a flipped byte (a damaged store).
	obs, _ := js.ObjectStore(ctx, DefaultBucket)
	data, _ := obs.GetBytes(ctx, "job/chk-1/op-op-1.state")
	data[len(data)/2] ^= 0x80
	if _, err := obs.PutBytes(ctx, "job/chk-1/op-op-1.state", data); err != nil {
		t.Fatal(err)
	}
	_, err = s.ReadState(ctx, md, md.Operators[0].Subtasks[1])
	wantErr(t, err, ErrCorrupt, "jetstream://STREAMD_CHECKPOINTS/job/chk-1/op-op-1.state", "checksum mismatch")
	wantErr(t, VerifyFrom(ctx, JetStreamReader{JS: js}, md), ErrCorrupt, "op-op-1.state")
	if _, err := OpenJetStream(ctx, js, "bad bucket", "job"); err == nil {
		t.Fatal("a bad bucket name was accepted")
	}
	if _, err := OpenJetStream(ctx, js, "", "../x"); err == nil {
		t.Fatal("a bad prefix was accepted")
	}
}

func TestExportFromJetStream(t *testing.T) {
	ctx := context.Background()
	js := jetStream(t)
	s, err := OpenJetStream(ctx, js, "", "job", WithSavepointSuffix("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	sp := commitTo(t, s, control.KindSavepoint, 3, []*SubtaskState{{SourcePosition: []byte("p0")}, nil, {SinkPending: []byte("x")}})
	dir := t.TempDir()
	out, err := Export(ctx, js, sp, dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := dir + "/savepoint-3-job-1"; out != want {
		t.Fatalf("exported to %s, want %s", out, want)
	}
	md, err := Resolve(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(md); err != nil {
		t.Fatal(err)
	}
	md.Location, sp.Location = "", ""
	if !reflect.DeepEqual(md, sp) {
		t.Fatalf("exported metadata\n%+v\nwant\n%+v", md, sp)
	}
	md.Location = out
	if st, err := ReadState(md, md.Operators[0].Subtasks[2]); err != nil || string(st.SinkPending) != "x" {
		t.Fatalf("exported blob: %+v, %v", st, err)
	}
	if _, err := Export(ctx, js, &Metadata{Location: "jetstream://STREAMD_CHECKPOINTS/job/savepoint-3-job-1", Version: 1, ID: 3, Kind: control.KindSavepoint}, dir); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second export: %v", err)
	}
}

// LoadRestoreFrom a JetStream object store keeps the keyed state in the
// objects: each new subtask reads its key groups as a stream when it
// restores (here: Load), and an object damaged after the plan fails that
// read, naming it.
func TestJetStreamStreamedRestore(t *testing.T) {
	ctx := context.Background()
	js := jetStream(t)
	s, err := OpenJetStream(ctx, js, "", "job")
	if err != nil {
		t.Fatal(err)
	}
	snaps, want := keyedSnapshots(rand.New(rand.NewPCG(3, 3)), 2, 128, 2000)
	snaps[1].Lists["l"] = &host.ListState{Mode: abi.ListUnion, Entries: [][]byte{[]byte("u")}}
	md := commitTo(t, s, control.KindSavepoint, 1, []*SubtaskState{{Operator: snaps[0]}, {Operator: snaps[1]}})
	g, err := control.NewJobGraph("job", []*control.Vertex{
		{UID: "src", Parallelism: 1, Kind: control.KindSource},
		{UID: "op", Parallelism: 3, Kind: control.KindOperator, Inputs: []control.Edge{{From: "src", Partition: control.Hash}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	plan := func() []*SubtaskRestore {
		res, err := LoadRestoreFrom(ctx, JetStreamReader{JS: js}, md, g)
		if err != nil {
			t.Fatal(err)
		}
		var rs []*SubtaskRestore
		for i := range 3 {
			r := res.Subtasks[control.SubtaskID{Operator: "op", Index: i}]
			if r == nil || len(r.Snapshot.Sources) == 0 || len(r.Snapshot.Lists["l"].Entries) != 1 {
				t.Fatalf("subtask %d restores %+v", i, r)
			}
			rs = append(rs, r)
		}
		return rs
	}
	if got := collectKeyed(t, plan(), 128); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored %d keys, want %d", len(got), len(want))
	}
	rs := plan()
	obs, _ := js.ObjectStore(ctx, DefaultBucket)
	data, _ := obs.GetBytes(ctx, "job/"+pathBase(md.Location)+"/op-op-1.state")
	data[len(data)/2] ^= 0x80
	if _, err := obs.PutBytes(ctx, "job/"+pathBase(md.Location)+"/op-op-1.state", data); err != nil {
		t.Fatal(err)
	}
	err = rs[2].Snapshot.Load()
	wantErr(t, err, ErrCorrupt, md.Location+"/op-op-1.state", "checksum mismatch")
}

func pathBase(loc string) string { return loc[strings.LastIndexByte(loc, '/')+1:] }

// stallingObjects is an object store whose first listings stall until
// their context ends, as an ordered consumer started while NATS restarted
// did.
type stallingObjects struct {
	jetstream.ObjectStore
	stalls int
	tries  int
}

func (s *stallingObjects) List(ctx context.Context, _ ...jetstream.ListObjectsOpt) ([]*jetstream.ObjectInfo, error) {
	s.tries++
	if s.tries <= s.stalls {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return []*jetstream.ObjectInfo{{ObjectMeta: jetstream.ObjectMeta{Name: "job/chk-7/_metadata"}}}, nil
}

// TestListingTriesAgainAfterAStall: a listing whose try stalls is tried
// again, with a longer bound, until it answers; one that stalls past its
// caller's context fails with the context's error.
func TestListingTriesAgainAfterAStall(t *testing.T) {
	obs := &stallingObjects{stalls: 1}
	dirs, err := lister{}.listDirs(context.Background(), obs, "job")
	if err != nil || len(dirs) != 1 || dirs[0].id != 7 || obs.tries != 2 {
		t.Fatalf("listDirs after a stalled try: %d dirs, %d tries, %v; want chk-7 after 2 tries", len(dirs), obs.tries, err)
	}
	obs = &stallingObjects{stalls: 100}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := (lister{}).listDirs(ctx, obs, "job"); !errors.Is(err, context.DeadlineExceeded) || obs.tries != 1 {
		t.Fatalf("listDirs past its context: %d tries, %v; want one try and the deadline", obs.tries, err)
	}
}

// TestListingBegunWhileNATSIsDown: a bucket listing begun while the NATS
// server restarts stalls for good in the client (its ordered consumer),
// so a store's listing waits for the connection and cuts a stalled try
// short: it ends soon after the server is back, however late in the
// restart it began.
func TestListingBegunWhileNATSIsDown(t *testing.T) {
	rs := natstest.NewRestartable(t)
	nc := rs.NC
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "LIST"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := obs.PutBytes(ctx, fmt.Sprintf("job/chk-%d/_metadata", i+1), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	l := lister{nc: nc}
	for _, down := range []time.Duration{0, 40 * time.Millisecond, 120 * time.Millisecond, 200 * time.Millisecond} {
		rs.Stop()
		begun := time.Now()
		type result struct {
			dirs int
			err  error
		}
		done := make(chan result, 1)
		go func() {
			lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			dirs, err := l.listDirs(lctx, obs, "job")
			done <- result{len(dirs), err}
		}()
		time.Sleep(down)
		rs.Start()
		back := time.Now()
		r := <-done
		if r.err != nil || r.dirs != 50 {
			t.Fatalf("down %v: %d dirs, %v", down, r.dirs, r.err)
		}
		// The client's stall would last until the 20 s context; a
		// reconnect takes about a quarter of a second, a stalled try of
		// the listing as long.
		t.Logf("down %v: the listing ended %v after the server was back", down, time.Since(back))
		if after := time.Since(back); after > 1500*time.Millisecond {
			t.Errorf("down %v: the listing ended %v after the server was back (begun %v before)", down, after, back.Sub(begun))
		}
	}
}
