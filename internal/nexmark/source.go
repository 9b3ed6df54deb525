package nexmark

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/roundrobin"
)

// Source is one subtask of a nexmark source (it implements
// connector.Source and connector.ReadySource). Subtask i of p produces
// events n = i, i+p, i+2p, ...; each record's value is the event's
// encoding, its timestamp the event time, and it has no key. Its position
// is the next n (package roundrobin, which also rescales it: then a
// subtask skips the events an old subtask produced).
type Source struct {
	gen                  *Generator
	split                *roundrobin.Split
	subtask, parallelism int
	next                 int64 // next n to produce
	events               int64 // bounded: n < events; unbounded: -1
	lag                  int64 // ms subtracted from the watermark
	read                 bool  // produced an event

	rate     float64 // events per second of this subtask; 0: unpaced
	started  time.Time
	produced int64
	now      func() time.Time

	arena []byte
	ends  []int
}

// NewSource returns subtask's source. pos is nil to start at the beginning,
// or a Position of the same subtask at the same parallelism (or one
// roundrobin.Rescale made). lag is the
// job file's watermark.max_out_of_orderness.
func NewSource(cfg Config, lag time.Duration, subtask, parallelism int, pos []byte) (*Source, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("nexmark: %w", err)
	}
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("nexmark: subtask %d of parallelism %d", subtask, parallelism)
	}
	s := &Source{
		gen: NewGenerator(cfg), subtask: subtask, parallelism: parallelism,
		next: int64(subtask), events: cfg.Events, lag: lag.Milliseconds(),
		rate: cfg.Rate / float64(parallelism), now: time.Now,
	}
	if s.events == 0 {
		s.events = -1
	}
	split, next, err := roundrobin.New(subtask, parallelism, pos, s.events)
	if err != nil {
		return nil, fmt.Errorf("nexmark: %w", err)
	}
	s.split, s.next = split, next
	return s, nil
}

// Position encodes the next n (and what an earlier rescale left to skip).
func (s *Source) Position() []byte { return s.split.Position(s.next) }

// Watermark: every later event of this subtask has a time above it (Beam's
// watermark minus 1 ms, as the reference's times repeat within a ms),
// minus the configured lag.
func (s *Source) Watermark() int64 {
	if !s.read {
		return abi.MinWatermark
	}
	return s.gen.Watermark(s.next) - 1 - s.lag
}

// Close does nothing.
func (s *Source) Close() error { return nil }

// left is how many events this subtask has yet to produce (-1: unbounded),
// at most: after a rescale some may be skipped.
func (s *Source) left() int64 {
	if s.events < 0 {
		return -1
	}
	if s.next >= s.events {
		return 0
	}
	p := int64(s.parallelism)
	return (s.events - s.next + p - 1) / p
}

// due is how many events the rate allows now beyond those produced.
func (s *Source) due() int64 {
	return int64(s.rate*s.now().Sub(s.started).Seconds()) - s.produced
}

// step is the least number of events a paced Read waits for (~10 ms worth).
func (s *Source) step() int64 { return max(int64(s.rate/100), 1) }

// Ready reports whether Read returns at once.
func (s *Source) Ready() bool {
	if s.rate <= 0 || s.left() == 0 {
		return true
	}
	return !s.started.IsZero() && s.due() >= s.step()
}

// Read produces the next events, paced by the rate if there is one.
func (s *Source) Read(ctx context.Context, recs []abi.Record) (int, error) {
	want := int64(len(recs))
	switch left := s.left(); {
	case left == 0:
		return 0, io.EOF
	case left > 0:
		want = min(want, left)
	}
	if want == 0 {
		return 0, nil
	}
	if s.rate > 0 {
		if s.started.IsZero() {
			s.started = s.now()
		}
		for s.due() < min(s.step(), want) {
			wait := time.Duration(float64(s.produced+min(s.step(), want))/s.rate*float64(time.Second)) - s.now().Sub(s.started)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return 0, fmt.Errorf("nexmark: %w", context.Cause(ctx))
			}
		}
		want = min(want, s.due())
		s.produced += want
	}
	if k := s.fill(recs[:want]); k > 0 || s.left() != 0 {
		return k, nil
	}
	return 0, io.EOF
}

// fill produces up to len(recs) events and returns how many (fewer at the
// end of a bounded source whose last events an old subtask produced).
func (s *Source) fill(recs []abi.Record) int {
	a, ends := s.arena[:0], s.ends[:0]
	p, skipping := int64(s.parallelism), s.split.Skipping()
	for i := range recs {
		if skipping && s.events >= 0 && s.next >= s.events { // else Read asked for no more than left
			recs = recs[:i]
			break
		}
		var ts int64
		a, ts = s.gen.Append(a, s.next)
		ends = append(ends, len(a))
		recs[i].Timestamp = ts
		if skipping {
			s.next = s.split.Next(s.next)
		} else {
			s.next += p
		}
	}
	start := 0
	for i, e := range ends {
		recs[i].Key = nil
		recs[i].Value = a[start:e:e]
		start = e
	}
	s.read = s.read || len(recs) > 0
	s.arena, s.ends = a, ends
	return len(recs)
}
