// Package windowsop is the operator of the windows test guest: the Go SDK's
// window library and typed state, configured from the open context, so that
// sdk/gotest can run one scenario natively on the streamdtest harness and as
// a Wasm module in the host and compare the two.
//
// Config: kind (tumbling, sliding, session, ptumbling, psession), size, slide,
// gap, lateness (milliseconds). Each fired window emits
// "values joined by commas|[start, end)|n" where n counts the records of
// the key so far (typed ValueState with TTL of one hour).
package windowsop

import (
	"errors"
	"strconv"
	"strings"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
)

// Op builds its window operator in Open.
type Op struct {
	*streamd.WindowOperator[string]
}

var seen = streamd.NewValueState("seen", streamd.Int64, streamd.WithTTL(time.Hour, streamd.UpdateOnCreateAndWrite))

// New returns the operator.
func New() *Op { return &Op{} }

func (o *Op) Open(ctx *streamd.Context) error {
	ms := func(key string) (time.Duration, error) {
		n, err := ctx.Config.Int(key, 0)
		return time.Duration(n) * time.Millisecond, err
	}
	size, err := ms("size")
	if err != nil {
		return err
	}
	slide, err := ms("slide")
	if err != nil {
		return err
	}
	gap, err := ms("gap")
	if err != nil {
		return err
	}
	lateness, err := ms("lateness")
	if err != nil {
		return err
	}
	var a streamd.WindowAssigner
	switch k := ctx.Config.String("kind", ""); k {
	case "tumbling":
		a = streamd.TumblingEventTimeWindows(size, 0)
	case "sliding":
		a = streamd.SlidingEventTimeWindows(size, slide)
	case "session":
		a = streamd.EventTimeSessionWindows(gap)
	case "ptumbling":
		a = streamd.TumblingProcessingTimeWindows(size, 0)
	case "psession":
		a = streamd.ProcessingTimeSessionWindows(gap)
	default:
		return errors.New("windowsop: unknown kind " + strconv.Quote(k))
	}
	o.WindowOperator = streamd.Window(a, streamd.String, streamd.ProcessWindow(emit), streamd.AllowedLateness(lateness))
	return o.WindowOperator.Open(ctx)
}

func emit(key []byte, w streamd.TimeWindow, elems []string, out *streamd.WindowOutput) error {
	n, _ := seen.Get()
	out.Emit([]byte(strings.Join(elems, ",") + "|" + w.String() + "|" + strconv.FormatInt(n, 10)))
	return nil
}

// ProcessElement counts the key's records, then hands the record to the
// windows.
func (o *Op) ProcessElement(r streamd.Record, input int) error {
	n, _ := seen.Get()
	seen.Set(n + 1)
	return o.WindowOperator.ProcessElement(r, input)
}
