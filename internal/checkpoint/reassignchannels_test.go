package checkpoint

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
)

const testMaxP = 128

// edgeGraph is src(1) -rebalance-> a(pa) -part-> b(pb).
func edgeGraph(t *testing.T, part control.Partitioning, pa, pb int) *control.JobGraph {
	t.Helper()
	g, err := control.NewJobGraph("job", []*control.Vertex{
		{UID: "src", Parallelism: 1, Kind: control.KindSource},
		{UID: "a", Parallelism: pa, MaxParallelism: testMaxP, Kind: control.KindOperator, Inputs: []control.Edge{{From: "src", Partition: control.Rebalance}}},
		{UID: "b", Parallelism: pb, MaxParallelism: testMaxP, Kind: control.KindSink, Inputs: []control.Edge{{From: "a", Partition: part}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// sent is one record of the test: its value says which old upstream
// subtask sent it to which old downstream subtask, and its place on that
// channel.
type sent struct{ u, d, seq int }

func parseSent(t *testing.T, r abi.Record) sent {
	var s sent
	if _, err := fmt.Sscanf(string(r.Value), "%d:%d:%d", &s.u, &s.d, &s.seq); err != nil {
		t.Fatalf("record value %q: %v", r.Value, err)
	}
	return s
}

// inflightCheckpoint builds the checkpoint's metadata and channel state of
// the edge a(oldUp) -part-> b(oldDown) as the subtasks would have stored
// them: every old upstream subtask emitted n records with keys key-0..key-9,
// routed by the partitioning; of each channel the first half is in the
// receiver's input channel state, the rest in the sender's output buffer,
// which ends with watermark 100+10u+d. For broadcast, old downstream subtask
// d had processed d more of the copies than subtask 0.
func inflightCheckpoint(t *testing.T, part control.Partitioning, oldUp, oldDown, n int) (*Metadata, map[string][]*SubtaskState) {
	t.Helper()
	md := &Metadata{Version: FormatVersionChannelState, Job: "job", ID: 3, Kind: control.KindCheckpoint}
	for _, op := range []struct {
		uid string
		p   int
	}{{"src", 1}, {"a", oldUp}, {"b", oldDown}} {
		om := OperatorMeta{UID: op.uid, Parallelism: op.p, MaxParallelism: testMaxP}
		for i := range op.p {
			om.Subtasks = append(om.Subtasks, SubtaskMeta{Index: i})
		}
		md.Operators = append(md.Operators, om)
	}
	chans := map[[2]int][]Element{}
	for u := range oldUp {
		rr := u
		for i := range n {
			key := fmt.Sprintf("key-%d", (i*7+u)%10)
			var ds []int
			switch part {
			case control.Hash:
				ds = []int{dataplane.HashTarget(abi.Record{Key: []byte(key)}, testMaxP, oldDown)}
			case control.Rebalance:
				ds = []int{rr % oldDown}
				rr++
			default: // forward, broadcast
				for d := range oldDown {
					if part == control.Broadcast && i < d || part == control.Forward && d != u {
						continue
					}
					ds = append(ds, d)
				}
			}
			for _, d := range ds {
				ch := [2]int{u, d}
				chans[ch] = append(chans[ch], rec(key, fmt.Sprintf("%d:%d:%d", u, d, len(chans[ch])), int64(i)))
			}
		}
	}
	a, b := make([]*SubtaskState, oldUp), make([]*SubtaskState, oldDown)
	for i := range a {
		a[i] = &SubtaskState{Channels: &ChannelState{}}
	}
	for i := range b {
		b[i] = &SubtaskState{Channels: &ChannelState{}}
	}
	for u := range oldUp {
		for d := range oldDown {
			el, ok := chans[[2]int{u, d}]
			if !ok {
				continue
			}
			half := len(el) / 2
			b[d].Channels.Inputs = append(b[d].Channels.Inputs, ChannelData{Operator: "a", Subtask: u, Elements: el[:half]})
			out := append(el[half:len(el):len(el)], WatermarkElement(int64(100+10*u+d)))
			a[u].Channels.Outputs = append(a[u].Channels.Outputs, ChannelData{Operator: "b", Subtask: d, Elements: out})
		}
	}
	return md, map[string][]*SubtaskState{"a": a, "b": b}
}

// replayed is what one new channel a[U] -> b[D] replays.
type replayed struct {
	U, D  int
	recs  []abi.Record
	marks []int64
	last  bool // the last element is a watermark
}

func replays(t *testing.T, out map[control.SubtaskID][]ChannelData, newDown int) []replayed {
	t.Helper()
	var rs []replayed
	for id, chans := range out {
		if id.Operator != "b" || id.Index >= newDown {
			t.Fatalf("in-flight elements for %v", id)
		}
		for _, ch := range chans {
			if ch.Operator != "a" || ch.Input != 0 {
				t.Fatalf("subtask %v: channel %s", id, ch.name())
			}
			r := replayed{U: ch.Subtask, D: id.Index}
			for _, e := range ch.Elements {
				if e.Kind == ElementWatermark {
					r.marks = append(r.marks, e.Watermark)
				} else {
					r.recs = append(r.recs, e.Record)
				}
			}
			r.last = ch.Elements[len(ch.Elements)-1].Kind == ElementWatermark
			rs = append(rs, r)
		}
	}
	return rs
}

// checkOrder fails unless the records of each old channel keep their order
// within r (seq increasing).
func checkOrder(t *testing.T, r replayed) {
	t.Helper()
	last := map[[2]int]int{}
	for _, rec := range r.recs {
		s := parseSent(t, rec)
		ch := [2]int{s.u, s.d}
		if prev, ok := last[ch]; ok && s.seq <= prev {
			t.Fatalf("new channel a[%d] -> b[%d]: record %d of old channel %v after record %d", r.U, r.D, s.seq, ch, prev)
		}
		last[ch] = s.seq
	}
}

func TestReassignChannelsRescale(t *testing.T) {
	const n = 40
	for _, part := range []control.Partitioning{control.Hash, control.Rebalance, control.Broadcast} {
		for _, ps := range [][2]int{{2, 3}, {4, 2}} {
			oldP, newP := ps[0], ps[1]
			t.Run(fmt.Sprintf("%s-%dto%d", part, oldP, newP), func(t *testing.T) {
				md, states := inflightCheckpoint(t, part, oldP, oldP, n)
				out, err := ReassignChannels(edgeGraph(t, part, newP, newP), md, states)
				if err != nil {
					t.Fatal(err)
				}
				rs := replays(t, out, newP)
				seen := map[sent]int{} // record -> new downstream subtask
				perNew := make([]int, newP)
				for _, r := range rs {
					checkOrder(t, r)
					// Watermarks: one, the smallest of the old channels',
					// after the records.
					if !reflect.DeepEqual(r.marks, []int64{100}) || !r.last {
						t.Fatalf("a[%d] -> b[%d]: watermarks %v (last element a watermark: %v), want [100] at the end", r.U, r.D, r.marks, r.last)
					}
					for _, rec := range r.recs {
						s := parseSent(t, rec)
						if r.U != s.u%newP {
							t.Fatalf("record %v of old a[%d] replayed on the channel from a[%d], want a[%d]", s, s.u, r.U, s.u%newP)
						}
						if prev, dup := seen[s]; dup && (part != control.Broadcast || prev == r.D) {
							t.Fatalf("record %v replayed twice (b[%d], b[%d])", s, prev, r.D)
						}
						seen[s] = r.D
						perNew[r.D]++
						switch part {
						case control.Hash:
							if want := dataplane.HashTarget(rec, testMaxP, newP); r.D != want {
								t.Fatalf("key %s to b[%d], its key group is b[%d]'s", rec.Key, r.D, want)
							}
						case control.Broadcast:
							if s.d != r.D%oldP {
								t.Fatalf("b[%d] replays the copy of old b[%d], want old b[%d]'s", r.D, s.d, r.D%oldP)
							}
						}
					}
				}
				// Every record stored is replayed (broadcast: to every new
				// subtask whose old subtask held that copy).
				total := 0
				for _, st := range states["b"] {
					for _, ch := range st.Channels.Inputs {
						total += len(ch.Elements)
					}
				}
				for _, st := range states["a"] {
					for _, ch := range st.Channels.Outputs {
						total += len(ch.Elements) - 1
					}
				}
				if part != control.Broadcast && len(seen) != total {
					t.Fatalf("%d records replayed, %d stored", len(seen), total)
				}
				if part == control.Broadcast {
					want := 0
					for d := range newP {
						for _, st := range states["a"] {
							for _, ch := range st.Channels.Outputs {
								if ch.Subtask == d%oldP {
									want += len(ch.Elements) - 1
								}
							}
						}
						for _, ch := range states["b"][d%oldP].Channels.Inputs {
							want += len(ch.Elements)
						}
					}
					got := 0
					for _, c := range perNew {
						got += c
					}
					if got != want {
						t.Fatalf("broadcast: %d records replayed, want %d (each new subtask the copies of one old subtask)", got, want)
					}
				}
				if part == control.Rebalance {
					for d, c := range perNew {
						if c < total/newP || c > total/newP+1 {
							t.Fatalf("rebalance: b[%d] replays %d of %d records: %v", d, c, total, perNew)
						}
					}
				}
			})
		}
	}
}

// Per key, the records replayed on a hash edge come in the order the old
// upstream subtask sent them, also across the two halves (receiver's input
// state first, then the sender's output buffer).
func TestReassignChannelsPerKeyOrder(t *testing.T) {
	md, states := inflightCheckpoint(t, control.Hash, 4, 4, 200)
	out, err := ReassignChannels(edgeGraph(t, control.Hash, 3, 2), md, states)
	if err != nil {
		t.Fatal(err)
	}
	type keyFrom struct {
		key string
		u   int
	}
	lastTS := map[keyFrom]int64{}
	n := 0
	for _, r := range replays(t, out, 2) {
		for _, rec := range r.recs {
			s := parseSent(t, rec)
			k := keyFrom{string(rec.Key), s.u}
			if prev, ok := lastTS[k]; ok && rec.Timestamp <= prev {
				t.Fatalf("key %s from old a[%d]: record %d after %d", rec.Key, s.u, rec.Timestamp, prev)
			}
			lastTS[k] = rec.Timestamp
			n++
		}
	}
	if n != 4*200 {
		t.Fatalf("%d records replayed, want %d", n, 4*200)
	}
}

// At unchanged parallelism every old channel is replayed as it was,
// watermarks in place, whatever the partitioning (forward too).
func TestReassignChannelsUnchanged(t *testing.T) {
	for _, part := range []control.Partitioning{control.Forward, control.Hash} {
		md, states := inflightCheckpoint(t, part, 2, 2, 10)
		out, err := ReassignChannels(edgeGraph(t, part, 2, 2), md, states)
		if err != nil {
			t.Fatal(err)
		}
		for d := range 2 {
			var want []ChannelData
			for _, in := range states["b"][d].Channels.Inputs {
				els := append([]Element{}, in.Elements...)
				for _, o := range states["a"][in.Subtask].Channels.Outputs {
					if o.Subtask == d {
						els = append(els, o.Elements...)
					}
				}
				want = append(want, ChannelData{Operator: "a", Subtask: in.Subtask, Elements: els})
			}
			if got := out[control.SubtaskID{Operator: "b", Index: d}]; !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: b[%d] replays\n%+v\nwant\n%+v", part, d, got, want)
			}
		}
	}
}

func TestReassignChannelsWatermarks(t *testing.T) {
	// One old channel without a watermark: the rescaled edge replays none.
	md, states := inflightCheckpoint(t, control.Rebalance, 2, 2, 10)
	outs := states["a"][1].Channels.Outputs
	outs[0].Elements = outs[0].Elements[:len(outs[0].Elements)-1]
	out, err := ReassignChannels(edgeGraph(t, control.Rebalance, 3, 3), md, states)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replays(t, out, 3) {
		if len(r.marks) != 0 {
			t.Fatalf("a[%d] -> b[%d] replays watermarks %v, want none", r.U, r.D, r.marks)
		}
	}
	// Its upstream subtask had finished: it no longer holds the others back.
	md.Operators[1].Subtasks[1].Finished = true
	out, err = ReassignChannels(edgeGraph(t, control.Rebalance, 3, 3), md, states)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replays(t, out, 3) {
		if !reflect.DeepEqual(r.marks, []int64{100}) {
			t.Fatalf("a[%d] -> b[%d] replays watermarks %v, want [100] (a[0]'s smallest)", r.U, r.D, r.marks)
		}
	}
}

func TestReassignChannelsErrors(t *testing.T) {
	md, states := inflightCheckpoint(t, control.Forward, 2, 2, 10)
	_, err := ReassignChannels(edgeGraph(t, control.Forward, 3, 3), md, states)
	want := `checkpoint: the edge "a" -> "b" (input 0) is forward and has in-flight elements in checkpoint 3: it restores only at unchanged parallelism ("a": 2 in the checkpoint, 3 now; "b": 2 in the checkpoint, 3 now)`
	if err == nil || err.Error() != want {
		t.Fatalf("forward rescale: %v\nwant %s", err, want)
	}
	// Without in-flight elements a forward edge rescales as before.
	if _, err := ReassignChannels(edgeGraph(t, control.Forward, 3, 3), md, nil); err != nil {
		t.Fatal(err)
	}

	// An edge the job no longer has.
	md, states = inflightCheckpoint(t, control.Hash, 2, 2, 10)
	states["b"][0].Channels.Inputs[0].Input = 1
	_, err = ReassignChannels(edgeGraph(t, control.Hash, 2, 2), md, states)
	if err == nil || !strings.Contains(err.Error(), `subtask 0 of "b" has in-flight elements of the edge "a" -> "b" (input 1), which job "job" does not have`) {
		t.Fatalf("unknown edge: %v", err)
	}
	// A channel outside the checkpoint's parallelism.
	md, states = inflightCheckpoint(t, control.Hash, 2, 2, 10)
	states["a"][1].Channels.Outputs[0].Subtask = 5
	_, err = ReassignChannels(edgeGraph(t, control.Hash, 2, 2), md, states)
	wantCorrupt(t, err, `channel "a"[1] -> "b"[5] outside the checkpoint's parallelism (2, 2)`)
}
