package control

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// simTask is the simulated runtime's view of one subtask.
type simTask struct {
	deployed, eod, drain, finished bool
	mayClose                       bool // notified of a checkpoint it acked after end of data
}

type simCheckpoint struct {
	wait       []SubtaskID
	finished   map[SubtaskID]bool // finished at plan time
	acked      map[SubtaskID]bool
	afterEOD   map[SubtaskID]bool
	persisting bool
}

// sim is a well-behaved driver and runtime around a Coordinator: barriers
// flow downstream (a subtask acks after its running upstream subtasks did),
// end of data flows downstream, and a subtask closes only after it was
// notified of a checkpoint it took after its end of data and all its
// upstream subtasks closed. It checks the coordinator's promises on every
// action.
type sim struct {
	t       *testing.T
	r       *rand.Rand
	g       *JobGraph
	c       *Coordinator
	cfg     Config
	tasks   map[SubtaskID]*simTask
	ups     map[SubtaskID][]SubtaskID // subtask-level upstream channels
	cps     map[int64]*simCheckpoint
	lastID  int64
	done    bool
	stopped bool // a stop is in progress
	log     []string
}

func newSim(t *testing.T, r *rand.Rand) *sim {
	g := randomGraph(t, r)
	cfg := Config{
		IntervalTicks:              int64(1 + r.IntN(5)),
		TimeoutTicks:               int64(r.IntN(12)),
		MaxConcurrent:              1 + r.IntN(3),
		MinPauseTicks:              int64(r.IntN(3)),
		TolerableFailures:          r.IntN(4) - 1,
		FinalCheckpointImmediately: r.IntN(3) != 0,
	}
	c, err := NewCoordinator(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, r: r, g: g, c: c, cfg: cfg, tasks: map[SubtaskID]*simTask{}, ups: map[SubtaskID][]SubtaskID{}, cps: map[int64]*simCheckpoint{}}
	for _, id := range Subtasks(g) {
		s.tasks[id] = &simTask{}
	}
	for _, e := range subtaskEdges(g) {
		s.ups[e[1]] = append(s.ups[e[1]], e[0])
	}
	return s
}

func (s *sim) fatalf(format string, a ...any) {
	s.t.Helper()
	n := max(0, len(s.log)-40)
	s.t.Fatalf("graph %s config %+v\n...%v\n%s", describeGraph(s.g), s.cfg, s.log[n:], fmt.Sprintf(format, a...))
}

func (s *sim) step(ev Event) {
	s.t.Helper()
	s.log = append(s.log, "\n> "+ev.String())
	if err := s.c.Step(ev); err != nil {
		s.fatalf("Step(%v): %v", ev, err)
	}
	actions := s.c.Ready()
	s.c.Advance()
	var follow []Event
	for _, a := range actions {
		s.log = append(s.log, "\n  "+a.String())
		follow = append(follow, s.act(a)...)
	}
	for _, ev := range follow {
		s.step(ev)
	}
}

// act carries out an action and checks it. It returns the events the
// runtime reports in consequence.
func (s *sim) act(a Action) (follow []Event) {
	switch a := a.(type) {
	case StopSources:
		for _, id := range a.Tasks {
			if !s.g.Vertex(id.Operator).IsSource() || s.tasks[id].eod || s.tasks[id].finished {
				s.fatalf("StopSources names %v, which is not a running source", id)
			}
			s.tasks[id].eod, s.tasks[id].drain = true, a.Drain
			follow = append(follow, TaskEndOfData{Subtask: id, Drain: a.Drain})
		}
	case TriggerCheckpoint:
		if a.ID <= s.lastID {
			s.fatalf("checkpoint IDs must grow: %d after %d", a.ID, s.lastID)
		}
		s.lastID = a.ID
		cp := &simCheckpoint{wait: a.Wait, finished: map[SubtaskID]bool{}, acked: map[SubtaskID]bool{}, afterEOD: map[SubtaskID]bool{}}
		for _, id := range a.Finished {
			cp.finished[id] = true
		}
		for _, id := range a.Tasks {
			if !slices.Contains(a.Wait, id) {
				s.fatalf("triggered %v is not waited for", id)
			}
		}
		for _, id := range a.Wait {
			if s.tasks[id].finished || !s.tasks[id].deployed {
				s.fatalf("checkpoint %d waits for %v, which is finished or not deployed", a.ID, id)
			}
		}
		if len(a.Wait)+len(a.Finished) != len(s.tasks) {
			s.fatalf("checkpoint %d: wait and finished do not cover all subtasks", a.ID)
		}
		s.cps[a.ID] = cp
	case PersistMetadata:
		cp := s.cps[a.ID]
		if cp == nil || cp.persisting || len(cp.acked) != len(cp.wait) {
			s.fatalf("persist of checkpoint %d that is unknown, persisting or missing acks", a.ID)
		}
		cp.persisting = true
	case NotifyComplete:
		cp := s.cps[a.ID]
		if cp == nil || !cp.persisting {
			s.fatalf("notify of checkpoint %d before its metadata was persisted", a.ID)
		}
		delete(s.cps, a.ID)
		for _, id := range a.Tasks {
			if cp.afterEOD[id] {
				s.tasks[id].mayClose = true
			}
		}
	case AbortCheckpoint:
		if cp := s.cps[a.ID]; cp == nil || cp.persisting {
			s.fatalf("abort of checkpoint %d that is unknown or being persisted", a.ID)
		}
		delete(s.cps, a.ID)
	case FailJob:
		if !errors.Is(a.Err, ErrTooManyCheckpointFailures) && !errors.Is(a.Err, ErrStopWithSavepointFailed) {
			s.fatalf("FailJob error %v matches no sentinel", a.Err)
		}
		s.failover()
	case JobDone:
		for id, ts := range s.tasks {
			if !ts.finished {
				s.fatalf("job done but %v is not finished", id)
			}
		}
		s.done = true
	}
	return follow
}

func (s *sim) failover() {
	for _, ts := range s.tasks {
		*ts = simTask{}
	}
	s.stopped = false
}

// canAck reports whether the barrier of cp can have reached id: every
// upstream subtask that cp waits for has acked.
func (s *sim) canAck(cp *simCheckpoint, id SubtaskID) bool {
	if cp.acked[id] || !slices.Contains(cp.wait, id) {
		return false
	}
	for _, u := range s.ups[id] {
		if !cp.finished[u] && !cp.acked[u] {
			return false
		}
	}
	return true
}

func (s *sim) ack(cpID int64, id SubtaskID) {
	cp := s.cps[cpID]
	// The snapshot follows end of data only if the barrier followed it on
	// every input: each upstream finished or acked after its end of data.
	after := s.tasks[id].eod
	for _, u := range s.ups[id] {
		after = after && (cp.finished[u] || cp.afterEOD[u])
	}
	cp.acked[id], cp.afterEOD[id] = true, after
	s.step(Ack{CheckpointID: cpID, Subtask: id, StateRef: fmt.Sprintf("%d-%v", cpID, id), Size: 1, AfterEndOfData: after})
}

func (s *sim) canEOD(id SubtaskID) bool {
	ts := s.tasks[id]
	if !ts.deployed || ts.eod || ts.finished {
		return false
	}
	for _, u := range s.ups[id] {
		if !s.tasks[u].eod {
			return false
		}
	}
	return true
}

func (s *sim) canClose(id SubtaskID) bool {
	ts := s.tasks[id]
	if !ts.mayClose || ts.finished {
		return false
	}
	for _, u := range s.ups[id] {
		if !s.tasks[u].finished {
			return false
		}
	}
	return true
}

// move makes one random move; chaos allows declines, failures and stops.
func (s *sim) move(chaos bool) {
	ids := Subtasks(s.g)
	var opts []func()
	for _, id := range ids {
		id := id
		ts := s.tasks[id]
		if !ts.deployed {
			opts = append(opts, func() { ts.deployed = true; s.step(TaskRunning{Subtask: id}) })
		}
		if s.canEOD(id) {
			opts = append(opts, func() {
				drain := true
				ts.eod, ts.drain = true, drain
				s.step(TaskEndOfData{Subtask: id, Drain: drain})
			})
		}
		if s.canClose(id) {
			opts = append(opts, func() { ts.finished = true; s.step(TaskFinished{Subtask: id}) })
		}
	}
	cpIDs := make([]int64, 0, len(s.cps))
	for id := range s.cps {
		cpIDs = append(cpIDs, id)
	}
	slices.Sort(cpIDs)
	for _, cpID := range cpIDs {
		cpID, cp := cpID, s.cps[cpID]
		if cp.persisting {
			opts = append(opts, func() { s.step(Persisted{CheckpointID: cpID}) })
			if chaos && s.r.IntN(10) == 0 {
				opts = append(opts, func() { cp.persisting = false; s.step(PersistFailed{CheckpointID: cpID, Reason: "io"}) })
			}
			continue
		}
		for _, id := range cp.wait {
			if s.canAck(cp, id) {
				id := id
				opts = append(opts, func() { s.ack(cpID, id) })
				if chaos && s.r.IntN(8) == 0 {
					opts = append(opts, func() { s.step(Decline{CheckpointID: cpID, Subtask: id, Kind: DeclineFailure, Reason: "x"}) })
				}
			}
		}
	}
	opts = append(opts, func() { s.step(Tick{}) })
	if chaos {
		st := s.c.State()
		if s.r.IntN(40) == 0 {
			id := ids[s.r.IntN(len(ids))]
			opts = append(opts, func() {
				if st.Terminal() || st == JobCreated {
					return
				}
				s.failover()
				s.step(TaskFailed{Subtask: id, Reason: "trap"})
			})
		}
		if (st == JobRunning || st == JobFinishing) && s.r.IntN(30) == 0 {
			opts = append(opts, func() { s.stopped = true; s.step(StopWithSavepoint{Drain: s.r.IntN(2) == 0}) })
		}
		if (st == JobRunning || st == JobFinishing) && s.r.IntN(30) == 0 {
			opts = append(opts, func() { s.step(TriggerSavepoint{}) })
		}
	}
	opts[s.r.IntN(len(opts))]()
}

// TestCoordinatorRandomRuns drives the coordinator through random but
// well-behaved runs on random graphs: first with declines, failures, stops
// and savepoints mixed in, then calmly. Every action is checked against the
// protocol; in the calm phase the job must end (no deadlock, every subtask
// gets its final checkpoint).
func TestCoordinatorRandomRuns(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 147))
	for run := 0; run < 400; run++ {
		s := newSim(t, r)
		for i := 0; i < 300 && !s.done; i++ {
			s.move(true)
		}
		if s.c.State() == JobRestarting || s.c.State() == JobCreated {
			for _, id := range Subtasks(s.g) {
				if !s.tasks[id].deployed {
					s.tasks[id].deployed = true
					s.step(TaskRunning{Subtask: id})
				}
			}
		}
		// Calm phase: sources end; everything is acked, persisted, closed.
		for i := 0; i < 20000 && !s.done; i++ {
			s.move(false)
		}
		if !s.done {
			s.fatalf("run %d: the job did not finish; status %+v", run, s.c.Status())
		}
		if st := s.c.State(); st != JobFinished && st != JobStopped {
			s.fatalf("run %d: ended %s", run, st)
		}
	}
}

func TestNewCoordinatorRejectsBadConfig(t *testing.T) {
	g := restoreGraph(t)
	for _, cfg := range []Config{
		{MaxConcurrent: 0},
		{MaxConcurrent: 1, IntervalTicks: -1},
		{MaxConcurrent: 1, TimeoutTicks: -1},
		{MaxConcurrent: 1, MinPauseTicks: -2},
	} {
		if _, err := NewCoordinator(g, cfg); err == nil {
			t.Errorf("NewCoordinator(%+v) accepted", cfg)
		}
	}
	if _, err := NewCoordinator(g, DefaultConfig()); err != nil {
		t.Fatal(err)
	}
}

func TestStepErrorsMatch(t *testing.T) {
	g := restoreGraph(t)
	c, err := NewCoordinator(g, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Step(TaskRunning{Subtask: SubtaskID{"nope", 0}}); !errors.Is(err, ErrUnknownSubtask) {
		t.Errorf("unknown subtask: %v", err)
	}
	if err := c.Step(TaskEndOfData{Subtask: SubtaskID{"a", 0}}); !errors.Is(err, ErrUnexpectedEvent) {
		t.Errorf("end of data while deploying: %v", err)
	}
	if err := c.Step(StopWithSavepoint{}); !errors.Is(err, ErrUnexpectedEvent) {
		t.Errorf("stop while created: %v", err)
	}
	if err := c.Step(Ack{CheckpointID: 5, Subtask: SubtaskID{"a", 0}}); !errors.Is(err, ErrUnknownCheckpoint) {
		t.Errorf("ack of a checkpoint never triggered: %v", err)
	}
	if c.HasReady() || c.State() != JobCreated {
		t.Errorf("rejected events changed the coordinator: ready %v state %s", c.Ready(), c.State())
	}
}
