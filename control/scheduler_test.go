package control

import (
	"errors"
	"math/rand"
	"slices"
	"testing"
)

func TestScheduleSingleHost(t *testing.T) {
	hosts := []HostSlots{{ID: "b", Capacity: 4, Free: 2}, {ID: "a", Capacity: 4, Free: 3}, {ID: "c", Capacity: 4, Free: 3}}
	p, err := Schedule(hosts, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Slots, []string{"a", "a", "a"}) {
		t.Fatalf("most free, ties by id: got %v", p.Slots)
	}
	if !p.SingleHost() || p.Host(2) != "a" || p.Host(3) != "" {
		t.Fatalf("placement accessors wrong: %v", p)
	}

	_, err = Schedule(hosts, 4, true)
	if !errors.Is(err, ErrNotEnoughSlots) {
		t.Fatalf("4 slots, capacity 4 but 3 free: want ErrNotEnoughSlots, got %v", err)
	}
	_, err = Schedule(hosts, 5, true)
	if !errors.Is(err, ErrNoHostLargeEnough) {
		t.Fatalf("5 slots, capacity 4: want ErrNoHostLargeEnough, got %v", err)
	}
	_, err = Schedule(nil, 1, true)
	if !errors.Is(err, ErrNotEnoughSlots) {
		t.Fatalf("no hosts: want ErrNotEnoughSlots, got %v", err)
	}
	if _, err := Schedule(hosts, 0, true); err == nil {
		t.Fatal("need 0: want an error")
	}
}

func TestScheduleSpread(t *testing.T) {
	hosts := []HostSlots{{ID: "b", Capacity: 2, Free: 2}, {ID: "a", Capacity: 2, Free: 2}, {ID: "c", Capacity: 2, Free: 1}}
	p, err := Schedule(hosts, 5, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Slots, []string{"a", "b", "c", "a", "b"}) {
		t.Fatalf("round robin, most free first: got %v", p.Slots)
	}
	if _, err := Schedule(hosts, 6, false); !errors.Is(err, ErrNotEnoughSlots) {
		t.Fatalf("6 of 5 free: want ErrNotEnoughSlots, got %v", err)
	}
}

// TestScheduleRandom checks the invariants on random clusters: no host gets
// more slots than it has free, the result is deterministic, and the scheduler
// fails only when a naive count says it must.
func TestScheduleRandom(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for iter := 0; iter < 2000; iter++ {
		n := r.Intn(5)
		var hosts []HostSlots
		for i := 0; i < n; i++ {
			c := r.Intn(5)
			hosts = append(hosts, HostSlots{ID: string(rune('a' + i)), Capacity: c, Free: r.Intn(c + 1)})
		}
		need := 1 + r.Intn(8)
		single := r.Intn(2) == 0
		p, err := Schedule(hosts, need, single)
		p2, err2 := Schedule(slices.Clone(hosts), need, single)
		if !slices.Equal(p.Slots, p2.Slots) || (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %v %v / %v %v", p, err, p2, err2)
		}
		maxFree, total := 0, 0
		for _, h := range hosts {
			maxFree = max(maxFree, h.Free)
			total += h.Free
		}
		fits := total >= need
		if single {
			fits = maxFree >= need
		}
		if fits != (err == nil) {
			t.Fatalf("hosts %v need %d single %v: fits=%v but err=%v", hosts, need, single, fits, err)
		}
		if err != nil {
			continue
		}
		if len(p.Slots) != need {
			t.Fatalf("got %d slots, want %d", len(p.Slots), need)
		}
		used := map[string]int{}
		for _, h := range p.Slots {
			used[h]++
		}
		for _, h := range hosts {
			if used[h.ID] > h.Free {
				t.Fatalf("host %v got %d slots: %v", h, used[h.ID], p.Slots)
			}
		}
		if single && !p.SingleHost() {
			t.Fatalf("single host asked, got %v", p.Slots)
		}
	}
}
