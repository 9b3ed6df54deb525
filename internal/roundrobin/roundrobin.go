// Package roundrobin is the split of the sequence 0, 1, 2, ... that the
// generator and nexmark sources (and any source whose records are numbered)
// deal round robin: subtask i of p produces the numbers n ≡ i (mod p) in
// increasing order, and its position in a checkpoint is the next n.
//
// Such a source restores at another parallelism (Rescale): what the old
// subtasks produced is, per old residue class r, the numbers below the old
// subtask r's next n. A new subtask j of p' produces the numbers n ≡ j
// (mod p') that none of them produced, in increasing order, so the union
// over every attempt is the sequence exactly once. Its position carries
// what it must skip as layers, one per rescale not yet passed: a layer is
// the old parallelism q and the old next n of each residue r < q (every
// n ≡ r (mod q) below it was produced; Finished: all of them). A layer is
// dropped once every subtask is past it: at a rescale, everything below
// the largest of the layers' smallest next n was produced, the new
// subtasks start there and the layers that cover nothing from there on
// go; a subtask drops a layer itself once its next n is past every n the
// layer covers.
//
// Encoding: version 1 (a split with no layers, which every position of a
// source never rescaled is) is 9 bytes: 0x01 and the next n (big endian
// uint64). Version 2 is 0x02, the next n (big endian uint64), the number
// of layers (uvarint) and for each its q (uvarint) and q next n (uvarint,
// Finished as math.MaxInt64).
package roundrobin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Finished is a layer's next n for an old subtask that had finished (or an
// end past every n).
const Finished = math.MaxInt64

const (
	version1 = 1
	version2 = 2
)

// layer[r] is the next n the old subtask r of len(layer) had: every
// n ≡ r (mod len(layer)) below it was produced.
type layer []int64

func (l layer) covers(n int64) bool { return n < l[n%int64(len(l))] }

// last is the largest n the layer covers (-1: none).
func (l layer) last() int64 {
	q, last := int64(len(l)), int64(-1)
	for r, v := range l {
		if v > int64(r) { // the largest n ≡ r (mod q) below v
			last = max(last, v-1-((v-1-int64(r))%q))
		}
	}
	return last
}

func (l layer) min() int64 { return slices.Min(l) }

// Split is one subtask's share of the sequence.
type Split struct {
	subtask, parallelism int64
	end                  int64 // numbers >= end are never produced; -1: none
	layers               Layers
}

// New opens subtask's split at parallelism and returns it with the first
// n it produces (at or past end when it has none left). pos is nil to
// start at the beginning, or a Position of the same subtask and
// parallelism (from a checkpoint, possibly written by Rescale). end bounds
// the sequence (n < end), -1 when unbounded. The errors name no package:
// the caller prefixes its own.
func New(subtask, parallelism int, pos []byte, end int64) (*Split, int64, error) {
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, 0, fmt.Errorf("subtask %d of parallelism %d", subtask, parallelism)
	}
	s := &Split{subtask: int64(subtask), parallelism: int64(parallelism), end: end}
	if pos == nil {
		return s, s.skip(s.subtask), nil
	}
	next, layers, err := decode(pos)
	if err != nil {
		return nil, 0, err
	}
	past := end >= 0 && next >= end
	if next%s.parallelism != s.subtask && !past {
		return nil, 0, fmt.Errorf("position n=%d does not belong to subtask %d of %d", next, subtask, parallelism)
	}
	if next == Finished && end < 0 {
		return nil, 0, fmt.Errorf("position of a finished subtask in an unbounded sequence")
	}
	for _, l := range layers {
		if slices.Contains(l, Finished) {
			if end < 0 {
				return nil, 0, fmt.Errorf("position says an old subtask of %d finished, but the sequence is unbounded", len(l))
			}
			l = slices.Clone(l)
			for r, v := range l {
				l[r] = min(v, end) // nothing at or past end was produced
			}
		}
		s.layers = append(s.layers, l)
	}
	return s, s.skip(next), nil
}

// Skipping reports whether the subtask has numbers to skip ahead: while it
// does not, the n it produces after n is n + parallelism.
func (s *Split) Skipping() bool { return len(s.layers) > 0 }

// Next returns the n this subtask produces after n.
func (s *Split) Next(n int64) int64 {
	n += s.parallelism
	if len(s.layers) > 0 {
		n = s.skip(n)
	}
	return n
}

// skip returns the first n' >= n of this subtask's class that no old
// subtask produced (or n' >= end), and drops the layers it is past.
func (s *Split) skip(n int64) int64 {
	for len(s.layers) > 0 && (s.end < 0 || n < s.end) && s.layers.Covers(n) {
		n += s.parallelism
	}
	s.layers = s.layers.Trim(n)
	return n
}

// Position encodes next (the next n this subtask produces) with the layers
// it has yet to pass.
func (s *Split) Position(next int64) []byte { return encode(next, s.layers) }

// Rescale turns the positions of a source's old subtasks (nil for one that
// had finished: every n of its class was produced) into those of
// parallelism new ones (see the package doc).
func Rescale(positions [][]byte, parallelism int) ([][]byte, error) {
	oldP := len(positions)
	if oldP < 1 || parallelism < 1 {
		return nil, fmt.Errorf("rescale from %d to %d subtasks", oldP, parallelism)
	}
	next := make([]int64, oldP)
	old := make([]Layers, oldP)
	for j, pos := range positions {
		if pos == nil {
			next[j] = Finished
			continue
		}
		n, ls, err := decode(pos)
		if err != nil {
			return nil, fmt.Errorf("subtask %d: %w", j, err)
		}
		if n != Finished && n%int64(oldP) != int64(j) {
			return nil, fmt.Errorf("subtask %d: position n=%d does not belong to subtask %d of %d", j, n, j, oldP)
		}
		next[j], old[j] = n, ls
	}
	base, layers := Merge(next, old)
	p := int64(parallelism)
	out := make([][]byte, parallelism)
	for j := range out {
		n := int64(Finished)
		if base <= Finished-p {
			n = base + ((int64(j)-base%p)%p+p)%p
		}
		out[j] = encode(n, layers)
	}
	return out, nil
}

// Layers is what a subtask has yet to skip of what the subtasks before a
// rescale produced (see the package doc).
type Layers []layer

// Covers reports whether n was produced before a rescale.
func (ls Layers) Covers(n int64) bool {
	for _, l := range ls {
		if l.covers(n) {
			return true
		}
	}
	return false
}

// Trim drops the layers that cover nothing at or above n.
func (ls Layers) Trim(n int64) Layers {
	return slices.DeleteFunc(ls, func(l layer) bool { return l.last() < n })
}

// Merge is the rescale of a source whose old subtask j of len(next) had
// produced every n ≡ j (mod len(next)) below next[j] (Finished: all) and
// had old[j] left to skip: everything below base was produced, and the
// layers cover what was at or above it.
func Merge(next []int64, old []Layers) (base int64, layers Layers) {
	for _, ls := range old {
		for _, l := range ls {
			if !slices.ContainsFunc(layers, func(m layer) bool { return slices.Equal(l, m) }) {
				layers = append(layers, l)
			}
		}
	}
	layers = append(layers, layer(slices.Clone(next)))
	for _, l := range layers {
		base = max(base, l.min())
	}
	return base, layers.Trim(base)
}

// AppendLayers appends the encoding of ls (its count, then each layer's
// parallelism and next n, uvarints) to b.
func AppendLayers(b []byte, ls Layers) []byte {
	b = binary.AppendUvarint(b, uint64(len(ls)))
	for _, l := range ls {
		b = binary.AppendUvarint(b, uint64(len(l)))
		for _, v := range l {
			b = binary.AppendUvarint(b, uint64(v))
		}
	}
	return b
}

// ParseLayers decodes what AppendLayers wrote, b whole.
func ParseLayers(b []byte) (Layers, error) {
	uv := func() (int64, bool) {
		v, k := binary.Uvarint(b)
		if k <= 0 || v > math.MaxInt64 {
			return 0, false
		}
		b = b[k:]
		return int64(v), true
	}
	nl, ok := uv()
	if !ok || nl > int64(len(b)) {
		return nil, errors.New("layer count")
	}
	var layers Layers
	for range nl {
		q, ok := uv()
		if !ok || q < 1 || q > int64(len(b)) {
			return nil, errors.New("layer parallelism")
		}
		l := make(layer, q)
		for r := range l {
			if l[r], ok = uv(); !ok {
				return nil, errors.New("layer's next n")
			}
		}
		layers = append(layers, l)
	}
	if len(b) != 0 {
		return nil, errors.New("trailing bytes")
	}
	return layers, nil
}

func encode(next int64, layers Layers) []byte {
	b := make([]byte, 9, 16)
	b[0] = version1
	binary.BigEndian.PutUint64(b[1:], uint64(next))
	if len(layers) == 0 {
		return b
	}
	b[0] = version2
	return AppendLayers(b, layers)
}

var errBad = errors.New("bad position")

func decode(pos []byte) (next int64, layers Layers, err error) {
	bad := func(why string) error { return fmt.Errorf("%w %x: %s", errBad, pos, why) }
	if len(pos) < 9 || (pos[0] != version1 && pos[0] != version2) {
		return 0, nil, bad(fmt.Sprintf("want version %d (9 bytes) or %d", version1, version2))
	}
	next = int64(binary.BigEndian.Uint64(pos[1:9]))
	if next < 0 {
		return 0, nil, bad("negative n")
	}
	if pos[0] == version1 {
		if len(pos) != 9 {
			return 0, nil, bad("version 1 is 9 bytes")
		}
		return next, nil, nil
	}
	layers, err = ParseLayers(pos[9:])
	if err == nil && len(layers) == 0 {
		err = errors.New("layer count")
	}
	if err != nil {
		return 0, nil, bad(err.Error())
	}
	return next, layers, nil
}
