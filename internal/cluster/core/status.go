package core

import (
	"slices"

	"github.com/streamd/streamd/control"
)

// JobStatus is what the core knows of a job, for status and lists.
type JobStatus struct {
	Job    string
	State  control.JobState
	Reason string
	// Slots is the parallelism it runs (or is to run) at, Declared the
	// one it declares.
	Slots, Declared int
	Attempt         int
	Placement       []string // of the current attempt; nil: not placed
	Restarts        int
	Latest          *control.RestorePoint
}

// HostStatus is what the core knows of a host.
type HostStatus struct {
	ID          string
	Slots, Free int
	Lost        bool
}

// Jobs is the status of every job, in deploy order.
func (c *Core) Jobs() []JobStatus {
	out := make([]JobStatus, 0, len(c.order))
	for _, id := range c.order {
		j := c.jobs[id]
		st := JobStatus{Job: id, State: j.jobState(), Reason: j.reason, Slots: j.slots, Declared: control.SlotsNeeded(j.spec.Graph),
			Attempt: j.attempt, Placement: slices.Clone(j.placement)}
		if j.life != nil {
			st.Restarts, st.Latest = j.life.Restarts(), j.life.Latest()
		}
		out = append(out, st)
	}
	return out
}

// Hosts is the status of every host, by id.
func (c *Core) Hosts() []HostStatus {
	free := map[string]int{}
	for _, f := range c.free() {
		free[f.ID] = f.Free
	}
	var out []HostStatus
	for _, id := range c.hostIDs() {
		h := c.hosts[id]
		out = append(out, HostStatus{ID: id, Slots: h.slots, Free: free[id], Lost: h.lost})
	}
	return out
}
