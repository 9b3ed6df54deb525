package checkpoint

import (
	"context"

	"github.com/streamd/streamd/control"
)

// Store keeps checkpoints. Hosts write state blobs (WriteState); the driver
// of the coordinator writes the metadata (Commit) once every subtask
// acknowledged. Implementations must be safe for concurrent use.
type Store interface {
	// WriteState stores the encoded state blob (EncodeState) of one
	// subtask of checkpoint id; kind decides where. The blob is durable
	// when WriteState returns.
	WriteState(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, data []byte) (BlobRef, error)
	// Commit writes md atomically, after all the blobs it names: the
	// commit point. It sets md.Location. For a checkpoint it then applies
	// retention (keeps the last N completed, never md itself) and removes
	// incomplete checkpoints with a lower id; a JetStream store does that
	// in the background (JetStream.WaitCleanup). Savepoints are never
	// deleted.
	Commit(ctx context.Context, md *Metadata) error
	// Completed lists the completed checkpoints (not savepoints),
	// ascending by id.
	Completed(ctx context.Context) ([]*Metadata, error)
	// Latest returns the newest completed checkpoint; the error wraps
	// ErrNoCheckpoint when there is none.
	Latest(ctx context.Context) (*Metadata, error)
	// ReadState loads one subtask's blob and verifies its size, checksum
	// and format.
	ReadState(ctx context.Context, md *Metadata, sub SubtaskMeta) (*SubtaskState, error)
	// Delete removes a completed checkpoint. It refuses savepoints.
	Delete(ctx context.Context, md *Metadata) error
	// Discard deletes a blob that no metadata references
	// (control.AbortCheckpoint.Discard, control.DiscardState); stateRef
	// is the Ack.StateRef.
	Discard(ctx context.Context, kind control.CheckpointKind, id int64, stateRef string) error
	// NextID is one more than the highest checkpoint id present, complete
	// or not: a new run starts its checkpoint ids there.
	NextID(ctx context.Context) (int64, error)
}
