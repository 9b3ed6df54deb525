package runtime

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
)

// Dead letters: a wasm operator with on_error skip or dead_letter
// (jobfile.OnError) takes the records that make its guest fail out of the
// stream instead of failing the subtask.
//
// Its instance journals each process call's state changes
// (host.InstanceConfig.Isolate) and its emits are held until the call
// returns. When a batch fails, the held emits are dropped, a fresh
// instance is opened on the state as it was before the batch
// (host.Instance.Replace) and the batch is replayed record by record: a
// record that succeeds has its emits sent on, a record that fails again is
// a dead letter (skipped, or written to the dead-letter sink with its
// error) and the instance is replaced again before the next record.
//
// The dead-letter sink is a two-phase-commit sink (a registered type marked
// connector.ConfigSpec.DeadLetters: file or nats) of the
// operator's subtask: it pre-commits at the subtask's snapshot, its pending
// data is part of the subtask's state (checkpoint.SubtaskState.SinkPending
// beside the operator state) and it commits when the checkpoint is
// complete, so the dead letters are exactly once like any sink's records.

// deadLetters is the on_error side of one wasm operator subtask.
type deadLetters struct {
	t       *task
	spec    *jobfile.OnError
	open    func() (connector.Sink, error) // dead_letter: opens the sink; nil for skip
	pending [][]byte                       // restored pending-commit states of the sink
	sink    connector.Sink
	// checkpoint is the id of the latest checkpoint the subtask took part
	// in or was restored from (0: none): a dead letter came after it.
	checkpoint int64
	count      int64
	recent     []time.Time // a rate limit's latest dead letters, oldest first
	held       []abi.Record
	arena      []byte
	// heldSide are the side-output records of the call (emit_to), by
	// output name in sideNames.
	heldSide  []abi.Record
	sideNames []string
}

// DeadLetter is the JSON value of a record in a dead-letter sink (the key
// and timestamp of the dead-letter record are those of the failed record).
// Key and Value are the failed record's, as text when they are UTF-8, else
// in KeyBase64 and ValueBase64.
type DeadLetter struct {
	Job          string `json:"job"`
	Operator     string `json:"operator"`
	Subtask      int    `json:"subtask"`
	Attempt      int    `json:"attempt"`
	CheckpointID int64  `json:"checkpoint_id"`
	Input        int    `json:"input"`
	Error        string `json:"error"`
	Rejected     bool   `json:"rejected,omitempty"`
	Key          string `json:"key,omitempty"`
	KeyBase64    string `json:"key_base64,omitempty"`
	Value        string `json:"value,omitempty"`
	ValueBase64  string `json:"value_base64,omitempty"`
	Timestamp    *int64 `json:"timestamp,omitempty"`
}

// isolatable reports whether err is a failure of the guest on its input,
// which on_error handles; cancellation, a failed state backend and errors
// of the runtime are not.
func isolatable(err error) bool {
	var he *host.Error
	if !errors.As(err, &he) || he.Phase != abi.PhaseProcess {
		return false
	}
	switch he.Kind {
	case host.ErrTrap, host.ErrGuestFailed, host.ErrDeadline, host.ErrMemoryLimit, host.ErrExit,
		host.ErrHostCall, host.ErrRejected, abi.ErrRecordTooLarge:
		return true
	}
	return false
}

// hold is the Emitter of a process call: it copies the records (lent by the
// instance) until the call has returned.
func (d *deadLetters) hold(recs []abi.Record) { d.held = d.keep(d.held, recs) }

// holdSide holds records the call emitted to side output name.
func (d *deadLetters) holdSide(name string, recs []abi.Record) {
	d.heldSide = d.keep(d.heldSide, recs)
	for range recs {
		d.sideNames = append(d.sideNames, name)
	}
}

// keep appends copies of recs (in the arena) to held.
func (d *deadLetters) keep(held, recs []abi.Record) []abi.Record {
	for _, r := range recs {
		n := len(r.Key) + len(r.Value) + len(r.Headers)
		if cap(d.arena)-len(d.arena) < n {
			d.arena = make([]byte, 0, max(64<<10, n)) // earlier records keep the old one
		}
		at := len(d.arena)
		d.arena = append(d.arena, r.Key...)
		d.arena = append(d.arena, r.Value...)
		d.arena = append(d.arena, r.Headers...)
		b := d.arena[at:len(d.arena):len(d.arena)]
		kv := len(r.Key) + len(r.Value)
		r.Key, r.Value = b[:len(r.Key):len(r.Key)], b[len(r.Key):kv:kv]
		if len(r.Headers) > 0 {
			r.Headers = b[kv:]
		}
		held = append(held, r)
	}
	return held
}

// release sends the held records on; drop forgets them.
func (d *deadLetters) release(emit Emitter) {
	if len(d.held) > 0 {
		emit(d.held)
	}
	for i := 0; i < len(d.heldSide); {
		j := i + 1
		for j < len(d.heldSide) && d.sideNames[j] == d.sideNames[i] {
			j++
		}
		d.t.emitTo(d.sideNames[i], d.heldSide[i:j])
		i = j
	}
	d.drop()
}

func (d *deadLetters) drop() {
	clear(d.held)
	clear(d.heldSide)
	d.held, d.arena = d.held[:0], d.arena[:0]
	d.heldSide, d.sideNames = d.heldSide[:0], d.sideNames[:0]
}

// failed handles record r of input that made the guest fail with cause:
// it counts it, fails past max_dead_letters, and skips it or writes it to
// the dead-letter sink.
func (d *deadLetters) failed(ctx context.Context, input int, r abi.Record, cause error) error {
	reason := cause.Error()
	var he *host.Error
	if errors.As(cause, &he) {
		reason = he.Reason()
	}
	d.count++
	d.t.stats.dead.Add(1)
	d.t.om.DeadLetter(ctx, d.spec.Mode)
	if err := d.limit(reason); err != nil {
		return err
	}
	if d.sink == nil {
		d.t.j.opts.Logger.Warn("record skipped (on_error skip)", "operator", d.t.v.UID, "subtask", d.t.sub, "error", reason)
		return nil
	}
	dl := DeadLetter{Job: d.t.info.Job, Operator: d.t.v.UID, Subtask: d.t.sub, Attempt: d.t.info.Attempt,
		CheckpointID: d.checkpoint, Input: input, Error: reason, Rejected: he != nil && he.Kind == host.ErrRejected}
	dl.Key, dl.KeyBase64 = textOrBase64(r.Key)
	dl.Value, dl.ValueBase64 = textOrBase64(r.Value)
	if r.Timestamp != abi.NoTimestamp {
		ts := r.Timestamp
		dl.Timestamp = &ts
	}
	v, err := json.Marshal(dl)
	if err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	if err := d.sink.Write([]abi.Record{{Key: r.Key, Value: v, Timestamp: r.Timestamp}}); err != nil {
		return fmt.Errorf("dead-letter sink: %w", err)
	}
	return nil
}

func textOrBase64(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return "", base64.StdEncoding.EncodeToString(b)
}

// limit fails the subtask once it is past max_dead_letters.
func (d *deadLetters) limit(reason string) error {
	l := d.spec.Max
	if l.Count == 0 {
		return nil
	}
	if l.Per == 0 {
		if d.count > l.Count {
			return fmt.Errorf("max_dead_letters %s exceeded: %d records made the guest fail (on_error %s); the last: %s", l, d.count, d.spec.Mode, reason)
		}
		return nil
	}
	now := time.Now()
	k := 0
	for k < len(d.recent) && now.Sub(d.recent[k]) >= l.Per {
		k++
	}
	d.recent = append(d.recent[:0], d.recent[k:]...)
	d.recent = append(d.recent, now)
	if int64(len(d.recent)) > l.Count {
		return fmt.Errorf("max_dead_letters %s exceeded: %d records made the guest fail within %s (on_error %s); the last: %s", l, len(d.recent), l.Per, d.spec.Mode, reason)
	}
	return nil
}

// openSink opens the dead-letter sink (dead_letter only) and commits the
// pending data of the checkpoint the subtask restores from.
func (d *deadLetters) openSink() error {
	if d.open == nil {
		return nil
	}
	sink, err := d.open()
	if err != nil {
		return fmt.Errorf("dead-letter sink: %w", err)
	}
	d.sink = sink
	if tp, ok := sink.(connector.TwoPhaseSink); ok {
		if err := tp.CommitPending(d.pending); err != nil {
			return fmt.Errorf("dead-letter sink: %w", err)
		}
	}
	return nil
}

// commitRestored commits the restored pending data of a subtask deployed as
// finished, whose operator does not run.
func (d *deadLetters) commitRestored() error {
	if d.open == nil || len(d.pending) == 0 {
		return nil
	}
	if err := d.openSink(); err != nil {
		return err
	}
	return d.close()
}

// preCommit seals the dead letters up to checkpoint id; the result goes
// into the subtask's state.
func (d *deadLetters) preCommit(id int64) ([]byte, error) {
	d.checkpoint = id
	tp, ok := d.sink.(connector.TwoPhaseSink)
	if !ok {
		return nil, nil
	}
	st, err := tp.PreCommit(id)
	if err != nil {
		return nil, fmt.Errorf("dead-letter sink: %w", err)
	}
	return st, nil
}

func (d *deadLetters) commit(id int64) error {
	if tp, ok := d.sink.(connector.TwoPhaseSink); ok {
		if err := tp.Commit(id); err != nil {
			return fmt.Errorf("dead-letter sink: %w", err)
		}
	}
	return nil
}

// finish commits everything when the job does not checkpoint (a
// checkpointing job's final checkpoint commits the rest).
func (d *deadLetters) finish() error {
	if tp, ok := d.sink.(connector.TwoPhaseSink); ok && !d.t.ckpt {
		if err := tp.CommitFinal(); err != nil {
			return fmt.Errorf("dead-letter sink: %w", err)
		}
	}
	return nil
}

func (d *deadLetters) close() error {
	if d.sink == nil {
		return nil
	}
	err := d.sink.Close()
	d.sink = nil
	return err
}

// newDeadLetters makes the on_error side of wasm operator subtask t.
func (j *job) newDeadLetters(t *task, oe *jobfile.OnError, pending [][]byte) *deadLetters {
	d := &deadLetters{t: t, spec: oe, pending: pending}
	if j.restore != nil {
		d.checkpoint = j.restore.Metadata.ID
	}
	if s := oe.DeadLetter; s != nil && oe.Mode == jobfile.OnErrorDeadLetter {
		env := j.sinkEnv(t, t.v.UID+".dead_letter")
		d.open = func() (connector.Sink, error) { return connector.NewSink(s, env) }
	}
	return d
}
