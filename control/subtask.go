package control

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// This file is the subtask half of the checkpoint and finishing protocol
// (DESIGN.md "Checkpoints", "Finishing"): a pure state machine per subtask,
// in the style of the Coordinator. The task goroutine of internal/runtime
// does only the IO: it reads its input channels (or its source), feeds what
// it saw to Step, and carries out the actions of Ready in order (block a
// channel, forward a barrier, take a snapshot, call end_input, finish or
// close, emit EndOfData ...), then calls Advance.
//
// Protocol of one subtask:
//
//   - Alignment (aligned barriers). A barrier on channel c blocks c until
//     the barrier has arrived on every channel that has not ended; a channel
//     that delivered EndOfPartition counts as aligned. Then the channels are
//     unblocked, the barrier goes downstream and the subtask takes its
//     snapshot. A newer barrier ends an older alignment (that checkpoint
//     can no longer complete here); late barriers of older checkpoints and
//     of cancelled ones are dropped. A Trigger (the coordinator starts the
//     checkpoint here because every predecessor has finished) begins an
//     alignment over the channels that have not ended.
//   - Unaligned checkpoints (SubtaskConfig.Alignment; the runtime's IO is
//     in internal/runtime/unaligned.go). On the first barrier of a
//     checkpoint on any channel the subtask captures its output buffers,
//     sends the barrier ahead of them (overtaking), snapshots its state and
//     starts capturing every channel whose barrier has not arrived (and
//     that has not ended or delivered EndOfData) as channel state; a
//     channel's capture stops when its barrier arrives, or when it delivers
//     EndOfData or EndOfPartition (no record can follow). A barrier the
//     runtime took out of a channel ahead of the records queued before it
//     (ChannelBarrier.Overtook) adds those to the channel's state
//     (CaptureOvertaken). A barrier sent unaligned (Barrier.Unaligned)
//     makes the receiver take the checkpoint unaligned too. Nothing is
//     blocked. The snapshot is acknowledged (FinishSnapshot) once every
//     capture has stopped; a newer barrier, a cancel or an abort drops it
//     (AbortSnapshot). With an aligned timeout a checkpoint starts aligned
//     and, when the timer armed at the start of its alignment fires before
//     it aligned, switches to unaligned: the blocked channels (their barrier
//     is in) are unblocked, the others captured. Savepoints are always
//     aligned; ended channels count as aligned in both modes.
//   - Sources take barriers between records and while they wait for input:
//     a Trigger forwards the barrier and takes the snapshot at once.
//   - End of data. On EndOfData from every channel of an input, end_input
//     (with drain); on every input, finish() (with drain), then EndOfData
//     goes downstream with the same drain flag. A source ends its data when
//     its input is exhausted (drain: the MAX watermark first) or when it is
//     stopped for a stop-with-savepoint.
//   - Final checkpoint. After its EndOfData a subtask waits until a
//     checkpoint it snapshotted after that point is complete (a stopped
//     source: exactly the stop's savepoint), then closes and sends
//     EndOfPartition; an operator also waits for EndOfPartition on every
//     channel. Without checkpointing nothing waits for a checkpoint.
//   - Finishing handshake (FLIP-147). After its EndOfData a subtask also
//     waits, before it closes, for an acknowledgement on every output
//     channel (OutputAcked): the receiver sends it (AckEndOfData) once it
//     has processed every record sent before EndOfData on that channel,
//     i.e. when it takes EndOfData off the channel. The wait runs alongside
//     the final-checkpoint wait: the subtask is at end of data, answers
//     triggers and barriers and takes snapshots as before. A
//     deployed-finished receiver acknowledges at once (it has nothing to
//     process). A receiver closes only after EndOfPartition on all its
//     channels, which its senders send only after its acknowledgement, so
//     a receiver cannot have finished while a sender waits for it; a
//     channel whose receiver does not take part (an older peer over NATS)
//     is acknowledged by the runtime itself as soon as EndOfData is sent.
//   - Watermarks. The subtask's watermark is the minimum over the channels
//     that have not ended and are not idle (ChannelWatermarkStatus; a
//     watermark on an idle channel makes it active again); each advance is
//     passed to the operator. When every open channel is idle the subtask
//     tells its outputs (EmitWatermarkStatus), and again when one is active. After the
//     subtask sent EndOfData no watermark reaches the operator again: with
//     drain it already saw MAX, without drain (stop-with-savepoint) only
//     notify_checkpoint_complete may come between the savepoint's snapshot
//     and close.
//
// A SubtaskMachine is not safe for concurrent use.

// Barrier is a checkpoint barrier as the subtask machine sees it. Trace is
// carried through untouched (the checkpoint's trace context).
type Barrier struct {
	ID   int64
	Kind CheckpointKind
	Sync bool // the stop-with-savepoint savepoint
	// Unaligned: the barrier was sent by a subtask that took the checkpoint
	// unaligned (ForwardBarrier.Overtake); a receiver takes it unaligned
	// too, whatever its own mode (an aligned timeout that fired upstream).
	Unaligned bool
	// Base is the newest completed checkpoint at the trigger (see
	// dataplane.Barrier.Base); it travels with the barrier.
	Base  int64
	Trace map[string]string
}

// SubtaskConfig describes one subtask to NewSubtaskMachine.
type SubtaskConfig struct {
	ID SubtaskID
	// Channels has, per input channel, the index of the input it belongs to
	// (0 for a one-input operator); empty for a source.
	Channels []int
	// Inputs is the number of inputs (len(Vertex.Inputs)); 0 for a source.
	Inputs int
	// Checkpointing: the job checkpoints, so the subtask reports to the
	// coordinator, snapshots on barriers and waits for a final checkpoint.
	Checkpointing bool
	// DeployedFinished: restored as part of a fully finished operator. It
	// runs no user code, emits MAX watermark and EndOfData(drain) at once
	// and acknowledges checkpoints as deployed-finished.
	DeployedFinished bool
	// InputEnded: a restored source subtask whose input was exhausted
	// before the checkpoint: it ends its data as soon as it is open.
	InputEnded bool
	// Alignment is how checkpoint barriers are aligned (default aligned);
	// savepoints are always aligned.
	Alignment AlignmentMode
	// AlignedTimeout: with AlignAligned, a checkpoint whose alignment has
	// not completed when the timer armed at its start fires switches to
	// unaligned (the runtime reads the duration; > 0 arms the timer).
	AlignedTimeout time.Duration
	// Outputs is the number of output channels (over all output edges, in
	// the runtime's order); 0 for a sink. After its EndOfData the subtask
	// waits for OutputAcked on each before it closes.
	Outputs int
}

// AlignmentMode says how a subtask aligns checkpoint barriers.
type AlignmentMode uint8

const (
	AlignAligned   AlignmentMode = iota // block channels until every barrier is in
	AlignUnaligned                      // snapshot on the first barrier, capture in-flight records
)

func (a AlignmentMode) String() string {
	if a == AlignUnaligned {
		return "unaligned"
	}
	return "aligned"
}

// SubtaskEvent is an input to SubtaskMachine.Step.
type SubtaskEvent interface {
	isSubtaskEvent()
	String() string
}

// Opened: the subtask is set up (open() returned; for a deployed-finished
// subtask, its channels exist).
type Opened struct{}

// SourceEnded: a source's input is exhausted.
type SourceEnded struct{}

// StopSource: stop-with-savepoint SavepointID: a source ends its input now
// (with Drain: as if exhausted) and waits for exactly that savepoint.
type StopSource struct {
	SavepointID int64
	Drain       bool
}

// Trigger: the coordinator starts checkpoint B at this subtask.
type Trigger struct{ B Barrier }

// ChannelBarrier: the barrier B arrived on input channel Channel. With
// Overtook the runtime took it out of the channel ahead of the records and
// watermarks queued before it (an unaligned barrier, or one a capture waits
// for), and holds copies of them: they are the channel's state if the
// barrier belongs to the unaligned checkpoint in progress (CaptureOvertaken),
// and are processed afterwards either way.
type ChannelBarrier struct {
	Channel  int
	B        Barrier
	Overtook bool
}

// ChannelAnnounced: the aligned barrier B was queued on input channel
// Channel behind records not yet processed (Flink's EventAnnouncement). With
// an aligned timeout the alignment of B starts now, and so does its timer:
// a barrier stuck behind a back-pressured queue (a finished sender's
// records draining, FLIP-147) is taken unaligned when the timer fires,
// as it would be if it had arrived. The barrier itself still arrives later
// (ChannelBarrier), in order or taken ahead.
type ChannelAnnounced struct {
	Channel int
	B       Barrier
}

// ChannelCancel: CancelCheckpoint(ID) arrived on input channel Channel.
type ChannelCancel struct {
	Channel int
	ID      int64
}

// ChannelWatermark: watermark TS arrived on input channel Channel.
type ChannelWatermark struct {
	Channel int
	TS      int64
}

// ChannelWatermarkStatus: the sender of input channel Channel went idle
// (Idle) or active again. An idle channel does not hold back the subtask's
// watermark; a watermark arriving on it makes it active again.
type ChannelWatermarkStatus struct {
	Channel int
	Idle    bool
}

// ChannelEndOfData: EndOfData(Drain) arrived on input channel Channel.
type ChannelEndOfData struct {
	Channel int
	Drain   bool
}

// ChannelEndOfPartition: EndOfPartition arrived on input channel Channel;
// the channel has ended.
type ChannelEndOfPartition struct{ Channel int }

// OutputAcked: the receiver of output channel Channel acknowledged the
// EndOfData sent on it: it has processed every record before it.
type OutputAcked struct{ Channel int }

// AlignmentTimedOut: the timer armed by ArmAlignmentTimer for checkpoint ID
// fired.
type AlignmentTimedOut struct{ ID int64 }

// CheckpointComplete: the coordinator says checkpoint ID is complete.
type CheckpointComplete struct{ ID int64 }

// CheckpointAborted: the coordinator says checkpoint ID was aborted.
type CheckpointAborted struct{ ID int64 }

func (Opened) isSubtaskEvent()                 {}
func (SourceEnded) isSubtaskEvent()            {}
func (StopSource) isSubtaskEvent()             {}
func (Trigger) isSubtaskEvent()                {}
func (ChannelBarrier) isSubtaskEvent()         {}
func (ChannelAnnounced) isSubtaskEvent()       {}
func (ChannelCancel) isSubtaskEvent()          {}
func (ChannelWatermark) isSubtaskEvent()       {}
func (ChannelEndOfData) isSubtaskEvent()       {}
func (ChannelWatermarkStatus) isSubtaskEvent() {}
func (ChannelEndOfPartition) isSubtaskEvent()  {}
func (OutputAcked) isSubtaskEvent()            {}
func (AlignmentTimedOut) isSubtaskEvent()      {}
func (CheckpointComplete) isSubtaskEvent()     {}
func (CheckpointAborted) isSubtaskEvent()      {}

func (Opened) String() string      { return "opened" }
func (SourceEnded) String() string { return "source-ended" }
func (e StopSource) String() string {
	return fmt.Sprintf("stop sp=%d drain=%t", e.SavepointID, e.Drain)
}
func (e Trigger) String() string { return "trigger " + e.B.String() }
func (e ChannelBarrier) String() string {
	if e.Overtook {
		return fmt.Sprintf("barrier ch=%d %s overtook", e.Channel, e.B)
	}
	return fmt.Sprintf("barrier ch=%d %s", e.Channel, e.B)
}
func (e ChannelAnnounced) String() string {
	return fmt.Sprintf("announced ch=%d %s", e.Channel, e.B)
}
func (e ChannelCancel) String() string { return fmt.Sprintf("cancel ch=%d cp=%d", e.Channel, e.ID) }
func (e ChannelWatermark) String() string {
	return fmt.Sprintf("watermark ch=%d ts=%d", e.Channel, e.TS)
}
func (e ChannelWatermarkStatus) String() string {
	if e.Idle {
		return fmt.Sprintf("watermark-status ch=%d idle", e.Channel)
	}
	return fmt.Sprintf("watermark-status ch=%d active", e.Channel)
}
func (e ChannelEndOfData) String() string {
	return fmt.Sprintf("end-of-data ch=%d drain=%t", e.Channel, e.Drain)
}
func (e ChannelEndOfPartition) String() string {
	return fmt.Sprintf("end-of-partition ch=%d", e.Channel)
}
func (e OutputAcked) String() string        { return fmt.Sprintf("ack out=%d", e.Channel) }
func (e AlignmentTimedOut) String() string  { return fmt.Sprintf("alignment-timeout cp=%d", e.ID) }
func (e CheckpointComplete) String() string { return fmt.Sprintf("complete cp=%d", e.ID) }
func (e CheckpointAborted) String() string  { return fmt.Sprintf("aborted cp=%d", e.ID) }

func (b Barrier) String() string {
	s := fmt.Sprintf("cp=%d %s", b.ID, b.Kind)
	if b.Sync {
		s += " sync"
	}
	if b.Unaligned {
		s += " unaligned"
	}
	return s
}

// SubtaskAction is an output of the SubtaskMachine, carried out by the task
// goroutine in the order given.
type SubtaskAction interface {
	isSubtaskAction()
	String() string
}

// Report: send Event (TaskRunning, TaskEndOfData, TaskFinished) to the
// coordinator.
type Report struct{ Event Event }

// BlockChannel: deliver nothing more of Channel until UnblockChannels.
type BlockChannel struct{ Channel int }

// UnblockChannels: deliver every channel again.
type UnblockChannels struct{}

// AlignmentStarted / AlignmentEnded bracket the alignment of a checkpoint at
// this subtask (for spans and metrics); Aligned says whether it ended with
// the barrier on every channel (else it was aborted).
type AlignmentStarted struct{ B Barrier }

type AlignmentEnded struct {
	ID      int64
	Aligned bool
}

// ForwardBarrier: send B on every output, behind the records emitted so far;
// with Overtake (unaligned) ahead of them: CaptureOutputs came first.
type ForwardBarrier struct {
	B        Barrier
	Overtake bool
}

// TakeSnapshot: snapshot the operator's state (a source: its position) for
// B, write it and report the Ack (or a Decline). AfterEndOfData and
// DeployedFinished go into the Ack.
//
// With Unaligned the state is snapshotted now but the Ack waits for
// FinishSnapshot (the channel state captured meanwhile goes with it), or is
// dropped by AbortSnapshot.
type TakeSnapshot struct {
	B                Barrier
	AfterEndOfData   bool
	DeployedFinished bool
	Unaligned        bool
}

// CaptureOutputs: the records in the output buffers, which the barrier of
// checkpoint ID is about to overtake, are channel state of ID (per output
// channel).
type CaptureOutputs struct{ ID int64 }

// StartCapture: from now on the records arriving on input Channel are also
// channel state of checkpoint ID (they are processed as usual).
type StartCapture struct {
	Channel int
	ID      int64
}

// CaptureOvertaken: the records and watermarks the barrier of checkpoint ID
// overtook on input Channel (ChannelBarrier.Overtook) are channel state of
// ID, after what a capture of Channel took so far.
type CaptureOvertaken struct {
	Channel int
	ID      int64
}

// StopCapture: the channel state of input Channel for checkpoint ID is
// complete.
type StopCapture struct {
	Channel int
	ID      int64
}

// FinishSnapshot: every capture of unaligned checkpoint ID has stopped:
// write its channel state with the snapshot and report the Ack.
type FinishSnapshot struct{ ID int64 }

// AbortSnapshot: unaligned checkpoint ID ends here unfinished: stop its
// captures and drop its snapshot and channel state.
type AbortSnapshot struct{ ID int64 }

// ArmAlignmentTimer: fire AlignmentTimedOut{ID} after the aligned timeout.
type ArmAlignmentTimer struct{ ID int64 }

// ForwardCancel: send CancelCheckpoint(ID) on every output.
type ForwardCancel struct{ ID int64 }

// AdvanceWatermark: the subtask's watermark advanced to TS: fire the
// operator's timers (on_watermark) and send the watermark on.
type AdvanceWatermark struct{ TS int64 }

// EmitWatermarkStatus: every input channel that has not ended is idle
// (Idle), or one is active again: send the status on every output.
type EmitWatermarkStatus struct{ Idle bool }

// EndInput: call end_input(Input).
type EndInput struct{ Input int }

// FinishOperator: call finish().
type FinishOperator struct{}

// EmitEndOfData: send, with MaxWatermark, the MAX watermark (unless the
// source's watermark is at MAX already), then EndOfData(Drain) on every
// output. The final-checkpoint wait begins.
type EmitEndOfData struct {
	MaxWatermark bool
	Drain        bool
}

// AckEndOfData: acknowledge to the sender of input Channel the EndOfData
// it sent there: every record before it has been processed.
type AckEndOfData struct{ Channel int }

// NotifyOperator: call notify_checkpoint_complete(ID).
type NotifyOperator struct{ ID int64 }

// CloseSubtask: call close() (unless deployed finished), then send
// EndOfPartition on every output. The subtask is done afterwards.
type CloseSubtask struct{}

func (Report) isSubtaskAction()              {}
func (BlockChannel) isSubtaskAction()        {}
func (UnblockChannels) isSubtaskAction()     {}
func (AlignmentStarted) isSubtaskAction()    {}
func (AlignmentEnded) isSubtaskAction()      {}
func (ForwardBarrier) isSubtaskAction()      {}
func (TakeSnapshot) isSubtaskAction()        {}
func (ForwardCancel) isSubtaskAction()       {}
func (AdvanceWatermark) isSubtaskAction()    {}
func (EndInput) isSubtaskAction()            {}
func (EmitWatermarkStatus) isSubtaskAction() {}
func (FinishOperator) isSubtaskAction()      {}
func (EmitEndOfData) isSubtaskAction()       {}
func (AckEndOfData) isSubtaskAction()        {}
func (CaptureOutputs) isSubtaskAction()      {}
func (StartCapture) isSubtaskAction()        {}
func (StopCapture) isSubtaskAction()         {}
func (CaptureOvertaken) isSubtaskAction()    {}
func (FinishSnapshot) isSubtaskAction()      {}
func (AbortSnapshot) isSubtaskAction()       {}
func (ArmAlignmentTimer) isSubtaskAction()   {}
func (NotifyOperator) isSubtaskAction()      {}
func (CloseSubtask) isSubtaskAction()        {}

func (a Report) String() string       { return "report " + a.Event.String() }
func (a BlockChannel) String() string { return fmt.Sprintf("block ch=%d", a.Channel) }
func (UnblockChannels) String() string {
	return "unblock"
}
func (a AlignmentStarted) String() string { return "align-start " + a.B.String() }
func (a AlignmentEnded) String() string {
	if a.Aligned {
		return fmt.Sprintf("align-done cp=%d", a.ID)
	}
	return fmt.Sprintf("align-aborted cp=%d", a.ID)
}
func (a ForwardBarrier) String() string {
	if a.Overtake {
		return "forward-barrier " + a.B.String() + " overtake"
	}
	return "forward-barrier " + a.B.String()
}
func (a CaptureOutputs) String() string { return fmt.Sprintf("capture-outputs cp=%d", a.ID) }
func (a StartCapture) String() string {
	return fmt.Sprintf("capture-start ch=%d cp=%d", a.Channel, a.ID)
}
func (a StopCapture) String() string { return fmt.Sprintf("capture-stop ch=%d cp=%d", a.Channel, a.ID) }
func (a CaptureOvertaken) String() string {
	return fmt.Sprintf("capture-overtaken ch=%d cp=%d", a.Channel, a.ID)
}
func (a FinishSnapshot) String() string { return fmt.Sprintf("finish-snapshot cp=%d", a.ID) }
func (a AbortSnapshot) String() string  { return fmt.Sprintf("abort-snapshot cp=%d", a.ID) }
func (a ArmAlignmentTimer) String() string {
	return fmt.Sprintf("arm-alignment-timer cp=%d", a.ID)
}
func (a TakeSnapshot) String() string {
	var b strings.Builder
	b.WriteString("snapshot " + a.B.String())
	writeFlag(&b, a.AfterEndOfData, "after-eod")
	writeFlag(&b, a.DeployedFinished, "deployed-finished")
	writeFlag(&b, a.Unaligned && !a.B.Unaligned, "unaligned")
	return b.String()
}
func (a ForwardCancel) String() string { return fmt.Sprintf("forward-cancel cp=%d", a.ID) }
func (a AdvanceWatermark) String() string {
	if a.TS == MaxWatermark {
		return "watermark ts=MAX"
	}
	return fmt.Sprintf("watermark ts=%d", a.TS)
}
func (a EndInput) String() string { return fmt.Sprintf("end-input %d", a.Input) }
func (a EmitWatermarkStatus) String() string {
	if a.Idle {
		return "emit-watermark-status idle"
	}
	return "emit-watermark-status active"
}
func (FinishOperator) String() string { return "finish" }
func (a EmitEndOfData) String() string {
	s := fmt.Sprintf("emit-end-of-data drain=%t", a.Drain)
	if a.MaxWatermark {
		s = "emit-max-watermark " + s
	}
	return s
}
func (a AckEndOfData) String() string   { return fmt.Sprintf("ack-end-of-data ch=%d", a.Channel) }
func (a NotifyOperator) String() string { return fmt.Sprintf("notify cp=%d", a.ID) }
func (CloseSubtask) String() string     { return "close" }

// Errors of SubtaskMachine.Step and CheckRecords: the input broke the
// channel protocol. The subtask fails with them.
var (
	ErrChannelProtocol = errors.New("channel protocol violated")
)

// SubtaskPhase is where a subtask is in its lifecycle.
type SubtaskPhase uint8

const (
	PhaseCreated   SubtaskPhase = iota // not open yet
	PhaseRunning                       // processing input
	PhaseEndOfData                     // sent EndOfData, waiting for its final checkpoint, the acknowledgements of its outputs (and EndOfPartition)
	PhaseClosed                        // closed and sent EndOfPartition
)

// SubtaskMachine is the protocol state of one subtask.
type SubtaskMachine struct {
	cfg SubtaskConfig

	phase SubtaskPhase
	// Channels (operators).
	chanWM  []int64
	chanEOD []bool
	ended   []bool
	arrived []bool
	open    int    // channels that have not ended
	noDrain []bool // per input: a channel ended without drain
	eod     []int  // per input: channels that delivered EndOfData
	chans   []int  // per input: number of channels
	inEnded int    // inputs whose channels all delivered EndOfData
	wm      int64
	// Idleness: per channel, its sender said it is idle; idle, the
	// subtask told its outputs it is idle (every open channel is).
	chanIdle []bool
	idle     bool

	aligning   bool
	barrier    Barrier // the latest barrier seen or triggered
	lastCancel int64
	// Unaligned: the checkpoint in progress (m.barrier, while aligning) is
	// unaligned; capturing, per channel, whether its records are captured.
	unaligned  bool
	capturing  []bool
	nCapturing int

	// Finishing.
	stopID   int64 // a stopped source: the savepoint to wait for
	finalAck int64 // the first checkpoint snapshotted after end of data
	final    bool  // the final checkpoint is complete
	finalID  int64
	acked    []bool // per output channel: the receiver acknowledged EndOfData
	unacked  int    // output channels not acknowledged yet

	ready []SubtaskAction
}

// MinWatermark is the watermark before any arrived (abi.MinWatermark).
const MinWatermark int64 = -1 << 63

// MaxWatermark ends event time (abi.MaxWatermark).
const MaxWatermark int64 = 1<<63 - 1

// NewSubtaskMachine returns the machine of a subtask that is not open yet.
func NewSubtaskMachine(cfg SubtaskConfig) (*SubtaskMachine, error) {
	n := len(cfg.Channels)
	if n > 0 && cfg.Inputs < 1 {
		return nil, fmt.Errorf("control: subtask %v: %d channels but no input", cfg.ID, n)
	}
	m := &SubtaskMachine{cfg: cfg, wm: MinWatermark, open: n,
		chanWM: make([]int64, n), chanIdle: make([]bool, n), chanEOD: make([]bool, n), ended: make([]bool, n), arrived: make([]bool, n), capturing: make([]bool, n),
		noDrain: make([]bool, cfg.Inputs), eod: make([]int, cfg.Inputs), chans: make([]int, cfg.Inputs)}
	if cfg.Outputs < 0 {
		return nil, fmt.Errorf("control: subtask %v: %d output channels", cfg.ID, cfg.Outputs)
	}
	m.acked, m.unacked = make([]bool, cfg.Outputs), cfg.Outputs
	for c, in := range cfg.Channels {
		if in < 0 || in >= cfg.Inputs {
			return nil, fmt.Errorf("control: subtask %v: channel %d belongs to input %d of %d", cfg.ID, c, in, cfg.Inputs)
		}
		m.chanWM[c] = MinWatermark
		m.chans[in]++
	}
	for in, k := range m.chans {
		if k == 0 {
			return nil, fmt.Errorf("control: subtask %v: input %d has no channel", cfg.ID, in)
		}
	}
	return m, nil
}

// Phase returns where the subtask is.
func (m *SubtaskMachine) Phase() SubtaskPhase { return m.phase }

// AwaitingAcks is the number of output channels whose receiver has not
// acknowledged EndOfData yet (all of them before the subtask sent it).
func (m *SubtaskMachine) AwaitingAcks() int { return m.unacked }

// Reading reports whether a source should read its input: it is open and has
// not ended its data.
func (m *SubtaskMachine) Reading() bool { return m.phase == PhaseRunning && m.isSource() }

// Done reports whether the subtask has closed.
func (m *SubtaskMachine) Done() bool { return m.phase == PhaseClosed }

// FinalCheckpoint is the checkpoint that completed the subtask's wait after
// its end of data, 0 before.
func (m *SubtaskMachine) FinalCheckpoint() int64 { return m.finalID }

// Ready returns the actions produced since the last Advance, in order. The
// slice is the machine's own: it is valid until the next Step.
func (m *SubtaskMachine) Ready() []SubtaskAction { return m.ready }

// Advance drops the actions returned by Ready.
func (m *SubtaskMachine) Advance() {
	clear(m.ready)
	m.ready = m.ready[:0]
}

func (m *SubtaskMachine) emit(a SubtaskAction) { m.ready = append(m.ready, a) }

func (m *SubtaskMachine) isSource() bool { return len(m.cfg.Channels) == 0 }

func (m *SubtaskMachine) protocol(ch int, format string, args ...any) error {
	return fmt.Errorf("control: subtask %v channel %d: %s: %w", m.cfg.ID, ch, fmt.Sprintf(format, args...), ErrChannelProtocol)
}

// CheckRecords reports whether records on channel ch fit the protocol (none
// after EndOfData, none for a deployed-finished subtask). It is the hot
// path's check and changes nothing.
func (m *SubtaskMachine) CheckRecords(ch int) error {
	if m.chanEOD[ch] || m.cfg.DeployedFinished {
		return m.protocol(ch, "records after end-of-data")
	}
	return nil
}

// Step applies one event. An error means the input broke the protocol (the
// subtask must fail) or the event does not fit the subtask's phase.
func (m *SubtaskMachine) Step(ev SubtaskEvent) error {
	if m.phase == PhaseClosed {
		return nil // a closed subtask hears nothing more
	}
	if m.phase == PhaseCreated {
		if _, ok := ev.(Opened); !ok {
			return fmt.Errorf("control: subtask %v: %s before it opened: %w", m.cfg.ID, ev, ErrUnexpectedEvent)
		}
	}
	if e, ok := ChannelOf(ev); ok && (e < 0 || e >= len(m.cfg.Channels)) {
		return fmt.Errorf("control: subtask %v: %s: no such channel (%d channels): %w", m.cfg.ID, ev, len(m.cfg.Channels), ErrChannelProtocol)
	}
	var err error
	switch e := ev.(type) {
	case Opened:
		err = m.opened()
	case SourceEnded:
		if !m.isSource() {
			return fmt.Errorf("control: subtask %v is no source: %s: %w", m.cfg.ID, ev, ErrUnexpectedEvent)
		}
		if m.phase == PhaseRunning {
			m.endData(true, true)
		}
	case StopSource:
		err = m.stopSource(e)
	case Trigger:
		m.trigger(e.B)
	case ChannelBarrier:
		m.channelBarrier(e.Channel, e.B, e.Overtook)
	case ChannelAnnounced:
		m.announced(e.B)
	case ChannelCancel:
		m.cancel(e.ID, true)
	case CheckpointAborted:
		if !m.isSource() {
			m.cancel(e.ID, false)
		}
	case ChannelWatermark:
		if m.chanIdle[e.Channel] && e.TS > MinWatermark {
			m.setActive(e.Channel)
		}
		if e.TS > m.chanWM[e.Channel] {
			m.chanWM[e.Channel] = e.TS
			m.advanceWatermark()
		}
	case ChannelWatermarkStatus:
		if e.Idle {
			m.setIdle(e.Channel)
		} else {
			m.setActive(e.Channel)
		}
	case ChannelEndOfData:
		err = m.channelEndOfData(e.Channel, e.Drain)
	case ChannelEndOfPartition:
		err = m.channelEndOfPartition(e.Channel)
	case OutputAcked:
		err = m.outputAcked(e.Channel)
	case AlignmentTimedOut:
		if m.aligning && !m.unaligned && m.barrier.ID == e.ID {
			m.goUnaligned(-1, false)
		}
	case CheckpointComplete:
		m.complete(e.ID)
	default:
		return fmt.Errorf("control: subtask %v: unknown event %T", m.cfg.ID, ev)
	}
	if err != nil {
		return err
	}
	m.maybeClose()
	return nil
}

// ChannelOf is the input channel an event came on; false for events that
// did not come on a channel.
func ChannelOf(ev SubtaskEvent) (int, bool) {
	switch e := ev.(type) {
	case ChannelBarrier:
		return e.Channel, true
	case ChannelAnnounced:
		return e.Channel, true
	case ChannelCancel:
		return e.Channel, true
	case ChannelWatermark:
		return e.Channel, true
	case ChannelWatermarkStatus:
		return e.Channel, true
	case ChannelEndOfData:
		return e.Channel, true
	case ChannelEndOfPartition:
		return e.Channel, true
	}
	return 0, false
}

func (m *SubtaskMachine) report(ev Event) {
	if m.cfg.Checkpointing {
		m.emit(Report{ev})
	}
}

func (m *SubtaskMachine) opened() error {
	if m.phase != PhaseCreated {
		return fmt.Errorf("control: subtask %v opened twice: %w", m.cfg.ID, ErrUnexpectedEvent)
	}
	m.phase = PhaseRunning
	if m.cfg.DeployedFinished {
		m.endData(true, true)
		m.report(TaskRunning{Subtask: m.cfg.ID, DeployedFinished: true})
		return nil
	}
	m.report(TaskRunning{Subtask: m.cfg.ID})
	if m.isSource() && m.cfg.InputEnded {
		m.endData(true, true)
	}
	return nil
}

// endData ends the subtask's data (DESIGN.md "Finishing" 1b, 3b).
func (m *SubtaskMachine) endData(maxWM, drain bool) {
	m.emit(EmitEndOfData{MaxWatermark: maxWM, Drain: drain})
	m.phase = PhaseEndOfData
	if !m.cfg.DeployedFinished {
		m.report(TaskEndOfData{Subtask: m.cfg.ID, Drain: drain})
	}
}

func (m *SubtaskMachine) stopSource(e StopSource) error {
	if !m.isSource() {
		return fmt.Errorf("control: subtask %v is no source: %s: %w", m.cfg.ID, e, ErrUnexpectedEvent)
	}
	m.stopID = e.SavepointID
	switch m.phase {
	case PhaseRunning:
		m.endData(e.Drain, e.Drain)
	case PhaseEndOfData:
		// Already at end of data: wait for exactly this savepoint.
		if m.finalAck != 0 && m.finalAck < e.SavepointID {
			m.finalAck = 0
		}
	}
	return nil
}

func (m *SubtaskMachine) snapshot(b Barrier) {
	m.emit(ForwardBarrier{B: b})
	m.takeSnapshot(b, false)
}

func (m *SubtaskMachine) takeSnapshot(b Barrier, unaligned bool) {
	if !m.cfg.Checkpointing {
		return
	}
	after := m.phase == PhaseEndOfData
	m.emit(TakeSnapshot{B: b, AfterEndOfData: after, DeployedFinished: m.cfg.DeployedFinished, Unaligned: unaligned})
	if after && m.finalAck == 0 {
		m.finalAck = b.ID
	}
}

// unalignedFor reports whether checkpoint b starts unaligned here.
func (m *SubtaskMachine) unalignedFor(b Barrier) bool {
	return m.cfg.Checkpointing && (m.cfg.Alignment == AlignUnaligned || b.Unaligned) && b.Kind == KindCheckpoint
}

// goUnaligned takes the checkpoint in progress (m.barrier) unaligned: at
// its first barrier (on channel first), at a trigger (first < 0), or when
// its alignment timed out (first < 0; the channels whose barrier is in are
// blocked), or when an unaligned barrier of it came (first, with
// overtook if it overtook records there).
func (m *SubtaskMachine) goUnaligned(first int, overtook bool) {
	if slices.Contains(m.arrived, true) {
		m.emit(UnblockChannels{})
	}
	if first >= 0 {
		m.arrived[first] = true
	}
	m.unaligned = true
	b := m.barrier
	b.Unaligned = true
	m.emit(CaptureOutputs{b.ID})
	m.emit(ForwardBarrier{B: b, Overtake: true})
	m.takeSnapshot(b, true)
	if overtook && m.cfg.Checkpointing {
		m.emit(CaptureOvertaken{Channel: first, ID: b.ID})
	}
	for c, a := range m.arrived {
		if !a && !m.ended[c] && !m.chanEOD[c] {
			m.capturing[c] = true
			m.nCapturing++
			m.emit(StartCapture{Channel: c, ID: b.ID})
		}
	}
	m.maybeCaptured()
}

// stopCapture ends the capture of channel ch, if it runs.
func (m *SubtaskMachine) stopCapture(ch int) {
	if m.capturing[ch] {
		m.capturing[ch] = false
		m.nCapturing--
		m.emit(StopCapture{Channel: ch, ID: m.barrier.ID})
	}
}

// maybeCaptured finishes the unaligned checkpoint in progress once no
// capture runs.
func (m *SubtaskMachine) maybeCaptured() {
	if !m.aligning || !m.unaligned || m.nCapturing > 0 {
		return
	}
	id := m.barrier.ID
	m.aligning, m.unaligned = false, false
	clear(m.arrived)
	m.emit(AlignmentEnded{ID: id, Aligned: true})
	m.emit(FinishSnapshot{id})
}

func (m *SubtaskMachine) trigger(b Barrier) {
	if m.isSource() {
		if b.ID <= m.barrier.ID {
			return // a repeat
		}
		m.barrier = b
		if m.unalignedFor(b) {
			// No input to capture: only the output buffers.
			b.Unaligned = true
			m.emit(CaptureOutputs{b.ID})
			m.emit(ForwardBarrier{B: b, Overtake: true})
			m.takeSnapshot(b, true)
			m.emit(FinishSnapshot{b.ID})
			return
		}
		m.snapshot(b)
		return
	}
	// The predecessors have finished: the barrier goes behind the data
	// already queued on each channel that has not ended.
	if b.ID <= m.barrier.ID || b.ID <= m.lastCancel {
		return
	}
	m.beginAlignment(b)
	if m.unalignedFor(b) {
		m.goUnaligned(-1, false)
		return
	}
	m.maybeAligned()
}

func (m *SubtaskMachine) beginAlignment(b Barrier) {
	if m.aligning {
		m.endAlignment(false)
	}
	m.aligning, m.barrier = true, b
	m.emit(AlignmentStarted{b})
	if m.cfg.AlignedTimeout > 0 && b.Kind == KindCheckpoint && !m.unalignedFor(b) && m.cfg.Checkpointing {
		m.emit(ArmAlignmentTimer{b.ID})
	}
}

func (m *SubtaskMachine) endAlignment(aligned bool) {
	wasUnaligned := m.unaligned
	if wasUnaligned {
		// Only an abort ends an unaligned checkpoint here (maybeCaptured
		// finishes it): its captures end with the snapshot.
		m.emit(AbortSnapshot{m.barrier.ID})
		clear(m.capturing)
		m.nCapturing, m.unaligned = 0, false
	}
	m.emit(AlignmentEnded{ID: m.barrier.ID, Aligned: aligned})
	m.aligning = false
	blocked := !wasUnaligned && slices.Contains(m.arrived, true)
	clear(m.arrived)
	if blocked {
		m.emit(UnblockChannels{})
	}
}

func (m *SubtaskMachine) channelBarrier(ch int, b Barrier, overtook bool) {
	switch {
	case m.aligning && b.ID == m.barrier.ID:
		if !m.unaligned && m.unalignedFor(b) && !m.arrived[ch] {
			// Aligned so far here, but the sender took it unaligned (its
			// aligned timeout fired): so does this subtask.
			m.goUnaligned(ch, overtook)
			return
		}
	case b.ID <= m.barrier.ID, b.ID <= m.lastCancel:
		return // a late barrier of an aborted, cancelled or completed checkpoint
	default:
		m.beginAlignment(b)
		if m.unalignedFor(b) {
			m.goUnaligned(ch, overtook)
			return
		}
	}
	if m.arrived[ch] {
		return
	}
	m.arrived[ch] = true
	if m.unaligned {
		if overtook && m.capturing[ch] {
			m.emit(CaptureOvertaken{Channel: ch, ID: m.barrier.ID})
		}
		m.stopCapture(ch)
		m.maybeCaptured()
		return
	}
	m.emit(BlockChannel{ch})
	m.maybeAligned()
}

// announced starts the alignment of aligned checkpoint b, whose barrier is
// queued behind records on some channel, when an aligned timeout can switch
// it to unaligned; nothing otherwise, nor while another checkpoint aligns
// (its barriers decide, as before), nor when b is no newer than the
// checkpoint in progress or the latest cancelled one.
func (m *SubtaskMachine) announced(b Barrier) {
	if m.cfg.AlignedTimeout <= 0 || !m.cfg.Checkpointing || b.Kind != KindCheckpoint || m.unalignedFor(b) ||
		m.aligning || b.ID <= m.barrier.ID || b.ID <= m.lastCancel {
		return
	}
	m.beginAlignment(b)
}

func (m *SubtaskMachine) maybeAligned() {
	for c, a := range m.arrived {
		if !a && !m.ended[c] {
			return
		}
	}
	b := m.barrier
	m.endAlignment(true)
	m.snapshot(b)
}

// cancel aborts the alignment of checkpoint id; a CancelCheckpoint that came
// on a channel is forwarded once.
func (m *SubtaskMachine) cancel(id int64, forward bool) {
	if m.aligning && m.barrier.ID == id {
		m.endAlignment(false)
	}
	if id > m.lastCancel {
		m.lastCancel = id
		if forward {
			m.emit(ForwardCancel{id})
		}
	}
}

// advanceWatermark recomputes the subtask watermark, the minimum over the
// channels that have not ended. Once the subtask sent EndOfData it stays.
func (m *SubtaskMachine) advanceWatermark() {
	if m.cfg.DeployedFinished || m.phase != PhaseRunning {
		return
	}
	lo, any := MaxWatermark, false
	for c, w := range m.chanWM {
		if m.ended[c] || m.chanIdle[c] {
			continue
		}
		any = true
		lo = min(lo, w)
	}
	if !any || lo <= m.wm {
		return
	}
	m.wm = lo
	m.emit(AdvanceWatermark{lo})
}

// InputWatermark is the watermark of input in: the minimum over its
// channels that are neither ended nor idle; MinWatermark when there is
// none (or before any arrived), MaxWatermark once all its channels ended.
func (m *SubtaskMachine) InputWatermark(in int) int64 {
	lo, any, open := MaxWatermark, false, false
	for c, w := range m.chanWM {
		if m.cfg.Channels[c] != in || m.ended[c] {
			continue
		}
		open = true
		if m.chanIdle[c] {
			continue
		}
		any = true
		lo = min(lo, w)
	}
	if !any {
		if open {
			return MinWatermark
		}
		return MaxWatermark
	}
	return lo
}

// Idle reports whether the subtask told its outputs it is idle.
func (m *SubtaskMachine) Idle() bool { return m.idle }

// setIdle marks channel ch idle; when every open channel is idle, the
// subtask goes idle downstream. Otherwise the others may advance the
// watermark now.
func (m *SubtaskMachine) setIdle(ch int) {
	if m.chanIdle[ch] || m.ended[ch] {
		return
	}
	m.chanIdle[ch] = true
	m.advanceWatermark()
	m.maybeIdle()
}

// setActive marks channel ch active again (and the subtask, if it was idle).
func (m *SubtaskMachine) setActive(ch int) {
	if !m.chanIdle[ch] {
		return
	}
	m.chanIdle[ch] = false
	if m.idle && m.phase == PhaseRunning && !m.cfg.DeployedFinished {
		m.idle = false
		m.emit(EmitWatermarkStatus{Idle: false})
	}
}

// maybeIdle: every channel that has not ended is idle (and one is).
func (m *SubtaskMachine) maybeIdle() {
	if m.idle || m.phase != PhaseRunning || m.cfg.DeployedFinished {
		return
	}
	any := false
	for c := range m.chanIdle {
		if m.ended[c] {
			continue
		}
		if !m.chanIdle[c] {
			return
		}
		any = true
	}
	if any {
		m.idle = true
		m.emit(EmitWatermarkStatus{Idle: true})
	}
}

func (m *SubtaskMachine) channelEndOfData(ch int, drain bool) error {
	if m.chanEOD[ch] {
		return m.protocol(ch, "second end-of-data")
	}
	m.chanEOD[ch] = true
	// Every record before EndOfData on ch has been processed; unaligned, a
	// capture of ch is complete too (no record can follow), so no channel
	// state being written holds any of them once it is acknowledged.
	m.stopCapture(ch)
	m.emit(AckEndOfData{ch})
	m.maybeCaptured()
	if m.cfg.DeployedFinished {
		return nil // it sent its EndOfData when deployed
	}
	in := m.cfg.Channels[ch]
	if !drain {
		m.noDrain[in] = true
	}
	m.eod[in]++
	if m.eod[in] < m.chans[in] {
		return nil
	}
	if !m.noDrain[in] {
		m.emit(EndInput{in})
	}
	m.inEnded++
	if m.inEnded < len(m.chans) {
		return nil
	}
	drainAll := !slices.Contains(m.noDrain, true)
	if drainAll {
		m.emit(FinishOperator{})
	}
	m.endData(false, drainAll)
	return nil
}

func (m *SubtaskMachine) channelEndOfPartition(ch int) error {
	if !m.chanEOD[ch] {
		return m.protocol(ch, "end-of-partition before end-of-data")
	}
	if m.ended[ch] {
		return m.protocol(ch, "second end-of-partition")
	}
	m.ended[ch] = true
	m.open--
	// An ended channel no longer holds back the watermark, and counts as
	// aligned for a pending barrier.
	m.advanceWatermark()
	m.maybeIdle()
	switch {
	case m.unaligned:
		m.stopCapture(ch)
		m.maybeCaptured()
	case m.aligning:
		m.maybeAligned()
	}
	return nil
}

func (m *SubtaskMachine) outputAcked(out int) error {
	if out < 0 || out >= len(m.acked) {
		return fmt.Errorf("control: subtask %v: acknowledgement on output %d of %d: %w", m.cfg.ID, out, len(m.acked), ErrChannelProtocol)
	}
	if m.phase != PhaseEndOfData {
		return fmt.Errorf("control: subtask %v: acknowledgement on output %d before it sent end-of-data: %w", m.cfg.ID, out, ErrChannelProtocol)
	}
	if m.acked[out] {
		return fmt.Errorf("control: subtask %v: second acknowledgement on output %d: %w", m.cfg.ID, out, ErrChannelProtocol)
	}
	m.acked[out] = true
	m.unacked--
	return nil
}

// complete: checkpoint id is complete. The operator hears of it; if the
// subtask snapshotted a checkpoint <= id after its end of data (a stopped
// source: exactly its savepoint), that was its final checkpoint.
func (m *SubtaskMachine) complete(id int64) {
	if !m.cfg.DeployedFinished {
		m.emit(NotifyOperator{id})
	}
	if m.finalAck != 0 && id >= m.finalAck && (m.stopID == 0 || id == m.stopID) && !m.final {
		m.final, m.finalID = true, id
	}
}

func (m *SubtaskMachine) maybeClose() {
	if m.phase != PhaseEndOfData || m.open > 0 || m.unacked > 0 || (m.cfg.Checkpointing && !m.final) {
		return
	}
	m.phase = PhaseClosed
	m.emit(CloseSubtask{})
	m.report(TaskFinished{Subtask: m.cfg.ID})
}
