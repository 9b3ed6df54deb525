// Package abi is the contract between the streamd host and a Wasm guest
// operator: export and import names, status codes, event-time constants and the
// binary framing of records, batches and the open context. ABI.md beside this
// file is the normative text; this package mirrors it in Go and imports only
// the standard library.
package abi

import "math"

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
)

// Status is what every lifecycle export returns.
type Status int32

const (
	StatusOK           Status = 0 // the call succeeded
	StatusError        Status = 1 // the guest failed; it should have called fail with the reason
	StatusInvalidInput Status = 2 // the guest could not decode a frame the host passed
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusError:
		return "error"
	case StatusInvalidInput:
		return "invalid input"
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
}
