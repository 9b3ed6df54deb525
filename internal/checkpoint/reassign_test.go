package checkpoint

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

// collectKeyed returns every (state, key) -> value and timer of the new
// subtasks, failing if a key group landed outside its subtask's range or a
// key appears twice.
func collectKeyed(t *testing.T, rs []*SubtaskRestore, maxP int) map[string]string {
	t.Helper()
	got := map[string]string{}
	for i, r := range rs {
		if r.Snapshot == nil {
			continue
		}
		rng := abi.RangeForSubtask(i, maxP, len(rs))
		for _, src := range r.Snapshot.Sources { // LoadRestore's: still in the blobs
			if kgs := src.KeyGroups(); !rng.Contains(kgs[0]) || !rng.Contains(kgs[len(kgs)-1]) {
				t.Fatalf("new subtask %d/%d got key groups %v outside its range %v", i, len(rs), kgs, rng)
			}
		}
		if err := r.Snapshot.Load(); err != nil {
			t.Fatal(err)
		}
		for kg, g := range r.Snapshot.KeyGroups {
			if !rng.Contains(kg) {
				t.Fatalf("new subtask %d/%d got key group %d outside its range %v", i, len(rs), kg, rng)
			}
			for state, m := range g.Entries {
				for k, v := range m {
					if abi.KeyGroup([]byte(k), maxP) != kg {
						t.Fatalf("key %q in key group %d, belongs to %d", k, kg, abi.KeyGroup([]byte(k), maxP))
					}
					id := state + "/" + k
					if _, dup := got[id]; dup {
						t.Fatalf("%s restored twice", id)
					}
					got[id] = string(v)
				}
			}
			for _, tm := range g.Timers {
				got[fmt.Sprintf("timer/%s/%d", tm.Key, tm.TS)] = ""
			}
		}
	}
	return got
}

// Keyed state (with timers) is conserved by every rescale 1..8 -> 1..8:
// each key restored exactly once, in the subtask owning its key group.
// The state goes through real blobs on disk.
func TestReassignKeyedConservation(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	d := openDir(t)
	id := int64(0)
	for oldP := 1; oldP <= 8; oldP++ {
		maxP := []int{8, 16, 128}[rng.IntN(3)]
		snaps, want := keyedSnapshots(rng, oldP, maxP, 300)
		sts := make([]*SubtaskState, oldP)
		for i, s := range snaps {
			sts[i] = &SubtaskState{Operator: s}
		}
		id++
		md := writeCheckpoint(t, d, control.KindCheckpoint, id, sts)
		md.Operators[0].MaxParallelism = maxP
		loaded := &OperatorSnapshot{Meta: md.Operators[0], Subtasks: make([]*SubtaskState, oldP)}
		for i, s := range md.Operators[0].Subtasks {
			if loaded.Subtasks[i], _ = ReadState(md, s); loaded.Subtasks[i] == nil {
				t.Fatal("no state read")
			}
		}
		for newP := 1; newP <= 8; newP++ {
			rs, err := Reassign(loaded, newP, maxP)
			if err != nil {
				t.Fatalf("%d -> %d: %v", oldP, newP, err)
			}
			if len(rs) != newP {
				t.Fatalf("%d -> %d: %d restores", oldP, newP, len(rs))
			}
			if got := collectKeyed(t, rs, maxP); !reflect.DeepEqual(got, want) {
				t.Fatalf("%d -> %d (max %d): %d keys+timers restored, want %d", oldP, newP, maxP, len(got), len(want))
			}
		}
	}
}

func list(mode abi.ListMode, entries ...string) *host.ListState {
	l := &host.ListState{Mode: mode, Entries: [][]byte{}}
	for _, e := range entries {
		l.Entries = append(l.Entries, []byte(e))
	}
	return l
}

func listsOf(rs []*SubtaskRestore, name string) [][]string {
	var out [][]string
	for _, r := range rs {
		var es []string
		if r.Snapshot != nil && r.Snapshot.Lists[name] != nil {
			es = []string{}
			for _, e := range r.Snapshot.Lists[name].Entries {
				es = append(es, string(e))
			}
		}
		out = append(out, es)
	}
	return out
}

func TestReassignLists(t *testing.T) {
	// Three old subtasks; subtask 1 finished in the partially finished case.
	old := func() []*SubtaskState {
		return []*SubtaskState{
			{Operator: &host.Snapshot{Lists: map[string]*host.ListState{
				"split": list(abi.ListSplit, "a", "b", "c"), "union": list(abi.ListUnion, "u0"), "bc": list(abi.ListBroadcast, "x0", "y0")}}},
			{Operator: &host.Snapshot{Lists: map[string]*host.ListState{
				"split": list(abi.ListSplit, "d"), "union": list(abi.ListUnion, "u1"), "bc": list(abi.ListBroadcast, "x1", "y1")}}},
			{Operator: &host.Snapshot{Lists: map[string]*host.ListState{
				"split": list(abi.ListSplit), "union": list(abi.ListUnion, "u2", "u2b"), "bc": list(abi.ListBroadcast, "x2", "y2")}}},
		}
	}
	tests := []struct {
		name      string
		newP      int
		finished1 bool
		split     [][]string
		union     []string
		bc        [][]string
	}{
		{"same parallelism keeps split lists", 3, false,
			[][]string{{"a", "b", "c"}, {"d"}, {}}, []string{"u0", "u1", "u2", "u2b"},
			[][]string{{"x0", "y0"}, {"x1", "y1"}, {"x2", "y2"}}},
		{"scale down", 2, false,
			[][]string{{"a", "c"}, {"b", "d"}}, []string{"u0", "u1", "u2", "u2b"},
			[][]string{{"x0", "y0"}, {"x1", "y1"}}},
		{"scale up", 5, false,
			[][]string{{"a"}, {"b"}, {"c"}, {"d"}, {}}, []string{"u0", "u1", "u2", "u2b"},
			[][]string{{"x0", "y0"}, {"x1", "y1"}, {"x2", "y2"}, {"x0", "y0"}, {"x1", "y1"}}},
		{"partially finished: subtask 1 contributes nothing", 4, true,
			[][]string{{"a"}, {"b"}, {"c"}, {}}, []string{"u0", "u2", "u2b"},
			// reporting subtasks are 0 and 2: new i gets entry i mod 2 of them
			[][]string{{"x0", "y0"}, {"x2", "y2"}, {"x0", "y0"}, {"x2", "y2"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op := &OperatorSnapshot{Meta: OperatorMeta{UID: "op", Parallelism: 3, MaxParallelism: 128, Subtasks: []SubtaskMeta{{Index: 0}, {Index: 1}, {Index: 2}}}, Subtasks: old()}
			if tc.finished1 {
				op.Meta.Finished = control.OperatorPartiallyFinished
				op.Meta.Subtasks[1].Finished = true
			}
			rs, err := Reassign(op, tc.newP, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := listsOf(rs, "split"); !reflect.DeepEqual(got, tc.split) {
				t.Errorf("split = %q, want %q", got, tc.split)
			}
			for i, got := range listsOf(rs, "union") {
				if !reflect.DeepEqual(got, tc.union) {
					t.Errorf("union of new subtask %d = %q, want %q", i, got, tc.union)
				}
			}
			if got := listsOf(rs, "bc"); !reflect.DeepEqual(got, tc.bc) {
				t.Errorf("broadcast = %q, want %q", got, tc.bc)
			}
			for i, r := range rs {
				for name, l := range r.Snapshot.Lists {
					if want := map[string]abi.ListMode{"split": abi.ListSplit, "union": abi.ListUnion, "bc": abi.ListBroadcast}[name]; l.Mode != want {
						t.Errorf("subtask %d list %s mode %v", i, name, l.Mode)
					}
				}
			}
		})
	}
}

// Split list entries are conserved by every rescale.
func TestReassignSplitConservation(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for oldP := 1; oldP <= 8; oldP++ {
		op := &OperatorSnapshot{Meta: OperatorMeta{UID: "op", Parallelism: oldP}}
		var want []string
		for j := 0; j < oldP; j++ {
			var es []string
			for k := rng.IntN(6); k > 0; k-- {
				es = append(es, fmt.Sprintf("%d.%d", j, k))
			}
			want = append(want, es...)
			op.Subtasks = append(op.Subtasks, &SubtaskState{Operator: &host.Snapshot{Lists: map[string]*host.ListState{"s": list(abi.ListSplit, es...)}}})
		}
		for newP := 1; newP <= 8; newP++ {
			rs, err := Reassign(op, newP, 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			lo, hi := len(want), 0
			for _, es := range listsOf(rs, "s") {
				got = append(got, es...)
				lo, hi = min(lo, len(es)), max(hi, len(es))
			}
			slices.Sort(got)
			w := slices.Sorted(slices.Values(want))
			if !slices.Equal(got, w) {
				t.Fatalf("%d -> %d: split entries %q, want %q", oldP, newP, got, w)
			}
			if oldP != newP && hi-lo > 1 {
				t.Fatalf("%d -> %d: uneven split, %d to %d entries", oldP, newP, lo, hi)
			}
		}
	}
}

func TestReassignSourcesAndSinks(t *testing.T) {
	src := &OperatorSnapshot{
		Meta:     OperatorMeta{UID: "gen", Parallelism: 3, Finished: control.OperatorPartiallyFinished, Subtasks: []SubtaskMeta{{Index: 0}, {Index: 1, Finished: true}, {Index: 2}}},
		Subtasks: []*SubtaskState{{SourcePosition: []byte("p0")}, nil, {SourcePosition: []byte("p2")}},
		Source:   true,
	}
	rs, err := Reassign(src, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if string(rs[0].SourcePosition) != "p0" || !rs[1].SourceFinished || rs[1].SourcePosition != nil || string(rs[2].SourcePosition) != "p2" || rs[0].SourceFinished {
		t.Fatalf("source restores %+v %+v %+v", rs[0], rs[1], rs[2])
	}
	_, err = Reassign(src, 2, 0)
	wantErr(t, err, nil, `operator "gen" is a source`, "cannot change", "3 in the checkpoint, 2 now")

	// A fully finished source may change parallelism: it is deployed finished.
	src.Meta.Finished = control.OperatorFullyFinished
	if rs, err = Reassign(src, 5, 0); err != nil || len(rs) != 5 || !rs[4].SourceFinished {
		t.Fatalf("fully finished source: %v %v", rs, err)
	}

	sink := &OperatorSnapshot{
		Meta:     OperatorMeta{UID: "out", Parallelism: 5, Finished: control.OperatorPartiallyFinished, Subtasks: []SubtaskMeta{{Index: 0}, {Index: 1}, {Index: 2, Finished: true}, {Index: 3}, {Index: 4}}},
		Subtasks: []*SubtaskState{{SinkPending: []byte("t0")}, nil, {SinkPending: []byte("t2")}, {SinkPending: []byte("t3")}, {SinkPending: []byte("t4")}},
	}
	rs, err = Reassign(sink, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := [][]string{}
	for _, r := range rs {
		var ps []string
		for _, p := range r.SinkPending {
			ps = append(ps, string(p))
		}
		got = append(got, ps)
	}
	// old j -> new j mod 2; the finished subtask's pending data still commits.
	if want := [][]string{{"t0", "t2", "t4"}, {"t3"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("sink pending = %q, want %q", got, want)
	}
}

func TestReassignErrors(t *testing.T) {
	kg := func(groups ...int) *SubtaskState {
		s := &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}}
		for _, g := range groups {
			s.KeyGroups[g] = &host.KeyGroupState{Entries: map[string]map[string][]byte{"s": {"k": []byte("v")}}}
		}
		return &SubtaskState{Operator: s}
	}
	op := &OperatorSnapshot{Meta: OperatorMeta{UID: "agg", Parallelism: 2, MaxParallelism: 16}, Subtasks: []*SubtaskState{kg(1), kg(9)}}
	_, err := Reassign(op, 2, 32)
	wantErr(t, err, nil, `"agg"`, "max parallelism 32", "16")
	_, err = Reassign(op, 17, 16)
	wantErr(t, err, nil, "parallelism 17 exceeds max parallelism 16")
	op.Subtasks[1] = kg(1)
	_, err = Reassign(op, 2, 16)
	wantErr(t, err, nil, "key group 1 is in the state of subtasks 0 and 1")
	op.Subtasks = []*SubtaskState{
		{Operator: &host.Snapshot{Lists: map[string]*host.ListState{"l": list(abi.ListSplit)}}},
		{Operator: &host.Snapshot{Lists: map[string]*host.ListState{"l": list(abi.ListUnion)}}},
	}
	_, err = Reassign(op, 2, 16)
	wantErr(t, err, nil, `list state "l" is union in subtask 1 but split in subtask 0`)
}

// LoadRestore end to end: a checkpoint of src(2) -> count(3, partially
// finished) -> sink(2) restored at count=2, sink=4.
func TestLoadRestore(t *testing.T) {
	ctx := context.Background()
	d := openDir(t)
	old := testGraph(t, 2, 3, 2)
	rng := rand.New(rand.NewPCG(1, 1))
	snaps, want := keyedSnapshots(rng, 3, 128, 500)
	write := func(sub control.SubtaskID, s *SubtaskState) string {
		b, err := EncodeState(s)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := d.WriteState(ctx, control.KindCheckpoint, 1, sub, b)
		if err != nil {
			t.Fatal(err)
		}
		return ref.String()
	}
	id := func(op string, i int) control.SubtaskID { return control.SubtaskID{Operator: op, Index: i} }
	// count/1 finished: its keyed state (empty here) is dropped; move its
	// keys to count/0 so conservation still holds for the running ones.
	for kg, g := range snaps[1].KeyGroups {
		snaps[0].KeyGroups[kg] = g
	}
	snaps[1] = &host.Snapshot{}
	a := control.PersistMetadata{ID: 1, Kind: control.KindCheckpoint,
		Acks: []control.AckedState{
			{Subtask: id("count", 0), StateRef: write(id("count", 0), &SubtaskState{Operator: snaps[0]})},
			{Subtask: id("count", 2), StateRef: write(id("count", 2), &SubtaskState{Operator: snaps[2]})},
			{Subtask: id("sink", 0), StateRef: write(id("sink", 0), &SubtaskState{SinkPending: []byte("txn-0")})},
			{Subtask: id("sink", 1), StateRef: write(id("sink", 1), &SubtaskState{SinkPending: []byte("txn-1")})},
		},
		Finished:          []control.SubtaskID{id("src", 0), id("src", 1), id("count", 1)},
		FullyFinished:     []string{"src"},
		PartiallyFinished: []string{"count"},
	}
	md, err := NewMetadata(old, a, rng2time())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(ctx, md); err != nil {
		t.Fatal(err)
	}

	g := testGraph(t, 3, 2, 4) // the fully finished source may change parallelism
	res, err := LoadRestore(ctx, d.Root(), g)
	if err != nil {
		t.Fatal(err)
	}
	if res.Metadata.ID != 1 || res.Finished["src"] != control.OperatorFullyFinished || res.Finished["count"] != control.OperatorPartiallyFinished {
		t.Fatalf("restore %+v", res)
	}
	rs := []*SubtaskRestore{res.Subtasks[id("count", 0)], res.Subtasks[id("count", 1)]}
	if got := collectKeyed(t, rs, 128); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored %d keys, want %d", len(got), len(want))
	}
	if r := res.Subtasks[id("sink", 1)]; r == nil || len(r.SinkPending) != 1 || string(r.SinkPending[0]) != "txn-1" {
		t.Fatalf("sink/1 = %+v", r)
	}
	if r := res.Subtasks[id("sink", 3)]; r != nil {
		t.Fatalf("sink/3 = %+v, want nothing", r)
	}
	if r := res.Subtasks[id("src", 2)]; r == nil || !r.SourceFinished {
		t.Fatalf("src/2 = %+v", r)
	}

	// A graph with an operator added in front of the finished source fails
	// the FLIP-147 check; a graph without "count" refuses its state.
	g2, _ := control.NewJobGraph("job", []*control.Vertex{
		{UID: "src", Parallelism: 1, Kind: control.KindSource},
		{UID: "sink", Parallelism: 1, Kind: control.KindSink, Inputs: []control.Edge{{From: "src"}}},
	})
	_, err = LoadRestore(ctx, d.Root(), g2)
	wantErr(t, err, nil, `state of operator "count"`, `job "job" does not have`)

	// A corrupt blob is named.
	blob := md.Location + "/op-count-2.state"
	data, _ := readFile(blob)
	data[20] ^= 1
	writeFile(blob, data)
	_, err = LoadRestore(ctx, d.Root(), g)
	wantErr(t, err, ErrCorrupt, blob, "checksum mismatch", `operator "count"`)
}

// A source whose connector can move its splits (RescalePositions) restores
// at another parallelism: the hook gets the old positions (nil for a
// finished subtask) and gives each new subtask its own.
func TestReassignRescalableSource(t *testing.T) {
	var gotOld [][]byte
	src := &OperatorSnapshot{
		Meta:     OperatorMeta{UID: "topic", Parallelism: 3, Finished: control.OperatorPartiallyFinished, Subtasks: []SubtaskMeta{{Index: 0}, {Index: 1, Finished: true}, {Index: 2}}},
		Subtasks: []*SubtaskState{{SourcePosition: []byte("a")}, {SourcePosition: []byte("done")}, {SourcePosition: []byte("c")}},
		Source:   true,
		RescalePositions: func(old [][]byte, n int) ([][]byte, error) {
			gotOld = old
			out := make([][]byte, n)
			for i := range out {
				out[i] = fmt.Appendf(nil, "%d/%d", i, n)
			}
			return out, nil
		},
	}
	rs, err := Reassign(src, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotOld, [][]byte{[]byte("a"), nil, []byte("c")}) {
		t.Errorf("the hook got %q", gotOld)
	}
	if len(rs) != 2 || string(rs[0].SourcePosition) != "0/2" || string(rs[1].SourcePosition) != "1/2" || rs[0].SourceFinished || rs[1].SourceFinished {
		t.Errorf("restores %+v %+v", rs[0], rs[1])
	}
	src.RescalePositions = func([][]byte, int) ([][]byte, error) { return nil, fmt.Errorf("no partitions") }
	_, err = Reassign(src, 4, 0)
	wantErr(t, err, nil, `operator "topic": rescale the source from 3 to 4 subtasks: no partitions`)
}
