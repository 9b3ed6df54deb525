package checkpoint

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
)

// ReassignChannels computes what each subtask of job graph g replays first
// when it restores from checkpoint md: the channel state of the checkpoint
// (states holds each operator's loaded subtask states by uid and old subtask
// index), moved to the receiving side and redistributed to g's parallelism.
// The result holds, by subtask, its input channels with their elements,
// sorted by (Input, Operator, Subtask); it goes to SubtaskRestore.InFlight.
//
// An old channel from upstream subtask u to downstream subtask d of an edge
// carries, in order, the elements d had stored for its input channel from u
// (they were sent first), then those u had stored in its output buffer for d
// (the barrier overtook them before they were sent). Nothing is replayed by
// the sending side: a restored subtask's output buffers start empty.
//
// When neither end of the edge changed parallelism, each old channel is
// replayed as it is, on the same channel, watermarks in place. Otherwise the
// records are redistributed by the edge's partitioning, each old channel's
// records keeping their relative order; the old channels are taken in the
// order (u, d) ascending, and a record of old upstream subtask u is replayed
// on the channel from new upstream subtask u mod p'_up:
//
//   - hash: to the new owner of the record's key group (dataplane.HashTarget
//     with the receiving operator's max parallelism), so every key keeps its
//     order;
//   - rebalance: round robin, the k-th record of the edge (in the order above)
//     to new downstream subtask k mod p'_down;
//   - broadcast: every old downstream subtask held its own copy of what it
//     had not processed yet; new downstream subtask i takes the copies of old
//     subtask i mod p_down only (the old subtask whose broadcast state it
//     restores, see Reassign), so each record reaches it once;
//   - forward: refused (an error naming the edge and both parallelisms).
//
// Watermarks of a rescaled edge: a channel's watermarks are promises about
// the records that follow on that channel, which no longer hold once records
// of several old channels are merged. They are dropped, and every new channel
// of the edge replays, after its records, one watermark W: the smallest of the
// old channels' last watermarks, where a channel from a finished upstream
// subtask counts as having passed the end of event time, provided every old
// channel of the edge has one (else none: the watermarks flow again from the
// sources). So no new channel claims more event time than all old channels
// had passed, and no channel's watermark goes backwards.
func ReassignChannels(g *control.JobGraph, md *Metadata, states map[string][]*SubtaskState) (map[control.SubtaskID][]ChannelData, error) {
	edges, err := collectChannels(g, md, states)
	if err != nil {
		return nil, err
	}
	out := map[control.SubtaskID][]ChannelData{}
	for _, ek := range slices.SortedFunc(maps.Keys(edges), func(a, b edgeKey) int {
		return cmp.Or(cmp.Compare(a.to, b.to), cmp.Compare(a.input, b.input))
	}) {
		if err := edges[ek].reassign(g, md, out); err != nil {
			return nil, err
		}
	}
	for id, chans := range out {
		slices.SortFunc(chans, func(a, b ChannelData) int {
			return cmp.Or(cmp.Compare(a.Input, b.Input), cmp.Compare(a.Operator, b.Operator), cmp.Compare(a.Subtask, b.Subtask))
		})
		if om := md.Operator(id.Operator); om != nil && om.Finished == control.OperatorFullyFinished {
			return nil, fmt.Errorf("checkpoint: %s %d: %d channels of in-flight elements for subtask %d of operator %q, which is fully finished", md.Kind, md.ID, len(chans), id.Index, id.Operator)
		}
	}
	return out, nil
}

type edgeKey struct {
	from, to string
	input    int
}

// oldChannel is one channel of the checkpoint: what the receiver stored for
// it, then what the sender stored.
type oldChannel struct{ in, out []Element }

func (c *oldChannel) elements() []Element {
	if len(c.out) == 0 {
		return c.in
	}
	return append(slices.Clip(c.in), c.out...)
}

// edgeChannels is the channel state of one edge, by (old upstream, old
// downstream) subtask.
type edgeChannels struct {
	key            edgeKey
	part           control.Partitioning
	oldUp, oldDown int
	chans          map[[2]int]*oldChannel
}

// collectChannels gathers the channel state of every subtask by edge,
// checking that every channel is one of g's edges and within the
// checkpoint's parallelism.
func collectChannels(g *control.JobGraph, md *Metadata, states map[string][]*SubtaskState) (map[edgeKey]*edgeChannels, error) {
	edges := map[edgeKey]*edgeChannels{}
	where := fmt.Sprintf("%s %d", md.Kind, md.ID)
	get := func(from, to string, input, u, d int, self string, selfIndex int) (*oldChannel, error) {
		ek := edgeKey{from, to, input}
		ec := edges[ek]
		if ec == nil {
			v := g.Vertex(to)
			if v == nil || input >= len(v.Inputs) || v.Inputs[input].From != from {
				return nil, fmt.Errorf("checkpoint: %s: subtask %d of %q has in-flight elements of the edge %q -> %q (input %d), which job %q does not have", where, selfIndex, self, from, to, input, g.Name)
			}
			up, down := md.Operator(from), md.Operator(to)
			if up == nil || down == nil {
				return nil, fmt.Errorf("checkpoint: %s: subtask %d of %q has in-flight elements of the edge %q -> %q, whose operators the checkpoint does not both have: corrupt", where, selfIndex, self, from, to)
			}
			ec = &edgeChannels{key: ek, part: v.Inputs[input].Partition, oldUp: up.Parallelism, oldDown: down.Parallelism, chans: map[[2]int]*oldChannel{}}
			edges[ek] = ec
		}
		if u >= ec.oldUp || d >= ec.oldDown {
			return nil, fmt.Errorf("%w: %s: subtask %d of %q: channel %q[%d] -> %q[%d] outside the checkpoint's parallelism (%d, %d)", ErrCorrupt, where, selfIndex, self, from, u, to, d, ec.oldUp, ec.oldDown)
		}
		c := ec.chans[[2]int{u, d}]
		if c == nil {
			c = &oldChannel{}
			ec.chans[[2]int{u, d}] = c
		}
		return c, nil
	}
	for _, uid := range slices.Sorted(maps.Keys(states)) {
		for idx, st := range states[uid] {
			if st == nil || st.Channels.Empty() {
				continue
			}
			for _, ch := range st.Channels.Inputs {
				c, err := get(ch.Operator, uid, ch.Input, ch.Subtask, idx, uid, idx)
				if err != nil {
					return nil, err
				}
				c.in = ch.Elements
			}
			for _, ch := range st.Channels.Outputs {
				c, err := get(uid, ch.Operator, ch.Input, idx, ch.Subtask, uid, idx)
				if err != nil {
					return nil, err
				}
				c.out = ch.Elements
			}
		}
	}
	return edges, nil
}

// reassign adds the edge's channels to out, by new downstream subtask.
func (ec *edgeChannels) reassign(g *control.JobGraph, md *Metadata, out map[control.SubtaskID][]ChannelData) error {
	from, to := ec.key.from, ec.key.to
	newUp, newDown := g.Vertex(from).Parallelism, g.Vertex(to).Parallelism
	add := func(u, d int, elems []Element) {
		if len(elems) == 0 {
			return
		}
		id := control.SubtaskID{Operator: to, Index: d}
		out[id] = append(out[id], ChannelData{Operator: from, Subtask: u, Input: ec.key.input, Elements: elems})
	}
	if ec.oldUp == newUp && ec.oldDown == newDown {
		for _, ud := range slices.SortedFunc(maps.Keys(ec.chans), compareUD) {
			add(ud[0], ud[1], ec.chans[ud].elements())
		}
		return nil
	}
	if ec.part == control.Forward {
		return fmt.Errorf("checkpoint: the edge %q -> %q (input %d) is forward and has in-flight elements in %s %d: it restores only at unchanged parallelism (%q: %d in the checkpoint, %d now; %q: %d in the checkpoint, %d now)", from, to, ec.key.input, md.Kind, md.ID, from, ec.oldUp, newUp, to, ec.oldDown, newDown)
	}
	dest := map[[2]int][]Element{}
	route := func(u, d int, e Element) {
		k := [2]int{u % newUp, d}
		dest[k] = append(dest[k], e)
	}
	maxP := g.Vertex(to).MaxParallelism
	if maxP <= 0 {
		maxP = abi.DefaultMaxParallelism
	}
	k := 0
	for _, ud := range slices.SortedFunc(maps.Keys(ec.chans), compareUD) {
		for _, e := range ec.chans[ud].elements() {
			if e.Kind != ElementRecord {
				continue
			}
			switch ec.part {
			case control.Hash:
				route(ud[0], dataplane.HashTarget(e.Record, maxP, newDown), e)
			case control.Rebalance:
				route(ud[0], k%newDown, e)
				k++
			case control.Broadcast:
				for d := ud[1]; d < newDown; d += ec.oldDown {
					route(ud[0], d, e) // new d takes the copies of old d mod oldDown
				}
			default:
				return fmt.Errorf("checkpoint: the edge %q -> %q has unknown partitioning %q", from, to, ec.part)
			}
		}
	}
	if w, ok := ec.trailingWatermark(md.Operator(from)); ok {
		for u := range newUp {
			for d := range newDown {
				k := [2]int{u, d}
				dest[k] = append(dest[k], WatermarkElement(w))
			}
		}
	}
	for _, ud := range slices.SortedFunc(maps.Keys(dest), compareUD) {
		add(ud[0], ud[1], dest[ud])
	}
	return nil
}

// trailingWatermark is the watermark every new channel of a rescaled edge
// replays after its records (see ReassignChannels).
func (ec *edgeChannels) trailingWatermark(up *OperatorMeta) (int64, bool) {
	w := int64(math.MaxInt64)
	for u := range ec.oldUp {
		finished := up.Finished == control.OperatorFullyFinished || u < len(up.Subtasks) && up.Subtasks[u].Finished
		if finished {
			continue
		}
		for d := range ec.oldDown {
			c := ec.chans[[2]int{u, d}]
			if c == nil {
				return 0, false
			}
			last, ok := lastWatermark(c.elements())
			if !ok {
				return 0, false
			}
			w = min(w, last)
		}
	}
	if w == math.MaxInt64 {
		w = abi.MaxWatermark // every upstream subtask had finished
	}
	return w, true
}

func lastWatermark(elems []Element) (int64, bool) {
	for i := len(elems) - 1; i >= 0; i-- {
		if elems[i].Kind == ElementWatermark {
			return elems[i].Watermark, true
		}
	}
	return 0, false
}

func compareUD(a, b [2]int) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) }
