// Package runtime runs a job graph in one process: the task runtime, with
// checkpoints, failover, restore and the FLIP-147 finishing protocol. It also
// runs one host's part of a job spread over hosts (StartAttempt).
//
// # Threading model
//
// Run loads every wasm module first (a bad module fails Run before anything
// runs) and checks a restore against the graph (control.CheckRestore). Each
// attempt of the job (the first run and every restart) builds everything
// before any goroutine starts: one bounded channel per (sending subtask,
// receiving subtask) pair of each edge (pointwise for forward, all-to-all
// otherwise; all made by job.channel), one
// InputGate per receiving subtask and one RecordWriter per (subtask, output
// edge). Then it starts one goroutine per subtask: the first error cancels
// the attempt's context, which unblocks every other subtask (channel sends
// and gate waits select on it). A progress goroutine calls Options.Progress
// about once a second; Run calls it once more at the end.
//
// # Driver
//
// With Options.Checkpoint the goroutine of Run is the driver of a
// control.Coordinator (driver.go): it steps the coordinator with a tick from
// a real ticker (CheckpointOptions.Tick, default 100 ms; intervals, timeouts
// and pauses are converted to ticks), with the subtasks' events (running,
// end of data, ack, decline, finished), with a stop request, and with the
// outcome of its own actions, which it carries out in order:
//
//   - TriggerCheckpoint, StopSources, NotifyComplete, AbortCheckpoint become
//     commands in the subtasks' mailboxes (never blocking the driver); a
//     subtask that has exited cannot take a trigger: TriggerFailed.
//   - PersistMetadata: checkpoint.NewMetadata and Store.Commit (the commit
//     point) run in the driver, then Persisted or PersistFailed; so
//     NotifyComplete only ever follows durable metadata, and a failover
//     always knows the outcome of every persist before it picks the
//     checkpoint to restore.
//   - FailJob cancels the attempt; a subtask failure does too and becomes
//     TaskFailed once every subtask of the attempt has returned.
//
// Events of a subtask go over one channel per attempt, so events of an
// earlier attempt are never seen. After a failure the driver applies
// Options.Restart (fixed delay, at most Attempts restarts, then Run fails
// with the last cause) and restarts every subtask from the latest completed
// checkpoint or savepoint (checkpoint.LoadRestoreFrom), or from the restore
// it started with, or from the beginning. Without checkpointing there is no
// coordinator: nothing waits for a final checkpoint, sinks commit in
// Finish, and a restart begins from scratch (logged once).
//
// The driver's logic is Driver (Step, and act for each action); it sends
// commands through a Target: the *job of the attempt in this process for
// Run, or the hosts of a job spread over hosts for the controller of
// internal/cluster, which runs the same Driver (NewDriver) and feeds it the
// events its hosts report over NATS.
//
// # Jobs spread over hosts
//
// StartAttempt runs the subtasks Remote.Local selects of one attempt: a
// channel whose both ends are local is an in-process channel, one with an
// end elsewhere is that end of a NATS channel (Remote.Channels, a
// natsch.Transport; subjects carry the job id and the attempt), made in the
// same place (job.channel). There is no coordinator and no restart loop:
// the subtasks' events go to Remote.Report, the driver's commands come in
// through Attempt.Command (a trigger of a savepoint may name its Location:
// SavepointPreparer), and a failure ends the attempt (Attempt.Wait); the
// controller restarts the whole job on every host.
//
// # Mailbox
//
// A subtask's mailbox is polled with one atomic load: a source checks it
// before each read, an operator has it as one more channel of its input
// gate (cmdInput, the last channel), so a subtask blocked on its gate wakes
// for a command and the hot path gains no per-record work.
//
// A subtask is driven by its goroutine only: its operator (wasm instance,
// native operator or sink), gate, writers and counters of watermarks and
// end-of-data are never shared. Shared state is limited to the per-operator
// record counters (atomics, added once per batch) and the stdout sinks'
// mutex.
//
// # Lock order
//
// There is one lock: job.stdout, taken by a stdout sink for one write and
// never held while taking anything else or blocking on a channel. Channels
// are Go channels; the gate's wake-up channel has capacity 1 and is poked
// without blocking.
//
// # Event flow
//
// A source subtask reads up to BatchSize records at a time and hands them to
// its writers, which partition them into per-receiver batches (hash: by key
// group of the key, or of the value without key; rebalance: round robin;
// broadcast: all; forward: the one receiver) and send a batch when it is full,
// after a short read (a slow or rate-limited source), or, while the subtask
// stays busy, once its first record is Options.BufferTimeout old (2 ms by
// default; checked after each batch of work).
// After a read it sends the source's watermark if it advanced, at most once
// per watermark.interval (a timer sends the last one when reads stop); a
// source with watermark.idle_timeout that read nothing for that long sends
// the watermark status IDLE, and ACTIVE before its next records (sideout.go).
// At the end it sends the MAX watermark, EndOfData(drain=true) and
// EndOfPartition.
// Every control event is preceded by a flush of the pending batches and goes
// to every receiver.
//
// An operator subtask takes events from its gate, round robin over its
// channels:
//
//   - Records: Process(input, batch) — one call per batch into wasm; emitted
//     records are copied into the writers' batches; the batch is then
//     returned to the pool. Before waiting on an empty gate the writers are
//     flushed, so slow streams are not held back; after each batch the
//     writers send the batches older than the buffer timeout.
//   - Watermark(ts): the channel's watermark; the subtask's watermark is the
//     minimum over the channels that have neither ended nor are idle. When it
//     advances, AdvanceWatermark (the host fires due event-time timers, then
//     on_watermark) and the watermark goes downstream, unless the operator
//     called emit_watermark: then its own watermarks go downstream instead
//     (and MAX after finish).
//   - WatermarkStatus(idle): the channel's sender is idle or active again;
//     when every open channel is idle the subtask is idle downstream too.
//
// Records an operator emits go to its main-output edges; emit_to sends them
// to the edges of that side output (from: OP.OUTPUT), or drops and counts
// them when none reads it. Control events go to every output edge, side
// outputs included (sideout.go).
//   - Barrier(id): aligned: the channel is blocked until every channel that
//     has not ended delivered the barrier, then it goes downstream, the
//     channels unblock and the subtask snapshots: host keyed state by key
//     group and the guest's list state (snapshot_state), a source's
//     position, a sink's pre-commit (pending files). The blob goes to the
//     store from the subtask's goroutine; then the Ack (AfterEndOfData when
//     the subtask had sent EndOfData; UnionState when it holds union list
//     state). A subtask the coordinator triggers itself (a source, or an
//     operator whose predecessors finished) starts the alignment with no
//     channel arrived: the barrier goes behind the data already queued, as
//     channels at EndOfPartition count as aligned. CancelCheckpoint (or an
//     abort command) ends the alignment.
//   - notify(id): notify_checkpoint_complete (two-phase-commit sinks commit).
//   - EndOfData(drain): when every channel of input i delivered it,
//     EndInput(i) (with drain); when all inputs ended, Finish (with drain)
//     and EndOfData goes downstream.
//   - EndOfPartition: the channel ends (it no longer holds the watermark back
//     and counts as aligned).
//
// Finishing (DESIGN.md "Finishing"): after EndOfData a subtask reports
// end of data and keeps taking part in checkpoints; the first checkpoint it
// acknowledges after its EndOfData is its final one (for a stopping source:
// exactly the stop savepoint). When that checkpoint is notified and every
// input channel has ended, it calls Close, sends EndOfPartition, reports
// finished and exits. Stop-with-savepoint: StopSources makes each source end
// its input (with drain: MAX watermark; operators then call end_input and
// finish; without: neither, timers stay in state) and the savepoint's
// barrier follows EndOfData. After a restore, subtasks of fully finished
// operators are deployed finished: no user code, MAX watermark and
// EndOfData(drain) at once, acknowledgements as DeployedFinished.
//
// Close is always called, also after a failure or cancel. Errors name job,
// operator, subtask and phase: a *TaskError, or the *host.Error of a wasm
// instance.
//
// # Hot path
//
// Records cross channels and the wasm boundary in batches: one channel send
// and one guest call per batch, and no allocation per record in steady state
// (batches and their byte arenas are pooled). Checkpointing adds nothing per
// record: BenchmarkCheckpointInterval1s vs BenchmarkNoCheckpoint.
package runtime
