package host

import (
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/abi"
)

// Sentinel kinds of *Error. Match them with errors.Is.
var (
	// ErrTrap: the guest trapped (unreachable, out-of-bounds access, divide by
	// zero, stack overflow, or a panic turned into a trap).
	ErrTrap = errors.New("host: guest trapped")
	// ErrGuestFailed: the guest called fail, or an export returned a non-zero status.
	ErrGuestFailed = errors.New("host: guest failed")
	// ErrDeadline: the guest code of one call ran longer than the call
	// deadline (WithCallDeadline) and the instance was stopped.
	ErrDeadline = errors.New("host: call deadline exceeded")
	// ErrCanceled: the caller's context was done during a guest call; the
	// guard (guard.go) stops guest code within 16384 loop iterations.
	ErrCanceled = errors.New("host: guest call canceled")
	// ErrMemoryLimit: the guest ran out of memory under the instance memory limit.
	ErrMemoryLimit = errors.New("host: guest memory limit exceeded")
	// ErrExit: the guest called WASI proc_exit (a Go runtime's fatal error or panic).
	ErrExit = errors.New("host: guest exited")
	// ErrInstanceDiscarded: the instance failed (or was closed) earlier and is never called again.
	ErrInstanceDiscarded = errors.New("host: instance discarded")
	// ErrBadModule: the module was refused at load time.
	ErrBadModule = errors.New("host: bad module")
	// ErrHostCall: the guest misused a host import (phase, key range, frame, pointer).
	ErrHostCall = errors.New("host: host import misused")
	// ErrRejected: streamd_process returned abi.StatusReject: the guest
	// rejected a record of the batch on purpose (Message: its reason).
	ErrRejected = errors.New("host: guest rejected a record")
)

// kindLabel is the short text Error() shows for each kind.
func kindLabel(kind error) string {
	switch kind {
	case ErrTrap:
		return "guest trap"
	case ErrGuestFailed:
		return "guest failed"
	case ErrDeadline:
		return "call deadline exceeded"
	case ErrCanceled:
		return "call canceled"
	case ErrMemoryLimit:
		return "memory limit exceeded"
	case ErrExit:
		return "guest exited"
	case ErrInstanceDiscarded:
		return "instance discarded"
	case ErrHostCall:
		return "host import misused"
	case ErrState:
		return "state backend failed"
	case ErrRejected:
		return "record rejected"
	case nil:
		return "error"
	}
	return kind.Error()
}

// Error is what every failure inside a subtask's instance returns. Kind is one
// of the sentinels above; errors.Is(err, host.ErrTrap) etc. match it.
type Error struct {
	Job, Operator string
	Subtask       int
	Parallelism   int
	Phase         abi.Phase
	Kind          error  // one of the sentinels
	Message       string // guest message (fail / panic text) or trap text
	Stack         string // wasm stack trace, if any
	Stderr        string // last lines the guest wrote to stderr
	cause         error  // the wazero error, if any

	recordedOn trace.SpanContext // the span it was last recorded on (trace.go)
}

// Error renders like
//
//	streamd: job "wc" operator "count" subtask 1/4 phase process: guest failed: boom
//
// followed by "\nwasm stack trace:\n..." and "\nguest stderr:\n..." when present.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "streamd: job %q operator %q subtask %d/%d phase %s: %s",
		e.Job, e.Operator, e.Subtask, e.Parallelism, e.Phase, kindLabel(e.Kind))
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.Stack != "" {
		b.WriteString("\nwasm stack trace:\n")
		b.WriteString(e.Stack)
	}
	if e.Stderr != "" {
		b.WriteString("\nguest stderr:\n")
		b.WriteString(e.Stderr)
	}
	return b.String()
}

// Reason is the kind and the message, without the names, the stack and the
// stderr lines: "guest trap: integer divide by zero".
func (e *Error) Reason() string {
	if e.Message == "" {
		return kindLabel(e.Kind)
	}
	return kindLabel(e.Kind) + ": " + e.Message
}

// Unwrap returns the kind sentinel and the underlying wazero error, if any.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.Kind, e.cause}
	}
	return []error{e.Kind}
}

// badModule builds a load-time refusal naming the module and the rule it broke.
func badModule(name, format string, args ...any) error {
	return fmt.Errorf("%w %s: %s", ErrBadModule, name, fmt.Sprintf(format, args...))
}

// hostCallPanic is what host functions panic with to fail the calling guest.
type hostCallPanic struct {
	kind error
	msg  string
}

func (p *hostCallPanic) Error() string { return p.msg }

// splitTrace separates wazero's "msg\nwasm stack trace:\n\t..." error text.
func splitTrace(s string) (msg, stack string) {
	const marker = "\nwasm stack trace:\n"
	if i := strings.Index(s, marker); i >= 0 {
		msg, stack = s[:i], s[i+len(marker):]
		// drop wazero's Go runtime trace for host-function panics
		if j := strings.Index(stack, "\n\nGo runtime stack trace:"); j >= 0 {
			stack = stack[:j]
		}
		lines := strings.Split(stack, "\n")
		for k, l := range lines {
			lines[k] = strings.TrimPrefix(l, "\t")
		}
		if len(lines) > 0 && strings.HasPrefix(lines[0], guardModule+".") {
			lines = lines[1:] // the guard's yield (guard.go), not the guest's
		}
		return msg, strings.TrimRight(strings.Join(lines, "\n"), "\n")
	}
	return s, ""
}
