package control

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Protocol scripts: testdata/protocol/*.txt run the coordinator and one
// SubtaskMachine per subtask together, like raft's interaction tests: the
// messages between them (channel events between subtasks, commands from the
// coordinator, reports to it) are queued and delivered step by step, in the
// order the script chooses. Same file format as the scenario scripts
// (scenario_test.go); `go test ./control -rewrite` regenerates them.
//
// Commands (besides graph):
//
//	protocol [checkpointing=BOOL] [interval=N] [final-immediately=BOOL] [tolerable=N] [union=UID,...]
//	         [deployed-finished=UID,...] [alignment=aligned|unaligned] [aligned-timeout=BOOL]
//	                                 a coordinator (DefaultConfig) and the machines of the graph
//	                                 (deployed-finished: those operators' subtasks are restored as
//	                                 finished)
//	open all|ID...                   Opened: the subtasks report running
//	records ID                       source ID emits a batch of records on its outputs
//	alignment-timeout ID cp=N        the alignment timer of checkpoint N fires at subtask ID
//	watermark ID ts=N                source ID emits a watermark
//	watermark-status ID idle|active  source ID goes idle or active again
//	source-ended ID...               the sources' input is exhausted
//	tick [N]                         coordinator ticks
//	stop [drain] | savepoint | cancel
//	deliver ID [from=UID/I] [n=N]    deliver up to N (default 1) messages queued for subtask ID:
//	                                 its commands first, then the end-of-data acknowledgements
//	                                 from its receivers, then its channels in order (a blocked
//	                                 channel is skipped); from= picks the acknowledgement from
//	                                 that receiver or the channel from that sender
//	deliver coordinator [n=N]        deliver reports to the coordinator
//	stabilize [except=UID]           deliver everything until nothing is queued (except: that
//	                                 operator's subtasks get only their commands and
//	                                 acknowledgements, their channels stay queued)
//	queues                           what is queued, per receiver
//	calls ID                         the operator calls of subtask ID so far
//	status                           job state, subtask states, and each machine's phase
//
// A PersistMetadata action is answered with Persisted at once (queued for the
// coordinator).

type protoMsg struct {
	from string // the sending subtask, for channel messages
	ev   SubtaskEvent
	text string // for the trace: what was sent
	// overtaking: an unaligned barrier, which the receiver takes ahead of
	// what is queued before it, as the runtime's input gate does.
	overtaking bool
	// announced: an aligned barrier queued behind other messages was
	// announced to the receiver (ChannelAnnounced), as the runtime's
	// channels do with an aligned timeout.
	announced bool
}

type protoChannel struct {
	from SubtaskID
	q    []protoMsg
}

type protoSubtask struct {
	id      SubtaskID
	m       *SubtaskMachine
	chans   []*protoChannel // by channel index
	blocked []bool
	cmds    []SubtaskEvent
	outs    [][]*protoChannel // per output edge, the receivers' channels
	acks    []protoMsg        // end-of-data acknowledgements from receivers (upstream-bound)
	calls   []string
	// capturing: per input channel, the checkpoint whose channel state its
	// records go to (0: none); captured, the records so captured.
	capturing  []int64
	captured   []string
	overtaken  []string // the records a barrier being taken overtook
	want       []int64  // per input channel: the barrier a capture waits for
	pendingAck TakeSnapshot
}

// outIndex is the output channel index of ch among s's outputs (edges in
// order, receivers in order), as SubtaskConfig.Outputs counts them.
func (s *protoSubtask) outIndex(ch *protoChannel) int {
	i := 0
	for _, row := range s.outs {
		for _, c := range row {
			if c == ch {
				return i
			}
			i++
		}
	}
	return -1
}

type protocol struct {
	t      *testing.T
	g      *JobGraph
	c      *Coordinator
	subs   map[SubtaskID]*protoSubtask
	order  []SubtaskID
	inbox  []Event // reports to the coordinator
	ckpt   bool
	union  map[string]bool // operators whose snapshots hold union list state
	recSeq int
	// announce: aligned barriers queued behind messages are announced
	// (aligned-timeout=true).
	announce bool
}

func newProtocol(t *testing.T, g *JobGraph, cfg Config, ckpt bool, deployedFinished map[string]bool, mode AlignmentMode, timeout bool) (*protocol, error) {
	c, err := NewCoordinator(g, cfg)
	if err != nil {
		return nil, err
	}
	p := &protocol{t: t, g: g, c: c, subs: map[SubtaskID]*protoSubtask{}, ckpt: ckpt, announce: timeout && mode == AlignAligned}
	chanInputs := map[SubtaskID][]int{}
	for _, v := range g.Vertices {
		for i := 0; i < v.Parallelism; i++ {
			id := SubtaskID{v.UID, i}
			s := &protoSubtask{id: id}
			for _, e := range v.Inputs {
				from := g.Vertex(e.From)
				for k := 0; k < from.Parallelism; k++ {
					if e.Partition.Pointwise() && k != i {
						continue
					}
					s.chans = append(s.chans, &protoChannel{from: SubtaskID{e.From, k}})
					chanInputs[id] = append(chanInputs[id], e.Input)
				}
			}
			s.blocked = make([]bool, len(s.chans))
			s.capturing = make([]int64, len(s.chans))
			s.want = make([]int64, len(s.chans))
			p.subs[id] = s
			p.order = append(p.order, id)
		}
	}
	// Wire each sender's outputs to its receivers' channels.
	for _, id := range p.order {
		s := p.subs[id]
		for _, e := range g.Outputs(id.Operator) {
			var row []*protoChannel
			to := g.Vertex(e.To)
			for r := 0; r < to.Parallelism; r++ {
				for _, ch := range p.subs[SubtaskID{e.To, r}].chans {
					if ch.from == id {
						row = append(row, ch)
					}
				}
			}
			s.outs = append(s.outs, row)
		}
	}
	for _, id := range p.order {
		s := p.subs[id]
		n := 0
		for _, row := range s.outs {
			n += len(row)
		}
		s.m, err = NewSubtaskMachine(SubtaskConfig{ID: id, Channels: chanInputs[id], Inputs: len(g.Vertex(id.Operator).Inputs),
			Checkpointing: ckpt, Outputs: n, DeployedFinished: deployedFinished[id.Operator], Alignment: mode})
		if err != nil {
			return nil, err
		}
		if timeout {
			s.m.cfg.AlignedTimeout = 1 // the script fires the timer
		}
	}
	return p, nil
}

// overtake puts the unaligned barrier b on every output channel of s, which
// its receiver takes ahead of what is queued (takeOvertaking).
func (p *protocol) overtake(s *protoSubtask, b Barrier) {
	for _, row := range s.outs {
		for _, ch := range row {
			rs := p.receiver(ch)
			idx := slices.Index(rs.chans, ch)
			ch.q = append(ch.q, protoMsg{from: s.id.String(), ev: ChannelBarrier{Channel: idx, B: b}, text: "barrier " + b.String(), overtaking: true})
		}
	}
}

// takeOvertaking takes, as the runtime's gate does, the first overtaking
// barrier (or one a capture waits for) out of a channel of s, unless
// end-of-partition comes first there (it overtakes end-of-data); the
// records it overtook are its ChannelBarrier's copies (CaptureOvertaken).
// With announcements it first announces an aligned barrier queued behind
// other messages, once (ChannelAnnounced).
func (p *protocol) takeOvertaking(s *protoSubtask, from string) (string, bool) {
	for i, ch := range s.chans {
		if from != "" && ch.from.String() != from {
			continue
		}
	scan:
		for k, msg := range ch.q {
			switch e := msg.ev.(type) {
			case ChannelEndOfPartition:
				break scan
			case ChannelBarrier:
				if p.announce && !msg.overtaking && !msg.announced && k > 0 {
					ch.q[k].announced = true
					return p.stepSubtask(s, ChannelAnnounced{Channel: e.Channel, B: e.B}, fmt.Sprintf("announced %s from %s (behind %d)", msg.text, msg.from, k)), true
				}
				if !msg.overtaking && (s.want[i] == 0 || e.B.ID != s.want[i]) {
					continue
				}
				s.overtaken = s.overtaken[:0]
				for _, q := range ch.q[:k] {
					if q.ev == nil {
						s.overtaken = append(s.overtaken, strings.TrimPrefix(q.text, "records "))
					}
				}
				ch.q = slices.Delete(ch.q, k, k+1)
				e.Overtook = true
				line := p.stepSubtask(s, e, fmt.Sprintf("%s from %s (overtook %d)", msg.text, msg.from, k))
				s.overtaken = s.overtaken[:0]
				return line, true
			}
		}
	}
	return "", false
}

// broadcast puts ev on every output channel of s.
func (p *protocol) broadcast(s *protoSubtask, ev func(ch int) SubtaskEvent, text string) {
	for _, row := range s.outs {
		for _, ch := range row {
			rs := p.receiver(ch)
			idx := slices.Index(rs.chans, ch)
			ch.q = append(ch.q, protoMsg{from: s.id.String(), ev: ev(idx), text: text})
		}
	}
}

func (p *protocol) receiver(ch *protoChannel) *protoSubtask {
	for _, id := range p.order {
		if slices.Contains(p.subs[id].chans, ch) {
			return p.subs[id]
		}
	}
	p.t.Fatalf("channel without receiver")
	return nil
}

// stepSubtask applies ev to s and carries out its actions; it returns the
// trace line.
func (p *protocol) stepSubtask(s *protoSubtask, ev SubtaskEvent, what string) string {
	line := fmt.Sprintf("%v: %s", s.id, what)
	if err := s.m.Step(ev); err != nil {
		return line + " -> error: " + err.Error()
	}
	var acts []string
	for _, a := range s.m.Ready() {
		acts = append(acts, a.String())
		p.perform(s, a)
	}
	s.m.Advance()
	if len(acts) == 0 {
		return line
	}
	return line + " -> " + strings.Join(acts, ", ")
}

func (p *protocol) perform(s *protoSubtask, a SubtaskAction) {
	switch x := a.(type) {
	case Report:
		p.inbox = append(p.inbox, x.Event)
	case BlockChannel:
		s.blocked[x.Channel] = true
	case UnblockChannels:
		clear(s.blocked)
	case ForwardBarrier:
		if x.Overtake {
			p.overtake(s, x.B)
			break
		}
		p.broadcast(s, func(ch int) SubtaskEvent { return ChannelBarrier{Channel: ch, B: x.B} }, "barrier "+x.B.String())
	case CaptureOutputs:
		// The runtime sends its output buffers ahead of the barrier: the
		// receivers capture them with what the barrier overtook.
	case StartCapture:
		s.capturing[x.Channel] = x.ID
		s.want[x.Channel] = x.ID
	case CaptureOvertaken:
		for _, r := range s.overtaken {
			s.captured = append(s.captured, fmt.Sprintf("ch%d:%s", x.Channel, r))
		}
	case StopCapture:
		s.capturing[x.Channel] = 0
	case FinishSnapshot:
		s.calls = append(s.calls, fmt.Sprintf("channel_state(%d: %s)", x.ID, strings.Join(s.captured, " ")))
		s.captured = nil
		p.inbox = append(p.inbox, Ack{CheckpointID: x.ID, Subtask: s.id, StateRef: fmt.Sprintf("cp%d-%v", x.ID, s.id),
			Size: 10, AfterEndOfData: s.pendingAck.AfterEndOfData, DeployedFinished: s.pendingAck.DeployedFinished, UnionState: p.union[s.id.Operator]})
	case AbortSnapshot:
		clear(s.capturing)
		s.captured = nil
		s.calls = append(s.calls, fmt.Sprintf("drop_snapshot(%d)", x.ID))
	case ArmAlignmentTimer:
	case TakeSnapshot:
		s.calls = append(s.calls, fmt.Sprintf("snapshot_state(%d)", x.B.ID))
		if x.Unaligned {
			s.pendingAck = x // the Ack waits for FinishSnapshot
			break
		}
		p.inbox = append(p.inbox, Ack{CheckpointID: x.B.ID, Subtask: s.id, StateRef: fmt.Sprintf("cp%d-%v", x.B.ID, s.id),
			Size: 10, AfterEndOfData: x.AfterEndOfData, DeployedFinished: x.DeployedFinished, UnionState: p.union[s.id.Operator]})
	case ForwardCancel:
		p.broadcast(s, func(ch int) SubtaskEvent { return ChannelCancel{ch, x.ID} }, fmt.Sprintf("cancel cp=%d", x.ID))
	case AdvanceWatermark:
		s.calls = append(s.calls, fmt.Sprintf("on_watermark(%s)", wmText(x.TS)))
		p.broadcast(s, func(ch int) SubtaskEvent { return ChannelWatermark{ch, x.TS} }, fmt.Sprintf("watermark %s", wmText(x.TS)))
	case EmitWatermarkStatus:
		p.broadcast(s, func(ch int) SubtaskEvent { return ChannelWatermarkStatus{ch, x.Idle} }, x.String())
	case EndInput:
		s.calls = append(s.calls, fmt.Sprintf("end_input(%d)", x.Input))
	case FinishOperator:
		s.calls = append(s.calls, "finish()")
	case EmitEndOfData:
		if x.MaxWatermark {
			p.broadcast(s, func(ch int) SubtaskEvent { return ChannelWatermark{ch, MaxWatermark} }, "watermark MAX")
		}
		p.broadcast(s, func(ch int) SubtaskEvent { return ChannelEndOfData{ch, x.Drain} }, fmt.Sprintf("end-of-data drain=%t", x.Drain))
	case AckEndOfData:
		ch := s.chans[x.Channel]
		from := p.subs[ch.from]
		from.acks = append(from.acks, protoMsg{from: s.id.String(), ev: OutputAcked{from.outIndex(ch)}, text: "ack-end-of-data"})
	case NotifyOperator:
		s.calls = append(s.calls, fmt.Sprintf("notify_checkpoint_complete(%d)", x.ID))
	case CloseSubtask:
		s.calls = append(s.calls, "close()")
		p.broadcast(s, func(ch int) SubtaskEvent { return ChannelEndOfPartition{ch} }, "end-of-partition")
	case AlignmentStarted, AlignmentEnded:
	default:
		p.t.Fatalf("unknown subtask action %T", a)
	}
}

func wmText(ts int64) string {
	if ts == MaxWatermark {
		return "MAX"
	}
	return fmt.Sprint(ts)
}

// stepCoordinator applies ev and routes its actions to the subtasks.
func (p *protocol) stepCoordinator(ev Event) []string {
	before := p.c.State()
	out := []string{"coordinator: " + ev.String()}
	if err := p.c.Step(ev); err != nil {
		out = append(out, "  error: "+err.Error())
	}
	for _, a := range p.c.Ready() {
		out = append(out, "  "+a.String())
		switch x := a.(type) {
		case TriggerCheckpoint:
			for _, id := range x.Tasks {
				s := p.subs[id]
				if s.m.Done() {
					p.inbox = append(p.inbox, TriggerFailed{CheckpointID: x.ID, Subtask: id, Reason: "the subtask has finished"})
					continue
				}
				s.cmds = append(s.cmds, Trigger{Barrier{ID: x.ID, Kind: x.Kind, Sync: x.Sync}})
			}
		case StopSources:
			for _, id := range x.Tasks {
				p.subs[id].cmds = append(p.subs[id].cmds, StopSource{SavepointID: x.SavepointID, Drain: x.Drain})
			}
		case PersistMetadata:
			p.inbox = append(p.inbox, Persisted{CheckpointID: x.ID})
		case NotifyComplete:
			for _, id := range x.Tasks {
				p.subs[id].cmds = append(p.subs[id].cmds, CheckpointComplete{x.ID})
			}
		case AbortCheckpoint:
			for _, id := range x.Tasks {
				p.subs[id].cmds = append(p.subs[id].cmds, CheckpointAborted{x.ID})
			}
		}
	}
	p.c.Advance()
	if after := p.c.State(); after != before {
		out = append(out, fmt.Sprintf("  job: %s -> %s", before, after))
	}
	return out
}

// deliverOne delivers the next message for s (from: only that sender's
// channel); false when nothing can be delivered.
func (p *protocol) deliverOne(s *protoSubtask, from string) (string, bool) {
	if from == "" && len(s.cmds) > 0 {
		ev := s.cmds[0]
		s.cmds = s.cmds[1:]
		return p.stepSubtask(s, ev, "cmd "+ev.String()), true
	}
	for i, msg := range s.acks {
		if from != "" && msg.from != from {
			continue
		}
		s.acks = slices.Delete(s.acks, i, i+1)
		return p.stepSubtask(s, msg.ev, fmt.Sprintf("%s from %s (%s)", msg.text, msg.from, msg.ev)), true
	}
	if line, ok := p.takeOvertaking(s, from); ok {
		return line, true
	}
	for i, ch := range s.chans {
		if len(ch.q) == 0 || s.blocked[i] || (from != "" && ch.from.String() != from) {
			continue
		}
		msg := ch.q[0]
		ch.q = ch.q[1:]
		if msg.ev == nil { // records
			if err := s.m.CheckRecords(i); err != nil {
				return fmt.Sprintf("%v: %s from %s -> error: %v", s.id, msg.text, msg.from, err), true
			}
			s.calls = append(s.calls, "process_batch")
			if id := s.capturing[i]; id != 0 {
				s.captured = append(s.captured, fmt.Sprintf("ch%d:%s", i, strings.TrimPrefix(msg.text, "records ")))
				return fmt.Sprintf("%v: %s from %s (captured for cp=%d)", s.id, msg.text, msg.from, id), true
			}
			return fmt.Sprintf("%v: %s from %s", s.id, msg.text, msg.from), true
		}
		return p.stepSubtask(s, msg.ev, msg.text+" from "+msg.from), true
	}
	return "", false
}

// stabilize delivers everything until nothing is queued; the subtasks of
// operator except (if not "") get their commands and acknowledgements only,
// not their channels' messages.
func (p *protocol) stabilize(except string) []string {
	var out []string
	for progress := true; progress; {
		progress = false
		for len(p.inbox) > 0 {
			ev := p.inbox[0]
			p.inbox = p.inbox[1:]
			out = append(out, p.stepCoordinator(ev)...)
			progress = true
		}
		for _, id := range p.order {
			s := p.subs[id]
			if id.Operator == except && len(s.cmds) == 0 && len(s.acks) == 0 {
				continue
			}
			if line, ok := p.deliverOne(s, ""); ok {
				out = append(out, line)
				progress = true
			}
		}
	}
	return out
}

func (r *scenario) protocolCmd(cmd string, args []string) ([]string, bool) {
	fail := func(format string, a ...any) ([]string, bool) {
		return []string{"error: " + fmt.Sprintf(format, a...)}, true
	}
	if cmd == "protocol" {
		cfg := DefaultConfig()
		cfg.IntervalTicks = int64(r.num(kv(args, "interval", "10")))
		cfg.FinalCheckpointImmediately = kv(args, "final-immediately", "true") == "true"
		cfg.TolerableFailures = r.num(kv(args, "tolerable", "3"))
		df := map[string]bool{}
		for _, u := range splitList(kv(args, "deployed-finished", "")) {
			df[u] = true
		}
		mode := AlignAligned
		switch a := kv(args, "alignment", "aligned"); a {
		case "aligned":
		case "unaligned":
			mode = AlignUnaligned
		default:
			return fail("alignment=%s: want aligned or unaligned", a)
		}
		p, err := newProtocol(r.t, r.g, cfg, kv(args, "checkpointing", "true") == "true", df, mode, kv(args, "aligned-timeout", "false") == "true")
		if err != nil {
			return fail("%v", err)
		}
		p.union = map[string]bool{}
		for _, u := range splitList(kv(args, "union", "")) {
			p.union[u] = true
		}
		r.p = p
		return []string{"job: created"}, true
	}
	p := r.p
	if p == nil {
		switch cmd {
		case "open", "records", "watermark", "watermark-status", "source-ended", "deliver", "stabilize", "queues", "calls", "alignment-timeout":
			return fail("no protocol: use the protocol command first")
		}
		return nil, false
	}
	pos := positional(args)
	var out []string
	switch cmd {
	case "open":
		for _, id := range r.ids(pos) {
			out = append(out, p.stepSubtask(p.subs[id], Opened{}, "opened"))
		}
	case "records":
		for _, id := range r.ids(pos) {
			p.recSeq++
			text := fmt.Sprintf("records #%d", p.recSeq)
			p.broadcast(p.subs[id], func(int) SubtaskEvent { return nil }, text)
			p.subs[id].calls = append(p.subs[id].calls, "read")
		}
	case "watermark":
		ts := int64(r.num(kv(args, "ts", "0")))
		for _, id := range r.ids(pos) {
			p.broadcast(p.subs[id], func(ch int) SubtaskEvent { return ChannelWatermark{ch, ts} }, fmt.Sprintf("watermark %d", ts))
		}
	case "watermark-status":
		if len(pos) < 2 || (pos[len(pos)-1] != "idle" && pos[len(pos)-1] != "active") {
			return fail("watermark-status ID... idle|active")
		}
		idle := pos[len(pos)-1] == "idle"
		for _, id := range r.ids(pos[:len(pos)-1]) {
			p.broadcast(p.subs[id], func(ch int) SubtaskEvent { return ChannelWatermarkStatus{ch, idle} }, EmitWatermarkStatus{idle}.String())
		}
	case "alignment-timeout":
		ev := AlignmentTimedOut{ID: int64(r.num(kv(args, "cp", "0")))}
		for _, id := range r.ids(pos) {
			out = append(out, p.stepSubtask(p.subs[id], ev, ev.String()))
		}
	case "source-ended":
		for _, id := range r.ids(pos) {
			out = append(out, p.stepSubtask(p.subs[id], SourceEnded{}, "source-ended"))
		}
	case "tick", "stop", "savepoint", "cancel":
		var ev Event
		switch cmd {
		case "stop":
			ev = StopWithSavepoint{Drain: has(args, "drain")}
		case "savepoint":
			ev = TriggerSavepoint{}
		case "cancel":
			ev = Cancel{}
		}
		n := 1
		if cmd == "tick" {
			ev = Tick{}
			if len(pos) > 0 {
				n = r.num(pos[0])
			}
		}
		for range n {
			for _, l := range p.stepCoordinator(ev) {
				if l != "coordinator: tick" {
					out = append(out, l)
				}
			}
		}
	case "deliver":
		n := r.num(kv(args, "n", "1"))
		if slices.Equal(pos, []string{"coordinator"}) {
			for ; n > 0 && len(p.inbox) > 0; n-- {
				ev := p.inbox[0]
				p.inbox = p.inbox[1:]
				out = append(out, p.stepCoordinator(ev)...)
			}
			break
		}
		for _, id := range r.ids(pos) {
			for k := 0; k < n; k++ {
				line, ok := p.deliverOne(p.subs[id], kv(args, "from", ""))
				if !ok {
					break
				}
				out = append(out, line)
			}
		}
	case "stabilize":
		out = p.stabilize(kv(args, "except", ""))
	case "queues":
		if len(p.inbox) > 0 {
			var evs []string
			for _, ev := range p.inbox {
				evs = append(evs, ev.String())
			}
			out = append(out, "coordinator: "+strings.Join(evs, "; "))
		}
		for _, id := range p.order {
			s := p.subs[id]
			for _, c := range s.cmds {
				out = append(out, fmt.Sprintf("%v: cmd %s", id, c))
			}
			for _, m := range s.acks {
				out = append(out, fmt.Sprintf("%v: %s from %s (%s)", id, m.text, m.from, m.ev))
			}
			for i, ch := range s.chans {
				for _, m := range ch.q {
					b := ""
					if s.blocked[i] {
						b = " (blocked)"
					}
					out = append(out, fmt.Sprintf("%v: %s from %s%s", id, m.text, m.from, b))
				}
			}
		}
	case "calls":
		for _, id := range r.ids(pos) {
			out = append(out, fmt.Sprintf("%v: %s", id, strings.Join(p.subs[id].calls, " ")))
		}
	case "status":
		st := p.c.Status()
		out = append(out, fmt.Sprintf("job %s latest=%d pending=%v", st.Job, st.LatestCompleted, st.Pending))
		for _, s := range st.Subtasks {
			out = append(out, fmt.Sprintf("%v: %s, machine %s", s.Subtask, s.State, phaseWord(p.subs[s.Subtask].m.Phase())))
		}
	default:
		return nil, false
	}
	return out, true
}

func phaseWord(ph SubtaskPhase) string {
	return [...]string{"created", "running", "end-of-data", "closed"}[ph]
}

func TestProtocolScripts(t *testing.T) { runScripts(t, "testdata/protocol/*.txt") }

// An acknowledgement that does not fit the handshake fails the subtask:
// before its end of data, on no such output, or twice.
func TestSubtaskAckErrors(t *testing.T) {
	m, err := NewSubtaskMachine(SubtaskConfig{ID: SubtaskID{"src", 0}, Outputs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Step(Opened{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Step(OutputAcked{0}); !errors.Is(err, ErrChannelProtocol) {
		t.Fatalf("ack before end of data: %v", err)
	}
	if err := m.Step(SourceEnded{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Step(OutputAcked{2}); !errors.Is(err, ErrChannelProtocol) {
		t.Fatalf("ack on output 2 of 2: %v", err)
	}
	if err := m.Step(OutputAcked{1}); err != nil || m.Done() || m.AwaitingAcks() != 1 {
		t.Fatalf("first ack: err %v, done %t, awaiting %d", err, m.Done(), m.AwaitingAcks())
	}
	if err := m.Step(OutputAcked{1}); !errors.Is(err, ErrChannelProtocol) {
		t.Fatalf("second ack on output 1: %v", err)
	}
	if err := m.Step(OutputAcked{0}); err != nil || !m.Done() {
		t.Fatalf("last ack: err %v, done %t", err, m.Done())
	}
	if _, err := NewSubtaskMachine(SubtaskConfig{ID: SubtaskID{"src", 0}, Outputs: -1}); err == nil {
		t.Fatal("negative outputs accepted")
	}
}

// An unaligned checkpoint that ends unfinished at a subtask (a newer
// barrier, a cancel, an abort) drops its snapshot and captures.
func TestUnalignedAbort(t *testing.T) {
	cp := func(id int64) Barrier { return Barrier{ID: id, Kind: KindCheckpoint} }
	for _, c := range []struct {
		name string
		ev   SubtaskEvent
		want string
	}{
		{"newer barrier", ChannelBarrier{Channel: 1, B: cp(2)}, "abort-snapshot cp=1, align-aborted cp=1, align-start cp=2 checkpoint, capture-outputs cp=2, forward-barrier cp=2 checkpoint unaligned overtake, snapshot cp=2 checkpoint unaligned, capture-start ch=0 cp=2"},
		{"cancel", ChannelCancel{1, 1}, "abort-snapshot cp=1, align-aborted cp=1, forward-cancel cp=1"},
		{"aborted", CheckpointAborted{1}, "abort-snapshot cp=1, align-aborted cp=1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := NewSubtaskMachine(SubtaskConfig{ID: SubtaskID{"op", 0}, Channels: []int{0, 0}, Inputs: 1, Checkpointing: true, Alignment: AlignUnaligned})
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range []SubtaskEvent{Opened{}, ChannelBarrier{Channel: 0, B: cp(1)}} {
				if err := m.Step(ev); err != nil {
					t.Fatal(err)
				}
			}
			m.Advance()
			if err := m.Step(c.ev); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range m.Ready() {
				got = append(got, a.String())
			}
			if s := strings.Join(got, ", "); s != c.want {
				t.Fatalf("got  %s\nwant %s", s, c.want)
			}
		})
	}
}
