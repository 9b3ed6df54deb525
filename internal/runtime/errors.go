package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

// Phases of a subtask besides the abi lifecycle phases.
const (
	phaseSetup     = "setup"      // building channels and operators
	phaseRead      = "read"       // a source reading its input
	phaseInput     = "input"      // receiving from the input channels
	phaseOutput    = "output"     // sending control events downstream
	phaseFinalWait = "final-wait" // waiting for the final checkpoint
)

// TaskError is a failure of one subtask outside a wasm instance (a wasm
// failure is a *host.Error, which names the same things).
type TaskError struct {
	Job, Operator string
	Subtask       int
	Parallelism   int
	Phase         string
	Err           error
}

func (e *TaskError) Error() string {
	return fmt.Sprintf("runtime: job %q operator %q subtask %d/%d phase %s: %v",
		e.Job, e.Operator, e.Subtask, e.Parallelism, e.Phase, e.Err)
}

func (e *TaskError) Unwrap() error { return e.Err }

// group runs goroutines, waits for all of them, and cancels the rest when the
// first one fails; that error becomes the context's cause.
type group struct {
	wg     sync.WaitGroup
	cancel context.CancelCauseFunc
}

func (g *group) Go(fn func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := fn(); err != nil {
			g.cancel(err) // only the first cause sticks
		}
	}()
}

func (g *group) Wait() { g.wg.Wait() }

// isHostError reports whether err is (or wraps) a *host.Error.
// FailureClass is what a restart can do about an attempt that failed with
// err (control.ClassOf): non-recoverable when the edge where it arose
// marked it so (control.NonRecoverable), in open when the failing subtask
// was opening (phase open, or loading its module), else restartable.
func FailureClass(err error) control.FailureClass {
	var te *TaskError
	var he *host.Error
	inOpen := (errors.As(err, &te) && te.Phase == string(abi.PhaseOpen)) ||
		(errors.As(err, &he) && (he.Phase == abi.PhaseOpen || he.Phase == abi.PhaseLoad))
	return control.ClassOf(err, inOpen)
}

// cannotInstantiate reports whether err, from instantiating a module, says
// that the module cannot be instantiated under this configuration whatever
// the attempt: its instantiation or _initialize trapped, exited or ran out
// of the memory limit (not a cancel, a deadline or a state restore).
func cannotInstantiate(err error) bool {
	var he *host.Error
	if !errors.As(err, &he) || he.Phase != abi.PhaseLoad {
		return false
	}
	return errors.Is(err, host.ErrTrap) || errors.Is(err, host.ErrMemoryLimit) || errors.Is(err, host.ErrExit) || errors.Is(err, host.ErrBadModule)
}

func isHostError(err error) bool {
	var he *host.Error
	return errors.As(err, &he)
}
