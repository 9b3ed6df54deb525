// Package runtime runs a job graph in one process: the task runtime.
//
// # Threading model
//
// Run builds everything before any goroutine starts: it loads every wasm
// module (a bad module fails Run before anything runs), creates one bounded
// dataplane.LocalChannel per (sending subtask, receiving subtask) pair of each
// edge (pointwise for forward, all-to-all otherwise), one InputGate per
// receiving subtask and one RecordWriter per (subtask, output edge). Then it
// starts one goroutine per subtask through a tracked group: Run waits for all
// of them; the first error cancels the run's context, which unblocks every
// other subtask (channel sends and gate waits select on it), and becomes
// Run's result. A progress goroutine calls Options.Progress about once a
// second; Run calls it once more at the end.
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
// broadcast: all; forward: the one receiver) and send a batch when it is full.
// After each read it sends the source's watermark if it advanced. At the end
// it sends the MAX watermark, EndOfData(drain=true) and EndOfPartition.
// Every control event is preceded by a flush of the pending batches and goes
// to every receiver.
//
// An operator subtask takes events from its gate, round robin over its
// channels:
//
//   - Records: Process(input, batch) — one call per batch into wasm; emitted
//     records are copied into the writers' batches; the batch is then
//     returned to the pool. Before waiting on an empty gate the writers are
//     flushed, so slow streams are not held back.
//   - Watermark(ts): the channel's watermark; the subtask's watermark is the
//     minimum over the channels that have not ended. When it advances,
//     AdvanceWatermark (the host fires due event-time timers, then
//     on_watermark) and the watermark goes downstream.
//   - Barrier(id): aligned: the channel is blocked until every channel that
//     has not ended delivered the barrier, then it goes downstream and the
//     channels unblock (snapshots come with checkpointing). CancelCheckpoint
//     aborts the alignment and is forwarded once.
//   - EndOfData(drain): when every channel of input i delivered it,
//     EndInput(i) (with drain); when all inputs ended, Finish (with drain)
//     and EndOfData goes downstream.
//   - EndOfPartition: the channel ends (it no longer holds the watermark back
//     and counts as aligned); when every channel ended, Close and
//     EndOfPartition goes downstream, and the subtask exits.
//
// Close is always called, also after a failure or cancel. Errors name job,
// operator, subtask and phase: a *TaskError, or the *host.Error of a wasm
// instance.
//
// # Hot path
//
// Records cross channels and the wasm boundary in batches: one channel send
// and one guest call per batch, and no allocation per record in steady state
// (batches and their byte arenas are pooled).
package runtime
