package roundrobin

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// run opens the subtasks of parallelism p at positions (nil: the start),
// lets subtask j produce up to steps[j] numbers (counted into seen, each
// checked to be of its class and increasing) and returns their positions,
// nil for a subtask that reached end.
func run(t *testing.T, p int, positions [][]byte, end int64, steps []int, seen map[int64]int) [][]byte {
	t.Helper()
	out := make([][]byte, p)
	for j := range p {
		var pos []byte
		if positions != nil {
			pos = positions[j]
		}
		s, n, err := New(j, p, pos, end)
		if err != nil {
			t.Fatalf("subtask %d of %d: %v", j, p, err)
		}
		last := int64(-1)
		for range steps[j] {
			if end >= 0 && n >= end {
				break
			}
			if n%int64(p) != int64(j) || n <= last {
				t.Fatalf("subtask %d of %d produced %d after %d", j, p, n, last)
			}
			seen[n]++
			last = n
			n = s.Next(n)
		}
		if end >= 0 && n >= end {
			continue // finished: the checkpoint has no position
		}
		out[j] = s.Position(n)
	}
	return out
}

func checkOnce(t *testing.T, seen map[int64]int, upTo int64) {
	t.Helper()
	for n := range upTo {
		if seen[n] != 1 {
			t.Fatalf("n=%d produced %d times", n, seen[n])
		}
	}
}

// A prefix at p, rescaled to p' and again to p” before every subtask is
// past the first rescale, then run on: every n exactly once, in order per
// subtask; bounded sequences finish with every n below the end.
func TestRescaleExactlyOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		end := int64(-1)
		if iter%2 == 1 {
			end = int64(rng.IntN(150))
		}
		seen := map[int64]int{}
		var pos [][]byte
		for range 1 + rng.IntN(4) {
			p := 1 + rng.IntN(6)
			if pos != nil {
				pos = rescale(t, pos, p)
			}
			steps := make([]int, p)
			for j := range steps {
				steps[j] = rng.IntN(40)
			}
			pos = run(t, p, pos, end, steps, seen)
			if allNil(pos) {
				break
			}
		}
		// Run to the end (bounded) or past 200 (unbounded).
		p := 1 + rng.IntN(6)
		if !allNil(pos) {
			pos = rescale(t, rescale(t, pos, p), p)
		}
		steps := make([]int, p)
		for j := range steps {
			steps[j] = 1000
		}
		if !allNil(pos) {
			run(t, p, pos, end, steps, seen)
		}
		upTo := end
		if end < 0 {
			upTo = 200
		}
		checkOnce(t, seen, upTo)
		for n := range seen {
			if end >= 0 && n >= end {
				t.Fatalf("n=%d produced past the end %d", n, end)
			}
		}
	}
}

func allNil(pos [][]byte) bool {
	for _, p := range pos {
		if p != nil {
			return false
		}
	}
	return true
}

func rescale(t *testing.T, pos [][]byte, p int) [][]byte {
	t.Helper()
	out, err := Rescale(pos, p)
	if err != nil {
		t.Fatalf("rescale %d -> %d: %v", len(pos), p, err)
	}
	if len(out) != p {
		t.Fatalf("rescale to %d: %d positions", p, len(out))
	}
	return out
}

// Positions of a split never rescaled are version 1 (what every earlier
// checkpoint holds), and version 1 positions rescale.
func TestVersion1(t *testing.T) {
	s, n, err := New(1, 3, nil, -1)
	if err != nil || n != 1 {
		t.Fatal(n, err)
	}
	n = s.Next(s.Next(n))
	if pos := s.Position(n); !bytes.Equal(pos, []byte{1, 0, 0, 0, 0, 0, 0, 0, 7}) {
		t.Fatalf("position %x", pos)
	}
	old := [][]byte{{1, 0, 0, 0, 0, 0, 0, 0, 8}, {1, 0, 0, 0, 0, 0, 0, 0, 5}}
	out := rescale(t, old, 3)
	for j, pos := range out {
		if pos[0] != 2 {
			t.Fatalf("subtask %d: %x, want version 2 (a layer to skip)", j, pos)
		}
	}
	// Once every old subtask is past its layer: version 1 again.
	out = rescale(t, [][]byte{{1, 0, 0, 0, 0, 0, 0, 0, 8}, {1, 0, 0, 0, 0, 0, 0, 0, 9}}, 2)
	if !bytes.Equal(out[0], []byte{1, 0, 0, 0, 0, 0, 0, 0, 8}) || !bytes.Equal(out[1], []byte{1, 0, 0, 0, 0, 0, 0, 0, 9}) {
		t.Fatalf("%x", out)
	}
}

func TestBadPositions(t *testing.T) {
	for _, c := range []struct {
		pos  []byte
		want string
	}{
		{[]byte{1, 0, 0, 0, 0, 0, 0, 0, 5}, "does not belong to subtask 1 of 3"},
		{[]byte{3, 0, 0, 0, 0, 0, 0, 0, 4}, "want version 1"},
		{[]byte{2, 0, 0, 0, 0, 0, 0, 0, 4}, "layer count"},
		{[]byte{2, 0, 0, 0, 0, 0, 0, 0, 4, 1, 1, 0x80}, "layer's next n"},
		{[]byte{2, 0, 0, 0, 0, 0, 0, 0, 4, 1, 1, 5, 0}, "trailing bytes"},
	} {
		_, _, err := New(1, 3, c.pos, -1)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
			t.Errorf("%x: %v, want %q", c.pos, err, c.want)
		}
	}
	if _, err := Rescale([][]byte{{1, 0, 0, 0, 0, 0, 0, 0, 1}, nil}, 2); err == nil {
		t.Error("subtask 0 at n=1 of 2 rescaled")
	}
}
