package core

import (
	"flag"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/scripttest"
)

// Scripts: testdata/*.txt drive controllers (cores), hosts and a store,
// all simulated here without clocks or goroutines. Each case is a command
// line, "----" and the expected output up to the next blank line; lines
// starting with '#' between cases are comments. `go test ./internal/cluster/core
// -rewrite` regenerates the outputs after a deliberate change (read the diff).
//
// Commands:
//
//	controllers c1 [c2...] [show-renewals] [hb-timeout=N] [ttl=N] [self=N] [renew=N] [adopt-wait=N] [slot-wait=N] [rescale-interval=N]
//	host h1 slots=N                 a host (again) alive, heartbeating every tick
//	lose-host h1                    the host dies: no heartbeats, its attempts gone
//	silence h1                      the host is cut off (no heartbeats, no answers), its attempts run on;
//	                                `host` brings it back with them
//	deploy j1 p=N [min=N] [cp=N] [restart=KIND ...] [to=c1]
//	                                a job src(p, min) -forward-> sink(p, min); cp: checkpoint interval
//	cancel j1 [to=c1]
//	tick [N] [only]                 N times: every alive host heartbeats to every running core, each
//	                                core ticks, and (unless only) the IO is carried out (stabilize)
//	deliver [c1]                    carry out the actions queued so far (of c1 only)
//	stabilize                       deliver until nothing is queued
//	pause c1 | resume c1            c1 gets no ticks, events or deliveries (a long GC pause)
//	cut c1 | heal c1                c1's IO is held back (it still ticks)
//	fail h1 j1#N [reason=TEXT]      the host reports its part of the attempt failed
//	end h1 j1#N                     the host reports its part of the attempt ended
//	store-down | store-up           job writes fail (the store cannot be reached) or work again
//	status [c1]                     the core's jobs and hosts
//	store                           the records and the lease in the store
//
// Output: the actions each core returned, "c1: action", in order; "ok"
// when there are none.

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the scripts in testdata/")

func TestScripts(t *testing.T) {
	scripttest.Run(t, "testdata/*.txt", *rewrite, func(t *testing.T) func([]string) []string {
		s := newSim(t)
		return func(input []string) []string { return s.run(strings.Fields(input[0])) }
	})
}

func newSim(t *testing.T) *sim {
	return &sim{t: t, hosts: map[string]*simHost{}, store: simStore{recs: map[string]Stored{}}, ckpt: map[string]bool{}}
}

type sim struct {
	t     *testing.T
	cores []*simCore
	hosts map[string]*simHost
	store simStore
	ckpt  map[string]bool // jobs that checkpoint: their hosts report subtask events
	reqs  int
	out   []string
	// assigned: every assignment a host took, to check that an attempt
	// number is never used twice.
	assigned map[AttemptRef]Assign
	// showRenewals: print the leader's RenewLease actions (else they are
	// carried out without a word).
	showRenewals bool
}

type simCore struct {
	name   string
	c      *Core
	queue  []Action
	paused bool
	cut    bool
}

type simHost struct {
	id      string
	slots   int
	alive   bool
	silent  bool   // cut off: no heartbeats, no answers; its attempts run on
	term    uint64 // the newest term announced
	running map[AttemptRef]Assign
}

type simStore struct {
	rev      uint64 // the store's last revision
	holder   string
	term     uint64
	leaseRev uint64
	recs     map[string]Stored
	down     bool // job writes fail: the store cannot be reached
}

func (s *sim) core(name string) *simCore {
	for _, c := range s.cores {
		if c.name == name {
			return c
		}
	}
	s.t.Fatalf("no controller %q", name)
	return nil
}

func (s *sim) host(name string) *simHost {
	h := s.hosts[name]
	if h == nil {
		s.t.Fatalf("no host %q", name)
	}
	return h
}

// step steps core sc with ev if it runs, printing and queueing its actions.
func (s *sim) step(sc *simCore, ev Event) {
	if sc.paused {
		return
	}
	for _, a := range sc.c.Step(ev) {
		s.checkTerm(sc, a)
		if _, renew := a.(RenewLease); !renew || s.showRenewals {
			s.out = append(s.out, sc.name+": "+a.String())
		}
		sc.queue = append(sc.queue, a)
	}
}

// checkTerm checks that only a leader acts on hosts and the store, in its
// own term.
func (s *sim) checkTerm(sc *simCore, a Action) {
	var term uint64
	switch x := a.(type) {
	case Assign:
		term = x.Term
	case CancelAttempt:
		term = x.Term
	case AskOutcome:
		term = x.Term
	case Persist:
		term = x.Record.Term
	default:
		return
	}
	if t := sc.c.Term(); t == 0 || t != term {
		s.t.Errorf("%s (term %d) emitted %s of term %d", sc.name, t, a, term)
	}
}

// leader is the core a request goes to: to=NAME, else the one that leads
// (the first one if none does).
func (s *sim) leader(args []string) *simCore {
	if n := kv(args, "to", ""); n != "" {
		return s.core(n)
	}
	for _, c := range s.cores {
		if c.c.Term() != 0 && !c.paused {
			return c
		}
	}
	return s.cores[0]
}

func (s *sim) run(f []string) []string {
	s.out = nil
	cmd, args := f[0], f[1:]
	switch cmd {
	case "controllers":
		cfg := Config{HeartbeatTimeout: s.num(args, "hb-timeout", 3), LeaseRenew: s.num(args, "renew", 1), LeaseTTL: s.num(args, "ttl", 3),
			LeaseSelf: s.num(args, "self", 2), AdoptWait: s.num(args, "adopt-wait", 2), SlotWait: s.num(args, "slot-wait", 0),
			RescaleInterval: s.num(args, "rescale-interval", 0)}
		s.showRenewals = slices.Contains(args, "show-renewals")
		for _, n := range positional(args) {
			if n == "show-renewals" {
				continue
			}
			cfg.ID = n
			c, err := New(cfg)
			if err != nil {
				return []string{"error: " + err.Error()}
			}
			sc := &simCore{name: n, c: c}
			s.cores = append(s.cores, sc)
			s.step(sc, s.leaseSeen())
		}
	case "host":
		n := positional(args)[0]
		h := s.hosts[n]
		if h == nil {
			h = &simHost{id: n}
			s.hosts[n] = h
		}
		if !h.alive {
			h.running = map[AttemptRef]Assign{} // (again) from scratch
		}
		h.slots, h.alive, h.silent = int(s.num(args, "slots", 1)), true, false
	case "silence":
		s.host(positional(args)[0]).silent = true
	case "lose-host":
		h := s.host(positional(args)[0])
		h.alive, h.running = false, nil
	case "deploy":
		s.deploy(args)
	case "cancel":
		s.reqs++
		s.step(s.leader(args), CancelJob{Request: fmt.Sprintf("r%d", s.reqs), Job: positional(args)[0]})
	case "tick":
		n := 1
		for _, p := range positional(args) {
			if p != "only" {
				n, _ = strconv.Atoi(p)
			}
		}
		for range n {
			for _, hn := range sortedKeys(s.hosts) {
				h := s.hosts[hn]
				if !h.up() {
					continue
				}
				hb := Heartbeat{Host: hn, Slots: h.slots, Running: sortedRefs(h.running)}
				for _, c := range s.cores {
					s.step(c, hb)
				}
			}
			for _, c := range s.cores {
				s.step(c, Tick{})
			}
			if !slices.Contains(args, "only") {
				s.stabilize()
			}
		}
	case "deliver":
		s.deliver(positional(args))
	case "stabilize":
		s.stabilize()
	case "pause", "resume":
		s.core(positional(args)[0]).paused = cmd == "pause"
	case "cut", "heal":
		s.core(positional(args)[0]).cut = cmd == "cut"
	case "end":
		p := positional(args)
		ref := s.ref(p[1])
		h := s.host(p[0])
		delete(h.running, ref)
		s.toLeader(AttemptReport{Ref: ref, Host: h.id, Ended: true})
	case "store-down", "store-up":
		s.store.down = cmd == "store-down"
	case "fail":
		p := positional(args)
		ref := s.ref(p[1])
		h := s.host(p[0])
		delete(h.running, ref)
		s.toLeader(AttemptReport{Ref: ref, Host: h.id, Failed: kv(args, "reason", "trap")})
	case "status":
		return s.status(s.leader(args))
	case "store":
		out := []string{fmt.Sprintf("lease %s term=%d rev=%d", s.store.holder, s.store.term, s.store.leaseRev)}
		for _, k := range sortedKeys(s.store.recs) {
			r := s.store.recs[k]
			out = append(out, fmt.Sprintf("rev=%d %s", r.Rev, r.Record))
		}
		return out
	default:
		return []string{fmt.Sprintf("error: unknown command %q", cmd)}
	}
	return s.out
}

func (s *sim) deploy(args []string) {
	id := positional(args)[0]
	p, m := int(s.num(args, "p", 1)), int(s.num(args, "min", 0))
	g, err := control.NewJobGraph(id, []*control.Vertex{
		{UID: "src", Parallelism: p, MinParallelism: m},
		{UID: "sink", Parallelism: p, MinParallelism: m, Inputs: []control.Edge{{From: "src", Partition: control.Forward}}},
	})
	if err != nil {
		s.t.Fatal(err)
	}
	spec := JobSpec{ID: id, Graph: g, Seed: 1, Restart: control.RestartConfig{Kind: control.RestartKind(kv(args, "restart", string(control.RestartFixedDelay))),
		Attempts: int(s.num(args, "attempts", 3)), Delay: s.num(args, "delay", 0)}}
	if cp := s.num(args, "cp", 0); cp > 0 {
		cc := control.DefaultConfig()
		cc.IntervalTicks = cp
		spec.Checkpoint = &cc
		s.ckpt[id] = true
	}
	s.reqs++
	s.step(s.leader(args), Deploy{Request: fmt.Sprintf("r%d", s.reqs), Spec: spec})
}

// stabilize delivers until nothing is queued.
func (s *sim) stabilize() {
	for i := 0; s.deliver(nil); i++ {
		if i == 100 {
			s.t.Fatal("stabilize: still actions after 100 rounds")
		}
	}
}

// toLeader steps every running core that leads with ev.
func (s *sim) toLeader(ev Event) {
	for _, c := range s.cores {
		if c.c.Term() != 0 {
			s.step(c, ev)
		}
	}
}

// deliver carries out the actions queued so far (of the named cores, or of
// all that are neither paused nor cut), feeding the results back; it
// reports whether there were any.
func (s *sim) deliver(names []string) bool {
	any := false
	for _, c := range s.cores {
		if c.paused || c.cut || (len(names) > 0 && !slices.Contains(names, c.name)) {
			continue
		}
		q := c.queue
		c.queue = nil
		for _, a := range q {
			any = true
			s.do(c, a)
		}
	}
	return any
}

func (s *sim) leaseSeen() LeaseSeen {
	return LeaseSeen{Holder: s.store.holder, Term: s.store.term, Rev: s.store.leaseRev}
}

// do carries out action a of core c.
func (s *sim) do(c *simCore, a Action) {
	st := &s.store
	others := func(ev Event) {
		for _, o := range s.cores {
			if o != c {
				s.step(o, ev)
			}
		}
	}
	switch x := a.(type) {
	case AcquireLease, RenewLease:
		id, term, rev := leaseReq(x)
		if st.leaseRev != rev {
			s.step(c, LeaseResult{Term: term, Rev: st.leaseRev, Holder: st.holder, Held: st.term})
			return
		}
		st.rev++
		st.holder, st.term, st.leaseRev = id, term, st.rev
		s.step(c, LeaseResult{Term: term, OK: true, Rev: st.rev})
		others(s.leaseSeen())
	case LoadTable:
		var recs []Stored
		for _, k := range sortedKeys(st.recs) {
			recs = append(recs, st.recs[k])
		}
		s.step(c, TableLoaded{Term: x.Term, Records: recs})
	case Persist:
		if st.down {
			s.step(c, StoreResult{Job: x.Record.Job, Ver: x.Ver, Err: "no responders"})
			return
		}
		cur, ok := st.recs[x.Record.Job]
		if (ok && cur.Rev != x.Rev) || (!ok && x.Rev != 0) {
			s.step(c, StoreResult{Job: x.Record.Job, Ver: x.Ver, Rev: cur.Rev, Term: cur.Record.Term})
			return
		}
		if ok && x.Record.Term < cur.Record.Term {
			s.t.Errorf("%s wrote %s (term %d) over a record of term %d", c.name, x.Record.Job, x.Record.Term, cur.Record.Term)
		}
		st.rev++
		st.recs[x.Record.Job] = Stored{Record: x.Record, Rev: st.rev}
		s.step(c, StoreResult{Job: x.Record.Job, Ver: x.Ver, OK: true, Rev: st.rev})
		others(RecordSeen{st.recs[x.Record.Job]})
	case Announce:
		for _, hn := range sortedKeys(s.hosts) {
			h := s.hosts[hn]
			if !h.up() || x.Term <= h.term {
				continue
			}
			h.term = x.Term
			for _, ref := range sortedRefs(h.running) {
				s.running(c, h, h.running[ref]) // their state again, to the new leader
			}
		}
		others(Announced{ID: x.ID, Term: x.Term})
	case Assign:
		h := s.host(x.Host)
		switch {
		case !h.up():
			s.step(c, AssignResult{Ref: x.Ref, Host: h.id, Err: "no answer"})
		case x.Term < h.term:
			s.step(c, AssignResult{Ref: x.Ref, Host: h.id, Err: fmt.Sprintf("term %d is older than %d", x.Term, h.term)})
		default:
			h.term = x.Term
			h.running[x.Ref] = x
			if s.assigned == nil {
				s.assigned = map[AttemptRef]Assign{}
			}
			if prev, ok := s.assigned[x.Ref]; ok && (prev.Term != x.Term || !slices.Equal(prev.Placement, x.Placement)) {
				s.t.Errorf("attempt %s assigned twice: in term %d on %v, in term %d on %v", x.Ref, prev.Term, prev.Placement, x.Term, x.Placement)
			}
			s.assigned[x.Ref] = x
			s.step(c, AssignResult{Ref: x.Ref, Host: h.id})
			s.running(c, h, x)
		}
	case CancelAttempt:
		if h := s.host(x.Host); h.up() && x.Term >= h.term {
			delete(h.running, x.Ref)
			s.step(c, CancelResult{Ref: x.Ref, Host: h.id})
		}
	case AskOutcome:
		if h := s.host(x.Host); h.up() {
			if _, ok := h.running[x.Ref]; !ok {
				s.step(c, AttemptReport{Ref: x.Ref, Host: h.id, Failed: "the host does not know the attempt"})
			}
		}
	case JobAction:
		switch y := x.Action.(type) {
		case control.TriggerCheckpoint:
			for _, id := range y.Wait {
				s.step(c, AttemptReport{Ref: x.Ref, Host: "-", Task: control.Ack{CheckpointID: y.ID, Subtask: id, StateRef: fmt.Sprintf("cp%d-%s", y.ID, id), Size: 1}})
			}
		case control.PersistMetadata:
			s.step(c, JobTaskEvent{Ref: x.Ref, Event: control.Persisted{CheckpointID: y.ID, Location: fmt.Sprintf("cp-%d", y.ID)}})
		}
	}
}

// running: host h runs its part of attempt x; with checkpoints its subtasks
// report TaskRunning to core c.
func (s *sim) running(c *simCore, h *simHost, x Assign) {
	if !s.ckpt[x.Ref.Job] {
		return
	}
	for _, id := range control.Subtasks(x.Graph) {
		if slices.Contains(x.Slots, id.Index) {
			s.step(c, AttemptReport{Ref: x.Ref, Host: h.id, Task: control.TaskRunning{Subtask: id}})
		}
	}
}

func (h *simHost) up() bool { return h.alive && !h.silent }

func leaseReq(a Action) (string, uint64, uint64) {
	if x, ok := a.(AcquireLease); ok {
		return x.ID, x.Term, x.Rev
	}
	x := a.(RenewLease)
	return x.ID, x.Term, x.Rev
}

func (s *sim) status(sc *simCore) []string {
	c := sc.c
	out := []string{fmt.Sprintf("%s term=%d tick=%d", sc.name, c.Term(), c.Now())}
	for _, j := range c.Jobs() {
		l := fmt.Sprintf("job %s %s p=%d/%d attempt=%d", j.Job, j.State, j.Slots, j.Declared, j.Attempt)
		if j.Placement != nil {
			l += " on=" + strings.Join(j.Placement, ",")
		}
		l += fmt.Sprintf(" restarts=%d", j.Restarts)
		if j.Latest != nil {
			l += " latest=" + j.Latest.String()
		}
		out = append(out, l)
	}
	for _, h := range c.Hosts() {
		if h.Lost {
			out = append(out, fmt.Sprintf("host %s lost", h.ID))
		} else {
			out = append(out, fmt.Sprintf("host %s free=%d/%d", h.ID, h.Free, h.Slots))
		}
	}
	return out
}

func (s *sim) ref(w string) AttemptRef {
	job, n, ok := strings.Cut(w, "#")
	a, err := strconv.Atoi(n)
	if !ok || err != nil {
		s.t.Fatalf("attempt %q: want job#N", w)
	}
	return AttemptRef{Job: job, Attempt: a}
}

func (s *sim) num(args []string, key string, def int64) int64 {
	v := kv(args, key, "")
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		s.t.Fatalf("%s=%q: not a number", key, v)
	}
	return n
}

func kv(args []string, key, def string) string {
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok && k == key {
			return v
		}
	}
	return def
}

func positional(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.Contains(a, "=") {
			out = append(out, a)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
