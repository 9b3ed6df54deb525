package streamd_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/streamdtest"
)

// fnOp is an operator made of functions, for tests.
type fnOp struct {
	streamd.Base
	open      func(*streamd.Context) error
	process   func(r streamd.Record, input int) error
	timer     func(ts int64, key []byte) error
	ptime     func(ts int64, key []byte) error
	watermark func(ts int64) error
	snapshot  func(id int64) error
	finish    func() error
}

func (o *fnOp) Open(c *streamd.Context) error {
	if o.open != nil {
		return o.open(c)
	}
	return nil
}

func (o *fnOp) ProcessElement(r streamd.Record, input int) error {
	if o.process != nil {
		return o.process(r, input)
	}
	return nil
}

func (o *fnOp) OnTimer(ts int64, key []byte) error {
	if o.timer != nil {
		return o.timer(ts, key)
	}
	return nil
}

func (o *fnOp) OnProcessingTime(ts int64, key []byte) error {
	if o.ptime != nil {
		return o.ptime(ts, key)
	}
	return nil
}

func (o *fnOp) OnWatermark(ts int64) error {
	if o.watermark != nil {
		return o.watermark(ts)
	}
	return nil
}

func (o *fnOp) SnapshotState(id int64) error {
	if o.snapshot != nil {
		return o.snapshot(id)
	}
	return nil
}

func (o *fnOp) Finish() error {
	if o.finish != nil {
		return o.finish()
	}
	return nil
}

func rec(key, value string, ts int64) streamd.Record {
	return streamd.Record{Key: []byte(key), Value: []byte(value), Timestamp: ts}
}

func open(t *testing.T, op streamd.Operator, opts streamdtest.Options) *streamdtest.Harness {
	t.Helper()
	h := streamdtest.New(op, opts)
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// failsWith checks that err is a subtask failure whose message holds want.
func failsWith(t *testing.T, err error, want string) {
	t.Helper()
	var f *streamdtest.Failure
	if !errors.As(err, &f) {
		t.Fatalf("err %v, want a failure with %q", err, want)
	}
	if !strings.Contains(f.Msg, want) {
		t.Fatalf("failure %q does not say %q", f.Msg, want)
	}
}

// lines renders records as "key value @ts" lines.
func lines(recs []streamd.Record) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "%s %s @%d\n", r.Key, r.Value, r.Timestamp)
	}
	return b.String()
}

func wantOutput(t *testing.T, what string, got []streamd.Record, want string) {
	t.Helper()
	if g := lines(got); g != want {
		t.Fatalf("%s:\n%s\nwant:\n%s", what, g, want)
	}
}
