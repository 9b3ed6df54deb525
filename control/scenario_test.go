package control

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/scripttest"
)

// Scenario scripts: testdata/*.txt are protocol traces. Each case is one or
// more input lines (a command, and for `graph` its vertex lines), a line
// "----", and the expected output up to the next blank line. Lines starting
// with '#' between cases are comments. Run `go test ./control -rewrite` to
// regenerate the expected outputs after a deliberate change, then read the
// diff.
//
// Commands:
//
//	graph                          then one vertex per line: uid p=N [<- from part[, from part...]]
//	coordinator [interval=N] [timeout=N] [max-concurrent=N] [min-pause=N]
//	            [tolerable=N] [final-immediately=BOOL] [first-id=N]   (starts from DefaultConfig)
//	running all|ID... [deployed-finished]
//	tick [N]
//	eod ID... [drain=BOOL]         TaskEndOfData, drain defaults to true
//	finished ID...                 TaskFinished
//	failed ID [reason=TEXT]        TaskFailed
//	ack cp=N all|ID... [after-eod] [deployed-finished] [union] [size=N]
//	decline cp=N ID [kind=failure|union|not-ready] [reason=TEXT]
//	trigger-failed cp=N ID
//	persisted cp=N | persist-failed cp=N [reason=TEXT]
//	savepoint | stop [drain] | cancel | restarts-exhausted
//	status                         job state, subtask states, pending checkpoints
//	plan [finished=ID,...]         PlanTrigger on the graph alone
//	restore-check [fully=UID,...] [partially=UID,...]
//
// Output: the actions of each Step in order, then "job: OLD -> NEW" when the
// job state changed; "ok" when there is nothing to show.

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the scenario scripts in testdata/")

func TestScenarios(t *testing.T) { runScripts(t, "testdata/*.txt") }

// runScripts runs every script that glob matches, each as a subtest.
func runScripts(t *testing.T, glob string) {
	scripttest.Run(t, glob, *rewrite, func(t *testing.T) func([]string) []string {
		r := &scenario{t: t}
		return r.run
	})
}

// scenario runs the commands of one script against one coordinator.
type scenario struct {
	t     *testing.T
	g     *JobGraph
	c     *Coordinator
	waits map[int64][]SubtaskID // Wait of each triggered checkpoint, for "ack cp=N all"
	acked map[int64]map[SubtaskID]bool
	p     *protocol // the protocol command's coordinator and subtask machines
	m     machine   // what the events go to: the coordinator or a lifecycle
	l     *Lifecycle
}

// machine is what Coordinator and Lifecycle have in common.
type machine interface {
	Step(Event) error
	Ready() []Action
	Advance()
	HasReady() bool
	State() JobState
}

func (r *scenario) run(input []string) (out []string) {
	defer func() {
		if len(out) == 0 {
			out = []string{"ok"}
		}
	}()
	args := tokenize(input[0])
	cmd, args := args[0], args[1:]
	fail := func(format string, a ...any) []string {
		return []string{"error: " + fmt.Sprintf(format, a...)}
	}
	if cmd != "graph" {
		if out, ok := r.protocolCmd(cmd, args); ok {
			return out
		}
	}
	switch cmd {
	case "graph":
		g, err := parseGraph(input[1:])
		if err != nil {
			return fail("%v", err)
		}
		r.g, r.c, r.p = g, nil, nil
		return nil
	case "plan":
		finished := map[SubtaskID]bool{}
		for _, id := range r.ids(strings.Split(kv(args, "finished", ""), ",")) {
			finished[id] = true
		}
		p := PlanTrigger(r.g, func(s SubtaskID) bool { return finished[s] })
		return []string{
			"trigger=" + ids(p.Trigger),
			"wait=" + ids(p.Wait),
			"finished=" + ids(p.Finished),
			"fully-finished=" + strings.Join(p.FullyFinished, ","),
		}
	case "restore-check":
		st := map[string]FinishedState{}
		for _, u := range splitList(kv(args, "fully", "")) {
			st[u] = OperatorFullyFinished
		}
		for _, u := range splitList(kv(args, "partially", "")) {
			st[u] = OperatorPartiallyFinished
		}
		if err := CheckRestore(r.g, st); err != nil {
			return []string{"error: " + err.Error()}
		}
		return []string{"ok", "deploy-as-finished=" + ids(DeployAsFinished(r.g, st))}
	case "coordinator":
		cfg := DefaultConfig()
		cfg.IntervalTicks = int64(r.num(kv(args, "interval", "10")))
		cfg.TimeoutTicks = int64(r.num(kv(args, "timeout", "100")))
		cfg.MaxConcurrent = r.num(kv(args, "max-concurrent", "1"))
		cfg.MinPauseTicks = int64(r.num(kv(args, "min-pause", "0")))
		cfg.TolerableFailures = r.num(kv(args, "tolerable", "3"))
		cfg.FinalCheckpointImmediately = kv(args, "final-immediately", "true") == "true"
		cfg.FirstID = int64(r.num(kv(args, "first-id", "0")))
		c, err := NewCoordinator(r.g, cfg)
		if err != nil {
			return fail("%v", err)
		}
		r.c, r.waits, r.acked, r.p, r.m, r.l = c, map[int64][]SubtaskID{}, map[int64]map[SubtaskID]bool{}, nil, c, nil
		return []string{fmt.Sprintf("job: %s", c.State())}
	case "lifecycle":
		cfg := LifecycleConfig{Restart: r.restartConfig(args), Seed: 1, FirstAttempt: r.num(kv(args, "first-attempt", "0")),
			OpenFailureLimit: r.num(kv(args, "open-failures", "0")), MaxLost: r.num(kv(args, "max-lost", "0"))}
		if kv(args, "checkpointing", "true") == "true" {
			cc := DefaultConfig()
			cc.IntervalTicks = int64(r.num(kv(args, "interval", "10")))
			cc.TolerableFailures = r.num(kv(args, "tolerable", "3"))
			cfg.Checkpoint = &cc
		}
		if from := kv(args, "from", ""); from != "" {
			cfg.From = &RestorePoint{ID: int64(r.num(from)), Kind: KindSavepoint, Location: "sp-" + from}
		}
		l, err := NewLifecycle(r.g, cfg)
		if err != nil {
			return fail("%v", err)
		}
		r.c, r.waits, r.acked, r.p, r.m, r.l = l.Coordinator(), map[int64][]SubtaskID{}, map[int64]map[SubtaskID]bool{}, nil, l, l
		return []string{fmt.Sprintf("job: %s, restart %s", l.State(), cfg.Restart)}
	case "status":
		if r.c == nil {
			return []string{fmt.Sprintf("job %s attempt=%d", r.m.State(), r.l.Attempt())}
		}
		st := r.c.Status()
		out = append(out, fmt.Sprintf("job %s tick=%d latest=%d pending=%v", st.Job, st.Tick, st.LatestCompleted, st.Pending))
		var line []string
		for _, s := range st.Subtasks {
			line = append(line, fmt.Sprintf("%v:%s", s.Subtask, s.State))
		}
		return append(out, strings.Join(line, " "))
	}

	if r.m == nil {
		return fail("no coordinator: use the coordinator or lifecycle command first")
	}
	before := r.m.State()
	var events []Event
	cp := int64(r.num(kv(args, "cp", "0")))
	pos := positional(args)
	switch cmd {
	case "running":
		for _, id := range r.ids(pos) {
			events = append(events, TaskRunning{Subtask: id, DeployedFinished: has(args, "deployed-finished")})
		}
	case "tick":
		n := 1
		if len(pos) > 0 {
			n = r.num(pos[0])
		}
		for range n {
			events = append(events, Tick{})
		}
	case "eod":
		for _, id := range r.ids(pos) {
			events = append(events, TaskEndOfData{Subtask: id, Drain: kv(args, "drain", "true") == "true"})
		}
	case "finished":
		for _, id := range r.ids(pos) {
			events = append(events, TaskFinished{Subtask: id})
		}
	case "failed":
		for _, id := range r.ids(pos) {
			events = append(events, TaskFailed{Subtask: id, Reason: kv(args, "reason", "trap")})
		}
	case "ack":
		targets := r.ids(pos)
		if slices.Equal(pos, []string{"all"}) {
			targets = nil
			for _, id := range r.waits[cp] {
				if !r.acked[cp][id] {
					targets = append(targets, id)
				}
			}
		}
		for _, id := range targets {
			events = append(events, Ack{
				CheckpointID: cp, Subtask: id, StateRef: fmt.Sprintf("cp%d-%s-%d", cp, id.Operator, id.Index),
				Size: int64(r.num(kv(args, "size", "10"))), AfterEndOfData: has(args, "after-eod"),
				DeployedFinished: has(args, "deployed-finished"), UnionState: has(args, "union"),
			})
		}
	case "decline":
		kind := map[string]DeclineKind{"failure": DeclineFailure, "union": DeclineUnionStatePartiallyFinished, "not-ready": DeclineNotReady}[kv(args, "kind", "failure")]
		for _, id := range r.ids(pos) {
			events = append(events, Decline{CheckpointID: cp, Subtask: id, Kind: kind, Reason: kv(args, "reason", "snapshot failed")})
		}
	case "trigger-failed":
		for _, id := range r.ids(pos) {
			events = append(events, TriggerFailed{CheckpointID: cp, Subtask: id, Reason: "task already finished"})
		}
	case "persisted":
		events = append(events, Persisted{CheckpointID: cp, Location: fmt.Sprintf("loc-%d", cp)})
	case "start":
		events = append(events, StartJob{})
	case "attempt-failed":
		var sub SubtaskID
		if ids := r.ids(pos); len(ids) > 0 {
			sub = ids[0]
		}
		class, err := ParseFailureClass(kv(args, "class", FailureRestartable.String()))
		if err != nil {
			return fail("%v", err)
		}
		events = append(events, AttemptFailed{Attempt: r.num(kv(args, "attempt", fmt.Sprint(r.l.Attempt()))), Subtask: sub, Reason: kv(args, "reason", "trap"), Class: class})
	case "attempt-lost":
		events = append(events, AttemptLost{Attempt: r.num(kv(args, "attempt", fmt.Sprint(r.l.Attempt()))), Reason: kv(args, "reason", "host lost"), Busy: has(args, "busy")})
	case "attempt-ended":
		events = append(events, AttemptEnded{Attempt: r.num(kv(args, "attempt", fmt.Sprint(r.l.Attempt())))})
	case "persist-failed":
		events = append(events, PersistFailed{CheckpointID: cp, Reason: kv(args, "reason", "disk full")})
	case "savepoint":
		events = append(events, TriggerSavepoint{})
	case "stop":
		events = append(events, StopWithSavepoint{Drain: has(args, "drain"), Terminate: has(args, "terminate")})
	case "cancel":
		events = append(events, Cancel{})
	case "restarts-exhausted":
		events = append(events, RestartsExhausted{Reason: "3 attempts"})
	default:
		return fail("unknown command %q", cmd)
	}
	for _, ev := range events {
		if err := r.m.Step(ev); err != nil {
			out = append(out, "error: "+err.Error())
		}
		if _, ok := ev.(Ack); ok {
			a := ev.(Ack)
			if r.acked[a.CheckpointID] == nil {
				r.acked[a.CheckpointID] = map[SubtaskID]bool{}
			}
			r.acked[a.CheckpointID][a.Subtask] = true
		}
		for _, a := range r.m.Ready() {
			if tr, ok := a.(TriggerCheckpoint); ok {
				r.waits[tr.ID] = tr.Wait
			}
			out = append(out, a.String())
		}
		r.m.Advance()
		if r.m.HasReady() {
			r.t.Fatal("HasReady after Advance")
		}
	}
	if after := r.m.State(); after != before {
		out = append(out, fmt.Sprintf("job: %s -> %s", before, after))
	}
	return out
}

// restartConfig reads restart=KIND and its fields (ticks).
func (r *scenario) restartConfig(args []string) RestartConfig {
	f := func(key, def string) int64 { return int64(r.num(kv(args, key, def))) }
	c := RestartConfig{Kind: RestartKind(kv(args, "restart", "none"))}
	switch c.Kind {
	case RestartFixedDelay:
		c.Attempts, c.Delay = int(f("attempts", "3")), f("delay", "0")
	case RestartFailureRate:
		c.MaxFailures, c.FailureIntervalTicks, c.Delay = int(f("max-failures", "1")), f("failure-interval", "100"), f("delay", "0")
	case RestartExponentialDelay:
		c.InitialDelay, c.MaxDelay, c.ResetTicks, c.Attempts = f("initial", "1"), f("max", "8"), f("reset", "100"), int(f("attempts", "0"))
		c.Multiplier, c.Jitter = 2, 0
	}
	return c
}

// ids resolves "all", "uid" (every subtask of uid) and "uid/i".
func (r *scenario) ids(words []string) []SubtaskID {
	var out []SubtaskID
	for _, w := range words {
		switch {
		case w == "":
		case w == "all":
			out = append(out, Subtasks(r.g)...)
		case !strings.Contains(w, "/"):
			v := r.g.Vertex(w)
			if v == nil {
				r.t.Fatalf("unknown operator %q", w)
			}
			for i := 0; i < v.Parallelism; i++ {
				out = append(out, SubtaskID{w, i})
			}
		default:
			id, err := ParseSubtaskID(w)
			if err != nil {
				r.t.Fatal(err)
			}
			out = append(out, id)
		}
	}
	return out
}

func (r *scenario) num(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		r.t.Fatalf("not a number: %q", s)
	}
	return n
}

// parseGraph reads "uid p=N [<- from part[, from part]...]" lines.
func parseGraph(lines []string) (*JobGraph, error) {
	var vs []*Vertex
	for _, l := range lines {
		head, inputs, _ := strings.Cut(l, "<-")
		f := strings.Fields(head)
		if len(f) < 2 || !strings.HasPrefix(f[1], "p=") {
			return nil, fmt.Errorf("vertex line %q: want uid p=N [<- from part, ...]", l)
		}
		p, err := strconv.Atoi(strings.TrimPrefix(f[1], "p="))
		if err != nil {
			return nil, fmt.Errorf("vertex line %q: %v", l, err)
		}
		vx := &Vertex{UID: f[0], Parallelism: p}
		for _, in := range splitList(inputs) {
			g := strings.Fields(in)
			e := Edge{From: g[0]}
			if len(g) > 1 {
				e.Partition = Partitioning(g[1])
			}
			vx.Inputs = append(vx.Inputs, e)
		}
		vs = append(vs, vx)
	}
	return NewJobGraph("scenario", vs)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// tokenize splits on spaces, keeping key="quoted text" together.
func tokenize(line string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range line {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

func kv(args []string, key, def string) string {
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok && k == key {
			return v
		}
	}
	return def
}

func has(args []string, word string) bool { return slices.Contains(args, word) }

// positional returns the arguments that are neither key=value nor flags.
func positional(args []string) []string {
	flags := []string{"deployed-finished", "after-eod", "union", "drain"}
	var out []string
	for _, a := range args {
		if !strings.Contains(a, "=") && !slices.Contains(flags, a) {
			out = append(out, a)
		}
	}
	return out
}
