// Package core is the cluster controller as a pure state machine, as raft's
// RawNode is to node.run: the job table, the hosts and their slots,
// placement, and the leader lease and its term, stepped by events
// (heartbeats, a lost host, deploy and cancel requests, attempt reports,
// the results of its own IO, ticks) and returning actions (assign, cancel,
// persist, announce, reply, lease requests) for one loop to carry out in
// order. It has no clock, goroutine or IO: time is counted in ticks.
//
// Restarts and failovers are decided by each job's control.Lifecycle
// only: a lost host that ran an attempt is a failure of that attempt,
// reported to the lifecycle, whose restart strategy decides; the core only
// picks where, and at which parallelism (control.AdaptiveSlots), the
// attempt the lifecycle starts runs.
//
// Leadership (Lease, usable alone): a standby core takes the lease when it
// has not changed for Config.LeaseTTL ticks (AcquireLease with the next
// term); the leader renews it every LeaseRenew ticks and stops acting
// (Deposed) when it could not renew it for LeaseSelf ticks, which is less
// than LeaseTTL, so it has stopped before a standby takes over. Every Persist carries the term and
// the revision the leader last saw: a store result showing a record of a
// later term deposes it, one of an earlier term (a deposed leader's late
// write) is overwritten. A new leader loads the table, adopts the attempts
// whose placement the records name (their hosts' heartbeats confirm them;
// they are not restarted), rewrites every live record in its term, and
// places nothing until the hosts of adopted attempts reported or
// AdoptWait ticks passed. A core that is not the leader emits no Assign,
// CancelAttempt or Persist; a deposed core emits nothing more.
package core

import (
	"fmt"
	"slices"
	"sort"

	"github.com/streamd/streamd/control"
)

// Config configures a Core. Durations are ticks.
type Config struct {
	// ID names this controller in the lease.
	ID string
	// HeartbeatTimeout: a host silent for more ticks is lost; default 3.
	HeartbeatTimeout int64
	// LeaseRenew: the leader renews its lease every LeaseRenew ticks;
	// default 1.
	LeaseRenew int64
	// LeaseTTL: a standby takes the lease over when it has seen no renewal
	// for LeaseTTL ticks; default 3*LeaseRenew.
	LeaseTTL int64
	// LeaseSelf: the leader stops acting when it could not renew its lease
	// for LeaseSelf ticks; default 2*LeaseRenew; below LeaseTTL.
	LeaseSelf int64
	// AdoptWait: after taking the lead, how long at most placing waits for
	// the hosts of adopted attempts to report; default 2.
	AdoptWait int64
	// SlotWait: how long fewer slots than a job runs at must be free before
	// it runs on them, and more slots before it scales up; default 0.
	SlotWait int64
	// RescaleInterval: the least time between a job's rescales before it
	// scales up again; default 0.
	RescaleInterval int64
	// UnlistedAfter: heartbeats in a row that omit an attempt before its
	// slots there are free (an attempt the core canceled) or the host is
	// asked how it ended (the current attempt); default 2.
	UnlistedAfter int
}

func (c Config) withDefaults() (Config, error) {
	if c.ID == "" {
		return c, fmt.Errorf("core: the controller needs an id")
	}
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.HeartbeatTimeout, 3)
	def(&c.LeaseRenew, 1)
	def(&c.LeaseTTL, 3*c.LeaseRenew)
	def(&c.LeaseSelf, 2*c.LeaseRenew)
	def(&c.AdoptWait, 2)
	if c.UnlistedAfter == 0 {
		c.UnlistedAfter = 2
	}
	if c.HeartbeatTimeout < 1 || c.LeaseRenew < 1 || c.LeaseSelf < 1 || c.AdoptWait < 0 || c.SlotWait < 0 || c.RescaleInterval < 0 || c.UnlistedAfter < 1 {
		return c, fmt.Errorf("core: controller %s: timeouts must be positive ticks: %+v", c.ID, c)
	}
	if c.LeaseSelf >= c.LeaseTTL || c.LeaseRenew >= c.LeaseSelf {
		return c, fmt.Errorf("core: controller %s: want lease renew (%d) < self expiry (%d) < ttl (%d) ticks", c.ID, c.LeaseRenew, c.LeaseSelf, c.LeaseTTL)
	}
	return c, nil
}

type role int

const (
	standby role = iota
	leader
	deposed
)

// Core is the cluster controller's state machine. The loop that owns it is
// its only caller: it steps it with each event and carries out the returned
// actions in order (Assigns only after the Persist before them succeeded:
// the core itself holds them back until then).
type Core struct {
	cfg   Config
	now   int64
	term  uint64 // the term it leads (or led, once deposed)
	lease *Lease

	loading    bool  // waiting for TableLoaded
	adoptUntil int64 // no placing before, while awaiting is not empty
	awaiting   map[string]bool

	hosts map[string]*host
	jobs  map[string]*job
	order []string

	out []Action
}

// New returns a standby core. Step it with the lease as the loop read it
// (LeaseSeen; Rev 0: there is none) to let it try for the lead.
func New(cfg Config) (*Core, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Core{cfg: cfg, lease: &Lease{cfg: cfg}, hosts: map[string]*host{}, jobs: map[string]*job{}, awaiting: map[string]bool{}}, nil
}

// Term is the term this core leads, 0 when it does not.
func (c *Core) Term() uint64 { return c.lease.Term() }

// Deposed reports whether the core stopped for good.
func (c *Core) Deposed() bool { return c.lease.Deposed() }

// Now is the core's time in ticks.
func (c *Core) Now() int64 { return c.now }

func (c *Core) emit(a Action) { c.out = append(c.out, a) }

// acting reports whether the core leads and has its table.
func (c *Core) acting() bool { return c.lease.Term() != 0 && !c.loading }

// Step applies one event and returns the actions to carry out, in order.
func (c *Core) Step(ev Event) []Action {
	if c.Deposed() {
		return nil
	}
	c.out = nil
	switch e := ev.(type) {
	case Tick:
		c.tick()
	case Heartbeat:
		c.heartbeat(e)
	case HostLost:
		if h := c.hosts[e.Host]; h != nil && !h.lost {
			c.hostLost(h, e.Reason)
		}
	case LeaseSeen, LeaseResult:
		c.leaseActions(c.lease.Step(e))
	case Announced:
		if c.Term() != 0 && e.Term > c.term {
			c.depose(fmt.Sprintf("controller %s announced term %d, later than this one's %d", e.ID, e.Term, c.term))
		}
	case TableLoaded:
		if c.Term() != 0 && c.loading && e.Term == c.term {
			c.tableLoaded(e.Records)
		}
	case RecordSeen:
		c.recordSeen(e.Stored)
	case StoreResult:
		c.storeResult(e)
	case Deploy:
		c.deploy(e)
	case CancelJob:
		c.cancelJob(e)
	case AttemptReport:
		c.report(e)
	case AssignResult:
		c.assignResult(e)
	case CancelResult:
		c.release(e.Host, e.Ref)
	case JobTaskEvent:
		if j := c.jobs[e.Ref.Job]; j != nil && j.life != nil && c.acting() {
			j.step(c, e.Event)
		}
	}
	if c.Deposed() {
		return c.out
	}
	if c.acting() {
		c.schedule()
		c.flush()
	}
	out := c.out
	c.out = nil
	return out
}

func (c *Core) tick() {
	c.now++
	c.leaseActions(c.lease.Step(Tick{}))
	if !c.acting() {
		return
	}
	// The lifecycles' clocks first: a failure found in this tick counts
	// from it.
	for _, id := range c.order {
		if j := c.jobs[id]; j.life != nil && !j.life.Ended() {
			j.step(c, control.Tick{})
		}
	}
	for _, id := range c.hostIDs() {
		if h := c.hosts[id]; !h.lost && c.now-h.lastSeen > c.cfg.HeartbeatTimeout {
			c.hostLost(h, fmt.Sprintf("host %s lost (no heartbeat for %d ticks)", id, c.now-h.lastSeen))
		}
	}
	c.scaleUp()
}

// ---- the lease ----

// leaseActions takes the lease's actions: its requests go out; once
// elected the core loads the table (then announces its term); deposed, it
// stops.
func (c *Core) leaseActions(acts []Action) {
	for _, a := range acts {
		switch x := a.(type) {
		case Elected:
			c.term, c.loading = x.Term, true
			c.emit(LoadTable{Term: x.Term})
		case Deposed:
			c.out = []Action{x}
			return
		default:
			c.emit(a)
		}
	}
}

// depose stops the core for good: the actions of this step are dropped.
func (c *Core) depose(reason string) {
	c.out = []Action{c.lease.Depose(reason)}
}

// ---- hosts ----

type host struct {
	id       string
	slots    int
	lastSeen int64
	lost     bool
	holds    map[AttemptRef]*hold
	canceled map[AttemptRef]int64 // stale attempts it was told to cancel, when
	refused  int64                // it refused an assignment: no placing there before this tick
}

// hold is one attempt's hold on a host's slots, from its placement until
// the host confirmed its end, stopped listing it, or was lost.
type hold struct {
	slots    int
	settled  bool // the assignment was answered (or adopted)
	unlisted int  // heartbeats in a row that omitted it, once settled
}

func (c *Core) hostIDs() []string {
	ids := make([]string, 0, len(c.hosts))
	for id := range c.hosts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (c *Core) heartbeat(e Heartbeat) {
	if e.Slots < 1 {
		return
	}
	h := c.hosts[e.Host]
	if h == nil {
		h = &host{id: e.Host, holds: map[AttemptRef]*hold{}, canceled: map[AttemptRef]int64{}}
		c.hosts[e.Host] = h
	}
	h.slots, h.lastSeen, h.lost = e.Slots, c.now, false
	if !c.acting() {
		return
	}
	delete(c.awaiting, e.Host)
	listed := map[AttemptRef]bool{}
	for _, r := range e.Running {
		listed[r] = true
	}
	for _, ref := range sortedRefs(h.holds) {
		hd := h.holds[ref]
		if listed[ref] || !hd.settled {
			hd.unlisted = 0
			continue
		}
		if hd.unlisted++; hd.unlisted < c.cfg.UnlistedAfter {
			continue
		}
		if j := c.jobs[ref.Job]; j != nil && j.placedHere(ref, h.id) {
			// Its end report was lost: ask for it (again once a heartbeat
			// timeout passed without an answer).
			if p := j.parts[h.id]; !p.asked || c.now-p.askedAt > c.cfg.HeartbeatTimeout {
				p.asked, p.askedAt = true, c.now
				c.emit(AskOutcome{Ref: ref, Term: c.term, Host: h.id})
			}
			continue
		}
		delete(h.holds, ref)
	}
	for _, ref := range e.Running {
		if h.holds[ref] != nil {
			continue
		}
		if j := c.jobs[ref.Job]; j != nil && j.placedHere(ref, h.id) {
			h.holds[ref] = &hold{slots: j.slotsOn(h.id), settled: true}
			continue
		}
		// An attempt the core does not want there: it holds the host
		// until it is gone.
		h.holds[ref] = &hold{slots: h.slots, settled: true}
		c.cancelStale(h, ref)
	}
	// A stale attempt it still lists: told again once a heartbeat timeout
	// passed (the cancel or its answer may have been lost).
	for _, ref := range sortedRefs(h.canceled) {
		if listed[ref] {
			c.cancelStale(h, ref)
		}
	}
}

func (c *Core) cancelStale(h *host, ref AttemptRef) {
	if at, ok := h.canceled[ref]; ok && c.now-at <= c.cfg.HeartbeatTimeout {
		return
	}
	h.canceled[ref] = c.now
	c.emit(CancelAttempt{Ref: ref, Term: c.term, Host: h.id, Reason: "stale attempt"})
}

// hostLost: every attempt with a part on h failed; the lifecycles decide.
func (c *Core) hostLost(h *host, reason string) {
	h.lost = true
	h.holds = map[AttemptRef]*hold{}
	if !c.acting() {
		return
	}
	for _, id := range c.order {
		j := c.jobs[id]
		if p := j.parts[h.id]; p != nil && !p.ended {
			p.ended, p.lost = true, true
			j.step(c, control.AttemptFailed{Attempt: j.attempt, Reason: reason, Class: control.FailureRestartable})
		}
	}
}

// release frees the slots attempt ref holds on host id.
func (c *Core) release(id string, ref AttemptRef) {
	if h := c.hosts[id]; h != nil {
		delete(h.holds, ref)
		delete(h.canceled, ref)
	}
}

// free is the slots of alive hosts no attempt holds.
func (c *Core) free() []control.HostSlots {
	var out []control.HostSlots
	for _, id := range c.hostIDs() {
		h := c.hosts[id]
		if h.lost || h.refused > c.now {
			continue
		}
		used := 0
		for _, hd := range h.holds {
			used += hd.slots
		}
		out = append(out, control.HostSlots{ID: id, Capacity: h.slots, Free: max(h.slots-used, 0)})
	}
	return out
}

func totalFree(free []control.HostSlots) int {
	n := 0
	for _, h := range free {
		n += h.Free
	}
	return n
}

func sortedRefs[V any](m map[AttemptRef]V) []AttemptRef {
	out := make([]AttemptRef, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b AttemptRef) int {
		if a.Job != b.Job {
			if a.Job < b.Job {
				return -1
			}
			return 1
		}
		return a.Attempt - b.Attempt
	})
	return out
}
