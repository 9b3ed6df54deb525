package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
)

// Metadata file format, version 1: one header line, then a JSON document of
// exactly SIZE bytes:
//
//	streamd-checkpoint v1 size=SIZE crc32c=HEX\n
//	{"version":1,"job":...}
//
// HEX is the CRC32C (Castagnoli) of the JSON bytes.
const metaHeaderPrefix = "streamd-checkpoint v"

// finished state names in the metadata file
var finishedNames = map[control.FinishedState]string{
	control.OperatorRunning:           "running",
	control.OperatorPartiallyFinished: "partially-finished",
	control.OperatorFullyFinished:     "fully-finished",
}

type operatorJSON struct {
	UID            string        `json:"uid"`
	Parallelism    int           `json:"parallelism"`
	MaxParallelism int           `json:"max_parallelism"`
	Finished       string        `json:"finished"`
	Subtasks       []SubtaskMeta `json:"subtasks"`
}

// MarshalJSON writes the finished state as a word.
func (o OperatorMeta) MarshalJSON() ([]byte, error) {
	name, ok := finishedNames[o.Finished]
	if !ok {
		return nil, fmt.Errorf("checkpoint: operator %q: invalid finished state %d", o.UID, o.Finished)
	}
	subs := o.Subtasks
	if subs == nil {
		subs = []SubtaskMeta{}
	}
	return json.Marshal(operatorJSON{o.UID, o.Parallelism, o.MaxParallelism, name, subs})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (o *OperatorMeta) UnmarshalJSON(b []byte) error {
	var j operatorJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	for st, name := range finishedNames {
		if name == j.Finished {
			*o = OperatorMeta{UID: j.UID, Parallelism: j.Parallelism, MaxParallelism: j.MaxParallelism, Finished: st, Subtasks: j.Subtasks}
			return nil
		}
	}
	return fmt.Errorf("operator %q: unknown finished state %q (want running, partially-finished or fully-finished)", j.UID, j.Finished)
}

// encodeMetadata returns the bytes of a _metadata file.
func encodeMetadata(md *Metadata) ([]byte, error) {
	if err := md.validate(); err != nil {
		return nil, err
	}
	body, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: encode metadata of checkpoint %d: %w", md.ID, err)
	}
	body = append(body, '\n')
	hdr := fmt.Sprintf("%s%d size=%d crc32c=%08x\n", metaHeaderPrefix, md.Version, len(body), crc32c(body))
	return append([]byte(hdr), body...), nil
}

// decodeMetadata parses a _metadata file; errors have no prefix (the
// caller names the file).
func decodeMetadata(data []byte) (*Metadata, error) {
	line, body, ok := bytes.Cut(data, []byte{'\n'})
	if !ok {
		if len(data) == 0 || bytes.HasPrefix([]byte(metaHeaderPrefix), data) || bytes.HasPrefix(data, []byte(metaHeaderPrefix)) {
			return nil, fmt.Errorf("truncated: %d bytes, no complete header line", len(data))
		}
		return nil, errors.New("not a streamd checkpoint metadata file")
	}
	var version, size int
	var sum uint32
	if n, err := fmt.Sscanf(string(line), metaHeaderPrefix+"%d size=%d crc32c=%x", &version, &size, &sum); n != 3 || err != nil {
		return nil, fmt.Errorf("not a streamd checkpoint metadata file (header %q)", truncate(string(line), 60))
	}
	if version < FormatVersion || version > FormatVersionShared {
		return nil, fmt.Errorf("format version %d, this streamd reads versions %d to %d", version, FormatVersion, FormatVersionShared)
	}
	switch {
	case len(body) < size:
		return nil, fmt.Errorf("truncated: %d of %d bytes", len(body), size)
	case len(body) > size:
		return nil, fmt.Errorf("%d bytes after the %d the header announces", len(body)-size, size)
	}
	if got := crc32c(body); got != sum {
		return nil, fmt.Errorf("checksum mismatch (crc32c %08x, header says %08x)", got, sum)
	}
	md := &Metadata{}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(md); err != nil {
		return nil, fmt.Errorf("bad JSON: %w", err)
	}
	if md.Version != version {
		return nil, fmt.Errorf("format version %d in the JSON, header says %d", md.Version, version)
	}
	if err := md.validate(); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "checkpoint: "))
	}
	return md, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// validate checks the invariants of md.
func (md *Metadata) validate() error {
	if md.Version < FormatVersion || md.Version > FormatVersionShared {
		return fmt.Errorf("checkpoint: metadata version %d, this streamd reads versions %d to %d", md.Version, FormatVersion, FormatVersionShared)
	}
	if md.ID < 1 {
		return fmt.Errorf("checkpoint: metadata: id %d, want >= 1", md.ID)
	}
	if md.Kind != control.KindCheckpoint && md.Kind != control.KindSavepoint {
		return fmt.Errorf("checkpoint: metadata of %d: kind %q, want checkpoint or savepoint", md.ID, md.Kind)
	}
	seen := map[string]bool{}
	for _, op := range md.Operators {
		if op.UID == "" || seen[op.UID] {
			return fmt.Errorf("checkpoint: metadata of %d: operator uid %q empty or repeated", md.ID, op.UID)
		}
		seen[op.UID] = true
		if op.Parallelism < 1 || op.MaxParallelism < op.Parallelism {
			return fmt.Errorf("checkpoint: metadata of %d: operator %q: parallelism %d, max parallelism %d", md.ID, op.UID, op.Parallelism, op.MaxParallelism)
		}
		if _, ok := finishedNames[op.Finished]; !ok {
			return fmt.Errorf("checkpoint: metadata of %d: operator %q: invalid finished state %d", md.ID, op.UID, op.Finished)
		}
		if op.Finished == control.OperatorFullyFinished && len(op.Subtasks) == 0 {
			continue
		}
		if len(op.Subtasks) != op.Parallelism {
			return fmt.Errorf("checkpoint: metadata of %d: operator %q has %d subtasks, parallelism %d", md.ID, op.UID, len(op.Subtasks), op.Parallelism)
		}
		for i, s := range op.Subtasks {
			if s.Index != i {
				return fmt.Errorf("checkpoint: metadata of %d: operator %q: subtask %d has index %d", md.ID, op.UID, i, s.Index)
			}
			if s.Ref != "" {
				if err := checkBlobName(s.Ref); err != nil {
					return fmt.Errorf("checkpoint: metadata of %d: operator %q subtask %d: %w", md.ID, op.UID, i, err)
				}
			}
			if s.Size < 0 || (s.Ref == "" && s.Size != 0) {
				return fmt.Errorf("checkpoint: metadata of %d: operator %q subtask %d: size %d with ref %q", md.ID, op.UID, i, s.Size, s.Ref)
			}
			if s.InFlightBytes < 0 || s.InFlightBytes > s.Size {
				return fmt.Errorf("checkpoint: metadata of %d: operator %q subtask %d: inflight_bytes %d with size %d", md.ID, op.UID, i, s.InFlightBytes, s.Size)
			}
			if s.InFlightBytes > 0 && md.Version < FormatVersionChannelState {
				return fmt.Errorf("checkpoint: metadata of %d: operator %q subtask %d: inflight_bytes in a version %d checkpoint (channel state needs version %d)", md.ID, op.UID, i, md.Version, FormatVersionChannelState)
			}
			if len(s.Shared) > 0 && (md.Version < FormatVersionShared || s.Ref == "" || md.Kind == control.KindSavepoint) {
				return fmt.Errorf("checkpoint: metadata of %d: operator %q subtask %d: shared files in a version %d %s (incremental checkpoints need version %d; savepoints are full)", md.ID, op.UID, i, md.Version, md.Kind, FormatVersionShared)
			}
			for _, r := range s.Shared {
				if err := checkSharedKey(r.Name); err != nil || r.Size < 0 {
					return fmt.Errorf("checkpoint: metadata of %d: operator %q subtask %d: %v (size %d)", md.ID, op.UID, i, err, r.Size)
				}
			}
		}
	}
	return nil
}

// neededVersion is the format version md needs: 2 when a subtask has
// channel state, else 1.
func (md *Metadata) neededVersion() int {
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			if len(s.Shared) > 0 {
				return FormatVersionShared
			}
		}
	}
	if md.InFlightBytes() > 0 {
		return FormatVersionChannelState
	}
	return FormatVersion
}

// checkBlobName refuses names that are not a plain file name.
func checkBlobName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") || strings.HasPrefix(name, "_") {
		return fmt.Errorf("bad state blob name %q", name)
	}
	return nil
}

// blobName is the file name of a subtask's state blob: op-UID-INDEX.state,
// the uid path-escaped.
func blobName(sub control.SubtaskID) string {
	return "op-" + url.PathEscape(sub.Operator) + "-" + strconv.Itoa(sub.Index) + ".state"
}

// Operator returns the operator with uid, or nil.
func (md *Metadata) Operator(uid string) *OperatorMeta {
	for i := range md.Operators {
		if md.Operators[i].UID == uid {
			return &md.Operators[i]
		}
	}
	return nil
}

// FinishedStates returns each operator's finished state by uid (for
// control.CheckRestore and control.DeployAsFinished).
func (md *Metadata) FinishedStates() map[string]control.FinishedState {
	out := make(map[string]control.FinishedState, len(md.Operators))
	for _, op := range md.Operators {
		out[op.UID] = op.Finished
	}
	return out
}

// InFlightBytes is the sum of the subtasks' channel-state bytes (0 for an
// aligned checkpoint).
func (md *Metadata) InFlightBytes() int64 { return md.sum(subtaskInFlight) }

// InFlightBytes is the sum of the operator's channel-state bytes.
func (o *OperatorMeta) InFlightBytes() int64 { return o.sum(subtaskInFlight) }

// StateSize is the sum of the state blob sizes.
func (md *Metadata) StateSize() int64 { return md.sum(subtaskSize) }

// StateSize is the sum of the operator's state blob sizes.
func (o *OperatorMeta) StateSize() int64 { return o.sum(subtaskSize) }

func subtaskSize(s *SubtaskMeta) int64     { return s.Size }
func subtaskInFlight(s *SubtaskMeta) int64 { return s.InFlightBytes }

func (md *Metadata) sum(f func(*SubtaskMeta) int64) int64 {
	var n int64
	for i := range md.Operators {
		n += md.Operators[i].sum(f)
	}
	return n
}

func (o *OperatorMeta) sum(f func(*SubtaskMeta) int64) int64 {
	var n int64
	for i := range o.Subtasks {
		n += f(&o.Subtasks[i])
	}
	return n
}

// FinishedSubtasks counts the finished subtasks (all, when fully finished).
func (o *OperatorMeta) FinishedSubtasks() int {
	if o.Finished == control.OperatorFullyFinished {
		return o.Parallelism
	}
	n := 0
	for _, s := range o.Subtasks {
		if s.Finished {
			n++
		}
	}
	return n
}

// FinishedString describes the finished state for people: "running",
// "partially (k of n)" or "fully".
func (o *OperatorMeta) FinishedString() string {
	switch o.Finished {
	case control.OperatorFullyFinished:
		return "fully"
	case control.OperatorPartiallyFinished:
		return fmt.Sprintf("partially (%d of %d)", o.FinishedSubtasks(), o.Parallelism)
	}
	return "running"
}

// NewMetadata builds the metadata of a control.PersistMetadata action for
// job graph g: every operator of g with its parallelism, each acknowledged
// state (Ack.StateRef is a BlobRef.String()), the finished subtasks and the
// operators' finished states. A fully finished operator keeps no subtasks
// unless a subtask acknowledged state (a two-phase-commit sink's pending
// data; see Reassign).
func NewMetadata(g *control.JobGraph, a control.PersistMetadata, now time.Time) (*Metadata, error) {
	md := &Metadata{Version: FormatVersion, Job: g.Name, ID: a.ID, Kind: a.Kind, Time: now.UTC()}
	if md.Kind == "" {
		md.Kind = control.KindCheckpoint
	}
	idx := map[string]int{}
	for _, v := range g.Vertices {
		maxP := v.MaxParallelism
		if maxP == 0 {
			maxP = abi.DefaultMaxParallelism
		}
		op := OperatorMeta{UID: v.UID, Parallelism: v.Parallelism, MaxParallelism: maxP, Subtasks: make([]SubtaskMeta, v.Parallelism)}
		for i := range op.Subtasks {
			op.Subtasks[i].Index = i
		}
		idx[v.UID] = len(md.Operators)
		md.Operators = append(md.Operators, op)
	}
	sub := func(id control.SubtaskID) (*SubtaskMeta, error) {
		i, ok := idx[id.Operator]
		if !ok || id.Index < 0 || id.Index >= md.Operators[i].Parallelism {
			return nil, fmt.Errorf("checkpoint: metadata of checkpoint %d: subtask %v is not in job %q", a.ID, id, g.Name)
		}
		return &md.Operators[i].Subtasks[id.Index], nil
	}
	for _, id := range a.Finished {
		s, err := sub(id)
		if err != nil {
			return nil, err
		}
		s.Finished = true
	}
	for _, ack := range a.Acks {
		s, err := sub(ack.Subtask)
		if err != nil {
			return nil, err
		}
		s.Finished = s.Finished || ack.Finished
		if ack.StateRef == "" {
			continue
		}
		ref, err := ParseBlobRef(ack.StateRef)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: metadata of checkpoint %d, subtask %v: %w", a.ID, ack.Subtask, err)
		}
		s.Ref, s.Size, s.CRC32C, s.InFlightBytes, s.Shared = ref.Name, ref.Size, ref.CRC32C, ref.InFlight, ref.Shared
		if ref.InFlight > 0 {
			md.Version = max(md.Version, FormatVersionChannelState)
		}
		if len(ref.Shared) > 0 {
			md.Version = FormatVersionShared
		}
	}
	for i := range md.Operators {
		op := &md.Operators[i]
		switch n := op.FinishedSubtasks(); {
		case slices.Contains(a.FullyFinished, op.UID) || n == op.Parallelism:
			op.Finished = control.OperatorFullyFinished
		case slices.Contains(a.PartiallyFinished, op.UID) || n > 0:
			op.Finished = control.OperatorPartiallyFinished
		}
		if op.Finished == control.OperatorFullyFinished {
			hasRef := false
			for j := range op.Subtasks {
				op.Subtasks[j].Finished = true
				hasRef = hasRef || op.Subtasks[j].Ref != ""
			}
			if !hasRef {
				op.Subtasks = nil
			}
		}
	}
	return md, md.validate()
}
