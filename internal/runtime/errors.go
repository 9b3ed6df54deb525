package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"

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
func isHostError(err error) bool {
	var he *host.Error
	return errors.As(err, &he)
}
