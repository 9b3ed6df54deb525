// Package checkpoint stores streamd checkpoints and savepoints and plans
// their restore.
//
// A checkpoint is a set of state blobs, one per subtask that has state, and a
// metadata file that names them. The blobs are written first; the metadata
// file, written atomically, is the commit point: a checkpoint without it does
// not exist. The on-disk format is a contract, documented in
// docs/checkpoint-format.md.
//
// Store is the storage interface: Dir (a local directory) and JetStream (a
// NATS JetStream object store, for hosts without a shared disk). Reassign redistributes an operator's state when the
// parallelism changes; LoadRestore does everything a restore needs.
package checkpoint

import (
	"errors"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

// FormatVersion is the version of the metadata file and of state blobs of
// an aligned checkpoint (no channel state).
const FormatVersion = 1

// FormatVersionChannelState is the version of the metadata file and of the
// state blobs of a checkpoint with channel state (unaligned checkpoints that
// stored in-flight elements): version 1 plus the channel-state section and
// SubtaskMeta.InFlightBytes. Readers read both versions.
const FormatVersionChannelState = 2

var (
	// ErrNoCheckpoint is wrapped when a place holds no completed checkpoint.
	ErrNoCheckpoint = errors.New("checkpoint: no completed checkpoint")
	// ErrCorrupt is wrapped by every checksum, format and truncation error.
	// The error message names the file.
	ErrCorrupt = errors.New("checkpoint: corrupt")
)

// SubtaskState is what one subtask contributes to a checkpoint: the content
// of its state blob.
type SubtaskState struct {
	// Operator is a wasm operator's state: keyed state by key group, timers
	// and operator list state. Nil: none.
	Operator *host.Snapshot
	// SourcePosition is a built-in source's connector.Source.Position().
	// Nil: not a source.
	SourcePosition []byte
	// SinkPending is a two-phase-commit sink's pending-commit data, opaque
	// here (the sink defines it). Nil: none.
	SinkPending []byte
	// SinkPendingParts, when SinkPending is nil, is the pending-commit
	// data in parts (connector.PartedSink): the blob holds their
	// concatenation as it would hold SinkPending, and reads back as
	// SinkPending. Nil: none.
	SinkPendingParts [][]byte
	// Channels is the subtask's channel state in an unaligned checkpoint:
	// its input channels' and output buffers' in-flight elements. Nil or
	// empty: none (an aligned checkpoint's blob).
	Channels *ChannelState
}

// sinkPending is the pending-commit data in parts (SinkPending is one) and
// its size; ok is false when there is none.
func (s *SubtaskState) sinkPending() (parts [][]byte, size int, ok bool) {
	if s.SinkPending != nil {
		return [][]byte{s.SinkPending}, len(s.SinkPending), true
	}
	for _, p := range s.SinkPendingParts {
		size += len(p)
	}
	return s.SinkPendingParts, size, s.SinkPendingParts != nil
}

// HasSinkPending reports whether s holds pending-commit data of a sink.
func (s *SubtaskState) HasSinkPending() bool {
	_, _, ok := s.sinkPending()
	return ok
}

// Metadata describes one completed checkpoint or savepoint.
type Metadata struct {
	Version int    `json:"version"`
	Job     string `json:"job"`
	// JobID is the id of the deployed job that wrote it; absent for a job
	// that streamd run ran (and in checkpoints of earlier versions).
	JobID     string                 `json:"job_id,omitempty"`
	ID        int64                  `json:"id"`
	Kind      control.CheckpointKind `json:"kind"`
	Time      time.Time              `json:"time"`
	Operators []OperatorMeta         `json:"operators"` // graph (topological) order
	// Location is where the checkpoint lives (its directory for Dir). It is
	// not stored; Resolve, Load and Commit set it.
	Location string `json:"-"`
}

// OperatorMeta is one operator of a checkpoint.
type OperatorMeta struct {
	UID            string                `json:"uid"`
	Parallelism    int                   `json:"parallelism"`
	MaxParallelism int                   `json:"max_parallelism"`
	Finished       control.FinishedState `json:"-"` // stored as "finished": "running" | "partially-finished" | "fully-finished"
	// Subtasks has one entry per subtask (len == Parallelism), none when
	// the operator is fully finished.
	Subtasks []SubtaskMeta `json:"subtasks"`
}

// SubtaskMeta is one subtask of an operator in a checkpoint.
type SubtaskMeta struct {
	Index    int    `json:"index"`
	Finished bool   `json:"finished,omitempty"` // a finished subtask has no state (Ref == "")
	Ref      string `json:"ref,omitempty"`      // blob name within the checkpoint; "" = no state
	Size     int64  `json:"size,omitempty"`
	CRC32C   uint32 `json:"crc32c,omitempty"`
	// InFlightBytes is the size of the channel-state section of the blob
	// (ChannelState.EncodedSize); only in format version 2.
	InFlightBytes int64 `json:"inflight_bytes,omitempty"`
	// Shared are the shared files (of SharedDir) the state of an
	// incremental checkpoint refers to; only in format version 3.
	Shared []SharedRef `json:"shared,omitempty"`
}

// BlobRef names a stored state blob. Put String() into control.Ack.StateRef
// and Size into control.Ack.Size; NewMetadata parses it back.
type BlobRef struct {
	Name   string
	Size   int64
	CRC32C uint32
	// InFlight is the blob's channel-state bytes (WriteSubtaskState sets
	// it); 0 for an aligned checkpoint's blob.
	InFlight int64
	// Shared are the shared files of an incremental checkpoint the state
	// refers to (WriteSubtaskState sets it).
	Shared []SharedRef
}

// OperatorSnapshot is one operator's loaded state, the input of Reassign.
type OperatorSnapshot struct {
	Meta OperatorMeta
	// Subtasks holds the state by old subtask index; nil for a finished
	// subtask or one without state.
	Subtasks []*SubtaskState
	// Source: the operator is a source (from the job graph). A source's
	// parallelism cannot change, unless RescalePositions is set. An
	// operator whose state holds a source position counts as a source too.
	Source bool
	// RescalePositions, when set (the source's connector registered
	// connector.ConfigSpec.RescalePositions: its splits can move between
	// subtasks), spreads the old subtasks' positions (nil for a finished
	// subtask or one without a position) over newParallelism subtasks.
	RescalePositions func(positions [][]byte, newParallelism int) ([][]byte, error)
}

// SubtaskRestore is what one new subtask restores.
type SubtaskRestore struct {
	// Snapshot goes to host.InstanceConfig.Restore. Nil: fresh state.
	Snapshot *host.Snapshot
	// SourcePosition goes to the source connector's constructor. Nil: from
	// the beginning.
	SourcePosition []byte
	// SourceFinished: this source subtask had finished; it reads nothing
	// and ends its input at once.
	SourceFinished bool
	// SinkPending is the pending-commit data a two-phase-commit sink
	// commits first (commits are idempotent).
	SinkPending [][]byte
	// InFlight is what the subtask replays first, before it reads any new
	// element from its inputs: per input channel (ChannelData.Operator and
	// Subtask name the upstream subtask of the restored graph, Input the
	// input index), the elements in order. Sorted by (Input, Operator,
	// Subtask); nil for an aligned checkpoint. See ReassignChannels.
	InFlight []ChannelData
}

// Restore is a loaded checkpoint, redistributed for a job graph.
type Restore struct {
	Metadata *Metadata
	// Finished is each operator's finished state, by uid (for
	// control.DeployAsFinished).
	Finished map[string]control.FinishedState
	// Subtasks is what each subtask of the graph restores; a subtask
	// missing here starts fresh.
	Subtasks map[control.SubtaskID]*SubtaskRestore
}
