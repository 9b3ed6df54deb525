// Package abi is the contract between the streamd host and a Wasm guest
// operator: export and import names, status codes, event-time constants and the
// binary framing of records, batches and the open context. ABI.md beside this
// file is the normative text; this package mirrors it in Go and imports only
// the standard library.
package abi

import (
	"errors"
	"fmt"
	"math"
)

// Version is the ABI version a guest must report from ExportABIVersion.
const Version = 1

// ImportModule is the Wasm module name of every host import.
const ImportModule = "streamd_v1"

// Guest exports.
const (
	ExportABIVersion       = "streamd_abi_version"                // () -> i32
	ExportAlloc            = "streamd_alloc"                      // (size i32) -> ptr i32
	ExportOpen             = "streamd_open"                       // (ctx_ptr, ctx_len i32) -> status
	ExportProcess          = "streamd_process"                    // (input, batch_ptr, batch_len i32) -> status
	ExportOnWatermark      = "streamd_on_watermark"               // (ts i64) -> status
	ExportOnTimer          = "streamd_on_timer"                   // (ts i64, key_ptr, key_len i32) -> status
	ExportEndInput         = "streamd_end_input"                  // (input i32) -> status
	ExportFinish           = "streamd_finish"                     // () -> status
	ExportSnapshotState    = "streamd_snapshot_state"             // (checkpoint_id i64) -> status
	ExportNotifyCheckpoint = "streamd_notify_checkpoint_complete" // (checkpoint_id i64) -> status
	ExportClose            = "streamd_close"                      // () -> status
)

// Processing-time timers (additions to version 1, optional).
const (
	ExportOnProcessingTime = "streamd_on_processing_time" // (ts i64, key_ptr, key_len i32) -> status
	// ExportRecordHeaders is never called: a guest that exports it reads
	// record headers, and the host passes them in its batches (ABI.md,
	// "Record headers"). A guest without it gets its records without them.
	ExportRecordHeaders = "streamd_record_headers" // () -> ()
)

// Host imports, all in module ImportModule.
const (
	ImportEmit             = "emit"              // (batch_ptr, batch_len i32)
	ImportStateGet         = "state_get"         // (name_ptr, name_len, key_ptr, key_len, buf_ptr, buf_cap i32) -> i32
	ImportStatePut         = "state_put"         // (name_ptr, name_len, key_ptr, key_len, val_ptr, val_len i32)
	ImportStateDelete      = "state_delete"      // (name_ptr, name_len, key_ptr, key_len i32)
	ImportListStateAdd     = "list_state_add"    // (name_ptr, name_len, mode, val_ptr, val_len i32)
	ImportListStateGet     = "list_state_get"    // (name_ptr, name_len, index, buf_ptr, buf_cap i32) -> i32
	ImportTimerRegister    = "timer_register"    // (key_ptr, key_len i32, ts i64)
	ImportTimerDelete      = "timer_delete"      // (key_ptr, key_len i32, ts i64)
	ImportCurrentWatermark = "current_watermark" // () -> i64
	ImportLog              = "log"               // (level, msg_ptr, msg_len i32)
	ImportFail             = "fail"              // (msg_ptr, msg_len i32), never returns
	ImportReject           = "reject"            // (msg_ptr, msg_len i32): the reason of a StatusReject
)

// Host imports for watermarks and side outputs (issue 14, ABI.md "Watermarks
// and side outputs"), optional like every import.
const (
	ImportEmitWatermark  = "emit_watermark"  // (ts i64): the operator's own output watermark
	ImportInputWatermark = "input_watermark" // (input i32) -> i64: the watermark of one input
	ImportEmitTo         = "emit_to"         // (name_ptr, name_len, batch_ptr, batch_len i32): a batch to a side output
)

// MaxOutputNameLen bounds a side output's name (emit_to, job file OP.OUTPUT).
const MaxOutputNameLen = 128

// CheckOutputName reports whether name is a valid side-output name: 1 to
// MaxOutputNameLen letters, digits, '-' and '_'.
func CheckOutputName(name string) error {
	if name == "" {
		return errors.New("empty side-output name")
	}
	if len(name) > MaxOutputNameLen {
		return fmt.Errorf("side-output name of %d bytes, over %d", len(name), MaxOutputNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("side-output name %q: byte %d (%q) is not a letter, digit, '-' or '_'", name, i, c)
		}
	}
	return nil
}

// Structured keyed state and processing time (additions to version 1,
// optional imports; ABI.md "Structured keyed state", "Processing time").
const (
	ImportMStateGet      = "mstate_get"      // (name_ptr, name_len, key_ptr, key_len, ns_ptr, ns_len, ukey_ptr, ukey_len, buf_ptr, buf_cap i32) -> i32
	ImportMStatePut      = "mstate_put"      // (name_ptr, name_len, key_ptr, key_len, ns_ptr, ns_len, ukey_ptr, ukey_len, val_ptr, val_len i32)
	ImportMStateAppend   = "mstate_append"   // (name_ptr, name_len, key_ptr, key_len, ns_ptr, ns_len, ukey_ptr, ukey_len, val_ptr, val_len i32)
	ImportMStateRemove   = "mstate_remove"   // (name_ptr, name_len, key_ptr, key_len, ns_ptr, ns_len, ukey_ptr, ukey_len i32)
	ImportMStateEntries  = "mstate_entries"  // (name_ptr, name_len, key_ptr, key_len, ns_ptr, ns_len, buf_ptr, buf_cap i32) -> i32
	ImportMStateClear    = "mstate_clear"    // (name_ptr, name_len, key_ptr, key_len, ns_ptr, ns_len i32)
	ImportStateTTL       = "state_ttl"       // (name_ptr, name_len i32, ttl_ms i64, flags i32)
	ImportPTimerRegister = "ptimer_register" // (key_ptr, key_len i32, ts i64)
	ImportPTimerDelete   = "ptimer_delete"   // (key_ptr, key_len i32, ts i64)
	ImportProcessingTime = "processing_time" // () -> i64; needs allow_clock
)

// TTLUpdateOnRead is the state_ttl flag (bit 0) that makes reads refresh an
// entry's expiry too.
const TTLUpdateOnRead int32 = 1

// Status is what every lifecycle export returns.
type Status int32

const (
	StatusOK           Status = 0 // the call succeeded
	StatusError        Status = 1 // the guest failed; it should have called fail with the reason
	StatusInvalidInput Status = 2 // the guest could not decode a frame the host passed
	// StatusReject (streamd_process only): the guest rejects a record of
	// the batch on purpose, with the reason it gave to ImportReject. The
	// host handles it as the operator's on_error says.
	StatusReject Status = 3
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusError:
		return "error"
	case StatusInvalidInput:
		return "invalid input"
	case StatusReject:
		return "reject"
	}
	return "unknown status"
}

// ListMode says how an operator list state is redistributed on restore.
type ListMode int32

const (
	ListSplit     ListMode = 0 // entries are divided among the new subtasks (round robin)
	ListUnion     ListMode = 1 // every new subtask gets all entries of all old subtasks
	ListBroadcast ListMode = 2 // every subtask wrote the same entries; each new subtask gets one copy
)

func (m ListMode) String() string {
	switch m {
	case ListSplit:
		return "split"
	case ListUnion:
		return "union"
	case ListBroadcast:
		return "broadcast"
	}
	return "unknown"
}

// Valid reports whether m is one of the defined modes.
func (m ListMode) Valid() bool { return m >= ListSplit && m <= ListBroadcast }

// LogLevel is the level argument of the log import.
type LogLevel int32

const (
	LogDebug LogLevel = 0
	LogInfo  LogLevel = 1
	LogWarn  LogLevel = 2
	LogError LogLevel = 3
)

// Phase names the lifecycle step a call belongs to; errors carry it.
type Phase string

const (
	PhaseLoad      Phase = "load"
	PhaseOpen      Phase = "open"
	PhaseProcess   Phase = "process"
	PhaseWatermark Phase = "on_watermark"
	PhaseTimer     Phase = "on_timer"
	PhaseEndInput  Phase = "end_input"
	PhaseFinish    Phase = "finish"
	PhaseSnapshot  Phase = "snapshot_state"
	PhaseNotify    Phase = "notify_checkpoint_complete"
	PhaseClose     Phase = "close"
)

// PhaseProcessingTime is streamd_on_processing_time (a processing-time
// timer fires), an addition to version 1.
const PhaseProcessingTime Phase = "on_processing_time"

// Event time, in milliseconds since the Unix epoch.
const (
	// NoTimestamp marks a record without an event timestamp.
	NoTimestamp int64 = math.MinInt64
	// MinWatermark is the watermark before any was received.
	MinWatermark int64 = math.MinInt64
	// MaxWatermark is the watermark that ends event time: every timer fires.
	MaxWatermark int64 = math.MaxInt64
)

// AbsentLength is what state_get and list_state_get return when there is no value.
const AbsentLength int32 = -1

// DefaultMaxParallelism is the number of key groups when a job sets none.
const DefaultMaxParallelism = 128

// Record size limit: a record's size is its key and value bytes
// (len(key)+len(value)); the job's max_record_bytes bounds it wherever a
// record enters or travels (sources, emits, channels).
const (
	// DefaultMaxRecordBytes is max_record_bytes when neither the job file nor
	// the configuration sets it: 64 MiB.
	DefaultMaxRecordBytes = 64 << 20
	// MaxMaxRecordBytes is the largest max_record_bytes accepted: 1 GiB
	// (frames carry u32 lengths, and a guest's memory is at most 4 GiB).
	MaxMaxRecordBytes = 1 << 30
)

// ErrRecordTooLarge is wrapped by every refusal of a record larger than
// max_record_bytes.
var ErrRecordTooLarge = errors.New("record too large")

// RecordBytes is the size max_record_bytes bounds: the key, value and header
// bytes of r.
func RecordBytes(r Record) int { return len(r.Key) + len(r.Value) + len(r.Headers) }

// CheckRecordBytes returns an error wrapping ErrRecordTooLarge, naming the
// record's size and the limit, if r is larger than max bytes.
func CheckRecordBytes(r Record, max int) error {
	if n := RecordBytes(r); n > max {
		if len(r.Headers) > 0 {
			return fmt.Errorf("%w: a record of %d bytes (key %d, value %d, headers %d) is over max_record_bytes %d", ErrRecordTooLarge, n, len(r.Key), len(r.Value), len(r.Headers), max)
		}
		return fmt.Errorf("%w: a record of %d bytes (key %d, value %d) is over max_record_bytes %d", ErrRecordTooLarge, n, len(r.Key), len(r.Value), max)
	}
	return nil
}

// CheckMaxRecordBytes validates a max_record_bytes setting named key (the
// job-file field or configuration key, for the error).
func CheckMaxRecordBytes(key string, v int64) error {
	if v < 1 || v > MaxMaxRecordBytes {
		return fmt.Errorf("%s: %d bytes: want 1 to %d (1 GiB); the default is %d (64 MiB)", key, v, MaxMaxRecordBytes, DefaultMaxRecordBytes)
	}
	return nil
}

// RequiredExports must be exported by every guest; the others are optional and
// treated as returning StatusOK when absent.
var RequiredExports = []string{ExportABIVersion, ExportAlloc, ExportOpen, ExportProcess, ExportClose}

// ValueType is a Wasm value type in a signature.
type ValueType byte

const (
	I32 ValueType = 0x7f
	I64 ValueType = 0x7e
)

// Signature is the parameter and result types of an export or import.
type Signature struct {
	Params  []ValueType
	Results []ValueType
}

// ExportSignatures are the exact signatures the host checks at load time.
var ExportSignatures = map[string]Signature{
	ExportABIVersion:       {nil, []ValueType{I32}},
	ExportAlloc:            {[]ValueType{I32}, []ValueType{I32}},
	ExportOpen:             {[]ValueType{I32, I32}, []ValueType{I32}},
	ExportProcess:          {[]ValueType{I32, I32, I32}, []ValueType{I32}},
	ExportOnWatermark:      {[]ValueType{I64}, []ValueType{I32}},
	ExportOnTimer:          {[]ValueType{I64, I32, I32}, []ValueType{I32}},
	ExportEndInput:         {[]ValueType{I32}, []ValueType{I32}},
	ExportFinish:           {nil, []ValueType{I32}},
	ExportSnapshotState:    {[]ValueType{I64}, []ValueType{I32}},
	ExportNotifyCheckpoint: {[]ValueType{I64}, []ValueType{I32}},
	ExportClose:            {nil, []ValueType{I32}},
	ExportOnProcessingTime: {[]ValueType{I64, I32, I32}, []ValueType{I32}},
	ExportRecordHeaders:    {nil, nil},
}
