package control

import (
	"errors"
	"fmt"
	"sort"
)

// Slot scheduling (pure). A job runs in slot-sharing groups as in Flink: slot
// i holds subtask i of every operator whose parallelism is larger than i, so
// a job needs as many slots as its largest parallelism (SlotsNeeded). A host
// offers a number of slots; the scheduler picks, for each of the job's slots,
// the host that runs it.

// HostSlots is what the scheduler knows of one host.
type HostSlots struct {
	ID       string
	Capacity int // slots the host offers
	Free     int // slots not in use by other jobs
}

// Placement maps each slot of a job to a host: Slots[i] runs subtask i of
// every operator with parallelism > i.
type Placement struct {
	Slots []string
}

// Host returns the host that runs subtask i of an operator.
func (p Placement) Host(subtask int) string {
	if subtask < 0 || subtask >= len(p.Slots) {
		return ""
	}
	return p.Slots[subtask]
}

// Hosts returns the distinct hosts of p, sorted.
func (p Placement) Hosts() []string {
	seen := map[string]bool{}
	var out []string
	for _, h := range p.Slots {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out
}

// SingleHost reports whether every slot is on one host.
func (p Placement) SingleHost() bool { return len(p.Hosts()) == 1 }

// SlotsNeeded is the number of slots job g needs: its largest parallelism.
func SlotsNeeded(g *JobGraph) int {
	n := 0
	for _, v := range g.Vertices {
		n = max(n, v.Parallelism)
	}
	return n
}

// Scheduling errors (matched with errors.Is).
var (
	// ErrNotEnoughSlots: fewer free slots than needed right now; the job may
	// wait for slots to free up.
	ErrNotEnoughSlots = errors.New("control: not enough free slots")
	// ErrNoHostLargeEnough: no single host has enough slots in total, so the
	// job can only run spread over several hosts.
	ErrNoHostLargeEnough = errors.New("control: no host has enough slots for the whole job")
)

// Schedule places a job that needs `need` slots onto hosts. It is
// deterministic: the result depends only on its arguments.
//
// With singleHost (what the runtime supports today) the whole job goes to the
// host with the most free slots (ties: smallest id) if it fits there. If no
// host has enough free slots but one has enough capacity the error wraps
// ErrNotEnoughSlots (wait); if no host is large enough, ErrNoHostLargeEnough.
//
// Without singleHost the job still goes to one host when one fits (fewer
// remote channels); otherwise slots are spread round robin over the hosts with
// free slots, most free first, and the error wraps ErrNotEnoughSlots when the
// free slots of all hosts together are too few.
func Schedule(hosts []HostSlots, need int, singleHost bool) (Placement, error) {
	if need < 1 {
		return Placement{}, fmt.Errorf("control: schedule: a job needs at least 1 slot, got %d", need)
	}
	hs := make([]HostSlots, 0, len(hosts))
	for _, h := range hosts {
		if h.Free > 0 || h.Capacity > 0 {
			hs = append(hs, h)
		}
	}
	sort.Slice(hs, func(i, j int) bool {
		if hs[i].Free != hs[j].Free {
			return hs[i].Free > hs[j].Free
		}
		return hs[i].ID < hs[j].ID
	})
	if len(hs) == 0 {
		return Placement{}, fmt.Errorf("%w: the job needs %d, no host is registered", ErrNotEnoughSlots, need)
	}
	if hs[0].Free >= need {
		p := Placement{Slots: make([]string, need)}
		for i := range p.Slots {
			p.Slots[i] = hs[0].ID
		}
		return p, nil
	}
	if singleHost {
		largest := hs[0]
		for _, h := range hs {
			if h.Capacity > largest.Capacity || (h.Capacity == largest.Capacity && h.ID < largest.ID) {
				largest = h
			}
		}
		if largest.Capacity < need {
			return Placement{}, fmt.Errorf("%w: the job needs %d slots, the largest host %q has %d", ErrNoHostLargeEnough, need, largest.ID, largest.Capacity)
		}
		return Placement{}, fmt.Errorf("%w: the job needs %d slots on one host, host %q has the most free (%d)", ErrNotEnoughSlots, need, hs[0].ID, hs[0].Free)
	}
	total := 0
	for _, h := range hs {
		total += max(h.Free, 0)
	}
	if total < need {
		return Placement{}, fmt.Errorf("%w: the job needs %d, %d free on %d host(s)", ErrNotEnoughSlots, need, total, len(hs))
	}
	free := make([]int, len(hs))
	for i, h := range hs {
		free[i] = max(h.Free, 0)
	}
	p := Placement{Slots: make([]string, 0, need)}
	for len(p.Slots) < need {
		for i := range hs {
			if free[i] > 0 && len(p.Slots) < need {
				free[i]--
				p.Slots = append(p.Slots, hs[i].ID)
			}
		}
	}
	return p, nil
}
