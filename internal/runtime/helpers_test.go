package runtime

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
)

// upper is a native map operator: it uppercases values (ASCII), emitting one
// batch per input batch from a reused buffer.
type upper struct {
	out []abi.Record
	buf []byte
	noop
}

func newUpper(SubtaskInfo) NativeOperator { return &upper{} }

func (u *upper) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	u.out = u.out[:0]
	u.buf = u.buf[:0]
	for _, r := range recs {
		u.buf = append(u.buf, r.Value...)
	}
	for i := range u.buf {
		if c := u.buf[i]; c >= 'a' && c <= 'z' {
			u.buf[i] = c - 32
		}
	}
	off := 0
	for _, r := range recs {
		n := len(r.Value)
		u.out = append(u.out, abi.Record{Key: r.Key, Value: u.buf[off : off+n], Timestamp: r.Timestamp})
		off += n
	}
	emit(u.out)
	return nil
}

// noop implements the lifecycle methods an operator does not care about.
type noop struct{}

func (noop) Open(context.Context, SubtaskInfo) error                   { return nil }
func (noop) AdvanceWatermark(context.Context, int64, Emitter) error    { return nil }
func (noop) EndInput(context.Context, int, Emitter) error              { return nil }
func (noop) Finish(context.Context, Emitter) error                     { return nil }
func (noop) Close(context.Context) error                               { return nil }
func (noop) Process(context.Context, int, []abi.Record, Emitter) error { return nil }

// collector is a sink-like native operator that keeps what it receives and
// the lifecycle calls it saw.
type collector struct {
	mu   sync.Mutex
	subs map[int]*collected
}

type collected struct {
	info    SubtaskInfo
	recs    []string // "key|value|ts|input"
	calls   []string // lifecycle: open, wm:<ts>, end_input:<i>, finish, close
	records int
}

func newCollector() *collector { return &collector{subs: map[int]*collected{}} }

func (c *collector) factory(info SubtaskInfo) NativeOperator {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &collected{info: info}
	c.subs[info.Subtask] = s
	return &collectOp{s: s}
}

type collectOp struct{ s *collected }

func (o *collectOp) Open(_ context.Context, info SubtaskInfo) error {
	o.s.calls = append(o.s.calls, "open")
	return nil
}

func (o *collectOp) Process(_ context.Context, input int, recs []abi.Record, _ Emitter) error {
	if len(o.s.calls) == 0 || o.s.calls[0] != "open" {
		return fmt.Errorf("process before open")
	}
	for _, r := range recs {
		o.s.recs = append(o.s.recs, fmt.Sprintf("%s|%s|%d|%d", r.Key, r.Value, r.Timestamp, input))
	}
	o.s.records += len(recs)
	return nil
}

func (o *collectOp) AdvanceWatermark(_ context.Context, ts int64, _ Emitter) error {
	if ts == abi.MaxWatermark {
		o.s.calls = append(o.s.calls, "wm:MAX")
	} else {
		o.s.calls = append(o.s.calls, fmt.Sprintf("wm:%d", ts))
	}
	return nil
}

func (o *collectOp) EndInput(_ context.Context, input int, _ Emitter) error {
	o.s.calls = append(o.s.calls, fmt.Sprintf("end_input:%d", input))
	return nil
}

func (o *collectOp) Finish(context.Context, Emitter) error {
	o.s.calls = append(o.s.calls, "finish")
	return nil
}

func (o *collectOp) Close(context.Context) error {
	o.s.calls = append(o.s.calls, "close")
	return nil
}

func genSpec(count int64) *jobfile.SourceSpec {
	return &jobfile.SourceSpec{Type: "generator", Count: count, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 13, TSStep: 1}
}

func src(uid string, p int, spec any) *control.Vertex {
	return &control.Vertex{UID: uid, Parallelism: p, Kind: control.KindSource, Spec: spec}
}

func op(uid string, p int, spec any, inputs ...control.Edge) *control.Vertex {
	return &control.Vertex{UID: uid, Parallelism: p, Kind: control.KindOperator, Spec: spec, Inputs: inputs}
}

func sink(uid string, p int, spec any, inputs ...control.Edge) *control.Vertex {
	return &control.Vertex{UID: uid, Parallelism: p, Kind: control.KindSink, Spec: spec, Inputs: inputs}
}

func in(from string, p control.Partitioning) control.Edge {
	return control.Edge{From: from, Partition: p}
}

func graph(t testing.TB, vs ...*control.Vertex) *control.JobGraph {
	t.Helper()
	g, err := control.NewJobGraph("test", vs)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func upperASCII(s string) string { return string(bytes.ToUpper([]byte(s))) }
