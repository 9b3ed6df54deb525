package connector

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/roundrobin"
)

// Generator is the deterministic generator source (SourceSpec with
// Type "generator"). Subtask i of p produces records n = i, i+p, i+2p, ...,
// each a pure function of n, so a run, a rescaled run and a resumed run all
// produce the same records. Its position is the next n (package
// roundrobin, which also rescales it).
type Generator struct {
	subtask, parallelism int
	split                *roundrobin.Split
	next                 int64 // next n to produce
	count                int64 // bounded: n < count; unbounded: -1
	keys                 int64
	key, value           []segment
	valueSize            int
	startTS, tsStep      int64
	lag                  int64 // watermark lag in ms
	maxTS                int64
	any                  bool // produced a record (maxTS valid)

	rate     float64 // records per second of this subtask; 0 = unlimited
	started  time.Time
	produced int64 // records produced since started
	now      func() time.Time

	dots  []byte // valueSize dots, the padding
	arena []byte
	offs  []int // per record: key start, value start, value end
}

type segment struct {
	lit string
	ph  byte // 0: literal, 'n' or 'k'
}

func compilePattern(p string) []segment {
	var segs []segment
	for p != "" {
		i := strings.Index(p, "{")
		if i < 0 {
			segs = append(segs, segment{lit: p})
			break
		}
		if strings.HasPrefix(p[i:], "{n}") || strings.HasPrefix(p[i:], "{k}") {
			if i > 0 {
				segs = append(segs, segment{lit: p[:i]})
			}
			segs = append(segs, segment{ph: p[i+1]})
			p = p[i+3:]
			continue
		}
		segs = append(segs, segment{lit: p[:i+1]})
		p = p[i+1:]
	}
	return segs
}

func usesK(segs []segment) bool {
	for _, s := range segs {
		if s.ph == 'k' {
			return true
		}
	}
	return false
}

const positionVersion = 1

// NewGenerator returns subtask's generator. pos is nil to start at the
// beginning, or a Position() of an earlier generator subtask with the same
// index and parallelism (or one roundrobin.Rescale made).
func NewGenerator(spec *SourceSpec, subtask, parallelism int, pos []byte) (*Generator, error) {
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("connector: generator: subtask %d of parallelism %d", subtask, parallelism)
	}
	if spec.Count < 0 || spec.Rate < 0 || spec.ValueSize < 0 {
		return nil, fmt.Errorf("connector: generator: count %d, rate %v and value size %d must not be negative", spec.Count, spec.Rate, spec.ValueSize)
	}
	g := &Generator{
		subtask:     subtask,
		parallelism: parallelism,
		next:        int64(subtask),
		count:       spec.Count,
		keys:        spec.Keys,
		key:         compilePattern(spec.KeyPattern),
		value:       compilePattern(spec.ValuePattern),
		valueSize:   spec.ValueSize,
		startTS:     spec.StartTS,
		tsStep:      spec.TSStep,
		lag:         spec.WatermarkLag.Milliseconds(),
		rate:        spec.Rate / float64(parallelism),
		now:         time.Now,
		dots:        []byte(strings.Repeat(".", spec.ValueSize)),
	}
	if spec.Count == 0 && spec.Rate > 0 {
		g.count = -1
	}
	if g.keys <= 0 && (usesK(g.key) || usesK(g.value)) {
		return nil, fmt.Errorf("connector: generator: keys must be > 0 when a pattern uses {k}, got %d", g.keys)
	}
	split, next, err := roundrobin.New(subtask, parallelism, pos, g.count)
	if err != nil {
		return nil, fmt.Errorf("connector: generator: %w", err)
	}
	g.split, g.next = split, next
	return g, nil
}

// Position encodes the next n (and what an earlier rescale left to skip).
func (g *Generator) Position() []byte { return g.split.Position(g.next) }

// Next is the next n the generator produces.
func (g *Generator) Next() int64 { return g.next }

// Watermark is the largest timestamp produced minus the watermark lag.
func (g *Generator) Watermark() int64 {
	if !g.any {
		return abi.MinWatermark
	}
	return g.maxTS - g.lag
}

// Close does nothing.
func (g *Generator) Close() error { return nil }

// remaining is how many records are left for this subtask (-1: unbounded),
// at most: after a rescale some of them may be skipped.
func (g *Generator) remaining() int64 {
	if g.count < 0 {
		return -1
	}
	if g.next >= g.count {
		return 0
	}
	p := int64(g.parallelism)
	return (g.count - g.next + p - 1) / p
}

// Read produces the next records; with a rate it waits until they are due,
// in steps of ~1 ms of records (at least one record): a record waits for
// its step at most 1 ms, while a step at high rates is still a batch (100
// records at 100k/s).
func (g *Generator) Read(ctx context.Context, recs []abi.Record) (int, error) {
	want := int64(len(recs))
	if rem := g.remaining(); rem == 0 {
		return 0, io.EOF
	} else if rem > 0 && rem < want {
		want = rem
	}
	if want == 0 {
		return 0, nil
	}
	if g.rate > 0 {
		w, err := g.throttle(ctx, want)
		if err != nil {
			return 0, err
		}
		want = w
	}
	if k := g.fill(recs[:want]); k > 0 || g.remaining() != 0 {
		return k, nil
	}
	return 0, io.EOF
}

// Ready reports whether Read returns at once: no rate, the end, or at least
// a step of records due.
func (g *Generator) Ready() bool {
	if g.rate <= 0 || g.remaining() == 0 {
		return true
	}
	if g.started.IsZero() {
		return false
	}
	step := max(int64(g.rate/1000), 1)
	return int64(g.rate*g.now().Sub(g.started).Seconds())-g.produced >= step
}

// throttle waits until at least min(want, rate*1ms) more records are due and
// returns how many (<= want) may be produced now.
func (g *Generator) throttle(ctx context.Context, want int64) (int64, error) {
	if g.started.IsZero() {
		g.started = g.now()
	}
	step := int64(g.rate / 1000)
	if step < 1 {
		step = 1
	}
	if step > want {
		step = want
	}
	for {
		due := int64(g.rate*g.now().Sub(g.started).Seconds()) - g.produced
		if due >= step {
			if due < want {
				want = due
			}
			g.produced += want
			return want, nil
		}
		// Sleep until produced+step records are due.
		at := g.started.Add(time.Duration(float64(g.produced+step) / g.rate * float64(time.Second)))
		t := time.NewTimer(at.Sub(g.now()))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("connector: generator: %w", context.Cause(ctx))
		}
	}
}

func (g *Generator) appendPattern(dst []byte, segs []segment, n int64) []byte {
	for _, s := range segs {
		switch s.ph {
		case 0:
			dst = append(dst, s.lit...)
		case 'n':
			dst = strconv.AppendInt(dst, n, 10)
		case 'k':
			dst = strconv.AppendInt(dst, n%g.keys, 10)
		}
	}
	return dst
}

// fill produces up to len(recs) records and returns how many (fewer at the
// end of a bounded generator whose last numbers an old subtask produced).
func (g *Generator) fill(recs []abi.Record) int {
	a := g.arena[:0]
	offs := g.offs[:0]
	n := g.next
	p, skipping := int64(g.parallelism), g.split.Skipping()
	for i := range recs {
		if skipping && g.count >= 0 && n >= g.count { // else Read asked for no more than remain
			recs = recs[:i]
			break
		}
		ks := len(a)
		a = g.appendPattern(a, g.key, n)
		vs := len(a)
		a = g.appendPattern(a, g.value, n)
		if pad := g.valueSize - (len(a) - vs); pad > 0 {
			a = append(a, g.dots[:pad]...)
		}
		offs = append(offs, ks, vs, len(a))
		ts := g.startTS + n*g.tsStep
		recs[i].Timestamp = ts
		if !g.any || ts > g.maxTS {
			g.maxTS, g.any = ts, true
		}
		if skipping {
			n = g.split.Next(n)
		} else {
			n += p
		}
	}
	// Slice after filling: the arena may have moved while it grew.
	for i := range recs {
		ks, vs, ve := offs[3*i], offs[3*i+1], offs[3*i+2]
		if vs > ks {
			recs[i].Key = a[ks:vs:vs]
		} else {
			recs[i].Key = nil
		}
		recs[i].Value = a[vs:ve:ve]
	}
	g.next = n
	g.arena, g.offs = a, offs
	return len(recs)
}
