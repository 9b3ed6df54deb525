package control

import (
	"errors"
	"fmt"
)

// ErrNonRecoverable marks a failure that no restart can fix, as Flink's
// SuppressRestartsException does: a bad configuration or path found when a
// subtask opens (a file sink under /proc), a checkpoint state the job
// refuses (a pending file named ../x), a module that cannot be
// instantiated. The component that finds such a failure wraps its error
// with NonRecoverable; the Lifecycle then fails the job at once, whatever
// its restart strategy. Match it with errors.Is.
var ErrNonRecoverable = errors.New("no restart can fix it")

// NonRecoverable marks err as non-recoverable: errors.Is(result,
// ErrNonRecoverable) holds, and so does every errors.Is and errors.As of
// err. Its text is err's. NonRecoverable(nil) is nil.
func NonRecoverable(err error) error {
	if err == nil {
		return nil
	}
	return &nonRecoverable{err: err}
}

type nonRecoverable struct{ err error }

func (e *nonRecoverable) Error() string   { return e.err.Error() }
func (e *nonRecoverable) Unwrap() []error { return []error{e.err, ErrNonRecoverable} }

// FailureClass says what a restart can do about an attempt's failure
// (AttemptFailed.Class).
type FailureClass uint8

const (
	// FailureRestartable: a restart may fix it (a trap, a lost channel); the
	// restart strategy decides.
	FailureRestartable FailureClass = iota
	// FailureInOpen: a subtask failed while it opened. A restart may fix it
	// (a broker not up yet), but when LifecycleConfig.OpenFailureLimit
	// attempts in a row fail in open with the same reason, the job fails
	// (or earlier, when the restart strategy gives up first).
	FailureInOpen
	// FailureNonRecoverable: no restart can fix it (ErrNonRecoverable); the
	// job fails at once.
	FailureNonRecoverable
)

func (c FailureClass) String() string {
	switch c {
	case FailureRestartable:
		return "restartable"
	case FailureInOpen:
		return "in-open"
	case FailureNonRecoverable:
		return "non-recoverable"
	}
	return fmt.Sprintf("FailureClass(%d)", uint8(c))
}

// ParseFailureClass is the inverse of FailureClass.String.
func ParseFailureClass(s string) (FailureClass, error) {
	for c := FailureRestartable; c <= FailureNonRecoverable; c++ {
		if c.String() == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("control: unknown failure class %q (want restartable, in-open or non-recoverable)", s)
}

// ClassOf is the class of err: FailureNonRecoverable when it matches
// ErrNonRecoverable, FailureInOpen when inOpen (the failing subtask was
// opening), else FailureRestartable.
func ClassOf(err error, inOpen bool) FailureClass {
	switch {
	case errors.Is(err, ErrNonRecoverable):
		return FailureNonRecoverable
	case inOpen:
		return FailureInOpen
	}
	return FailureRestartable
}

// DefaultOpenFailureLimit is LifecycleConfig.OpenFailureLimit when unset.
const DefaultOpenFailureLimit = 3
