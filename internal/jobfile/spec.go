// Package jobfile reads and validates streamd job files (docs/job-file.md)
// and turns them into a control.JobGraph whose vertices carry the specs below.
package jobfile

import (
	"strconv"
	"time"

	"github.com/streamd/streamd/internal/connector"
)

// SourceSpec, SinkSpec and the watermark default are the connector
// package's (the connector registry owns what a source or sink is); the
// aliases keep the job-file vocabulary.
type (
	SourceSpec = connector.SourceSpec
	SinkSpec   = connector.SinkSpec
)

// DefaultWatermarkInterval is watermark.interval when a source sets none.
const DefaultWatermarkInterval = connector.DefaultWatermarkInterval

// WasmSpec is a user operator compiled to WebAssembly.
type WasmSpec struct {
	Path       string            // absolute path of the .wasm module
	Config     map[string]string // the operator's config, flattened to strings (abi.OpenContext.Config)
	AllowClock bool              // grant the guest a real wall clock
	OnError    *OnError          // on_error skip or dead_letter; nil: fail
}

// On-error modes of a wasm operator (on_error in a job file).
const (
	OnErrorFail       = "fail"        // a failing record fails the subtask (the default)
	OnErrorSkip       = "skip"        // the record that made the guest fail is dropped
	OnErrorDeadLetter = "dead_letter" // it goes to the operator's dead-letter sink
)

// OnErrorModes are the on_error values a job file may give.
var OnErrorModes = []string{OnErrorFail, OnErrorSkip, OnErrorDeadLetter}

// OnError is a wasm operator's handling of the records that make its guest
// fail (trap, fail, a non-zero status) or that it rejects (abi.StatusReject):
// on_error, dead_letter and max_dead_letters of its job-file entry.
type OnError struct {
	Mode string `json:"mode"` // OnErrorSkip or OnErrorDeadLetter
	// DeadLetter is where the failed records go with Mode OnErrorDeadLetter:
	// a two-phase-commit sink (file or nats).
	DeadLetter *SinkSpec `json:"dead_letter,omitempty"`
	// Max bounds the failed records; the zero value: no bound.
	Max DeadLetterLimit `json:"max,omitempty"`
}

// DeadLetterLimit is max_dead_letters: at most Count failed records per
// subtask, in all (Per 0) or within any window of Per. Count 0: no limit.
type DeadLetterLimit struct {
	Count int64         `json:"count,omitempty"`
	Per   time.Duration `json:"per,omitempty"`
}

// String spells the limit as a job file does: "100" or "100/1m0s".
func (l DeadLetterLimit) String() string {
	if l.Per == 0 {
		return strconv.FormatInt(l.Count, 10)
	}
	return strconv.FormatInt(l.Count, 10) + "/" + l.Per.String()
}
