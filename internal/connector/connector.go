package connector

import (
	"context"

	"github.com/streamd/streamd/abi"
)

// Source is one subtask of a built-in source. One goroutine uses it.
type Source interface {
	// Read fills recs[:n] with the next records and returns n > 0, or 0 and
	// io.EOF when a bounded source is exhausted. The keys and values alias
	// memory of the source that stays valid until the next Read. Read may
	// block (rate limiting, a slow reader) and returns ctx's error when ctx
	// ends first.
	Read(ctx context.Context, recs []abi.Record) (n int, err error)
	// Watermark is the source's watermark after the records read so far;
	// abi.MinWatermark when it has none.
	Watermark() int64
	// Position encodes where the next Read continues; the source's
	// constructor resumes from it.
	Position() []byte
	// Close releases the source's resources.
	Close() error
}

// ReadySource is implemented by sources that can tell, without blocking,
// whether a Read would return at once (records are due, buffered or read
// from a regular file, or the input has ended). The runtime then reads on
// the subtask's own goroutine; otherwise on a reader goroutine, so that the
// subtask takes barriers while the source waits.
type ReadySource interface {
	Ready() bool
}

// LagSource is implemented by sources that know how much they have yet to
// read (a nats source: the messages of its stream after its position), for
// the streamd.source.lag metric. Lag is called from any goroutine; ok is
// false while the source does not know.
type LagSource interface {
	Lag() (n int64, ok bool)
}

// CheckpointSource is implemented by sources that want to hear of
// completed checkpoints (a kafka source commits the offsets of the
// checkpoint to its consumer group, for monitoring tools). When checkpoint
// id is complete, the runtime calls NotifyCheckpointComplete with position,
// what that checkpoint stored for the subtask (the Position() at its
// barrier); a checkpoint the subtask took no part in (it completed before
// a restore) is not notified, and of several completed at once only the
// newest. It is called on the subtask's goroutine while a Read may be
// running on another, so it must be safe for that and must not block; an
// error fails the subtask.
type CheckpointSource interface {
	NotifyCheckpointComplete(id int64, position []byte) error
}

// Sink is one subtask of a built-in sink. One goroutine uses it.
type Sink interface {
	// Write consumes recs; the sink copies what it keeps.
	Write(recs []abi.Record) error
	// Flush makes everything written so far durable (file sink: flush and fsync).
	Flush() error
	// Close releases the sink's resources. It is always called last, also
	// after a failure.
	Close() error
}

// TwoPhaseSink is a Sink with a two-phase commit (FileSink): what it wrote
// becomes pending at a checkpoint and visible when that checkpoint is
// complete.
type TwoPhaseSink interface {
	Sink
	// PreCommit seals what was written since the last checkpoint as pending
	// for checkpoint id and returns the sink's checkpoint state, which the
	// sink never changes afterwards: it is written in the background,
	// while the subtask goes on writing.
	PreCommit(id int64) ([]byte, error)
	// Commit makes the pending data of every checkpoint <= id visible.
	Commit(id int64) error
	// CommitPending commits pending data recorded in a restored checkpoint
	// (PreCommit states); it is idempotent. Called before the first Write.
	CommitPending(states [][]byte) error
	// CommitFinal, for a job without checkpointing, makes everything written
	// visible at the end of the job.
	CommitFinal() error
}

// PartedSink is a TwoPhaseSink whose checkpoint state is large and held in
// parts (the Kafka sink's staged epochs): PreCommitParts does what
// PreCommit does and returns the state as parts whose concatenation is
// what PreCommit would return, so that the checkpoint writes them as they
// are instead of the subtask joining them at the barrier.
type PartedSink interface {
	TwoPhaseSink
	PreCommitParts(id int64) ([][]byte, error)
}

var _ TwoPhaseSink = (*FileSink)(nil)
