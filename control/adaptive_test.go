package control

import (
	"math/rand"
	"testing"
)

func TestAdaptiveSlots(t *testing.T) {
	src4, op4, sink1 := Bounds{Declared: 4}, Bounds{Declared: 4, Min: 2}, Bounds{Declared: 1}
	for _, c := range []struct {
		name                   string
		bounds                 []Bounds
		available              int
		slots, declared, least int
	}{
		{"all slots there", []Bounds{src4, op4, sink1}, 4, 4, 4, 2},
		{"more than declared", []Bounds{src4, op4, sink1}, 9, 4, 4, 2},
		{"a host lost: 2 of 4", []Bounds{src4, op4, sink1}, 2, 2, 4, 2},
		{"3 of 4", []Bounds{src4, op4, sink1}, 3, 3, 4, 2},
		{"below the min: waits", []Bounds{src4, op4, sink1}, 1, 0, 4, 2},
		{"no min declared: 1", []Bounds{src4, sink1}, 1, 1, 4, 1},
		{"nothing free", []Bounds{src4, sink1}, 0, 0, 4, 1},
		{"a min above its declared counts as declared", []Bounds{{Declared: 2, Min: 5}, src4}, 2, 2, 4, 2},
	} {
		slots, declared, least := AdaptiveSlots(c.bounds, c.available)
		if slots != c.slots || declared != c.declared || least != c.least {
			t.Errorf("%s: AdaptiveSlots(%v, %d) = %d, %d, %d; want %d, %d, %d", c.name, c.bounds, c.available, slots, declared, least, c.slots, c.declared, c.least)
		}
	}
	if p := ScaledParallelism(sink1, 2); p != 1 {
		t.Errorf("a sink at 1 on 2 slots: %d, want 1", p)
	}
	if p := ScaledParallelism(src4, 2); p != 2 {
		t.Errorf("a source at 4 on 2 slots: %d, want 2", p)
	}
}

// TestAdaptiveSlotsRandom checks AdaptiveSlots against a naive search: the
// most slots, at most those available, at which every vertex runs at
// min(declared, slots) and at least its minimum; and that vertices of equal
// declared parallelism (forward edges) stay equal.
func TestAdaptiveSlotsRandom(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for iter := 0; iter < 5000; iter++ {
		bounds := make([]Bounds, 1+r.Intn(5))
		for i := range bounds {
			d := 1 + r.Intn(8)
			bounds[i] = Bounds{Declared: d, Min: r.Intn(d + 1)}
		}
		available := r.Intn(10)
		want := 0
		for s := available; s >= 1 && want == 0; s-- {
			ok, used := true, 0
			for _, b := range bounds {
				p := min(b.Declared, s)
				ok = ok && p >= max(b.Min, 1)
				used = max(used, p)
			}
			if ok {
				want = used
			}
		}
		got, _, _ := AdaptiveSlots(bounds, available)
		if got != want {
			t.Fatalf("AdaptiveSlots(%v, %d) = %d, the naive search says %d", bounds, available, got, want)
		}
		for _, a := range bounds {
			for _, b := range bounds {
				if a.Declared == b.Declared && got > 0 && ScaledParallelism(a, got) != ScaledParallelism(b, got) {
					t.Fatalf("equal declared parallelism scaled apart: %v, %v on %d slots", a, b, got)
				}
			}
		}
	}
}
