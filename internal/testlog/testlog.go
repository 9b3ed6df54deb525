// Package testlog is a slog.Handler for tests that keeps every record with
// its message, level and attributes (those of WithAttrs included).
package testlog

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// Record is one captured log record.
type Record struct {
	Msg, Level string
	Attrs      map[string]string
}

type sink struct {
	mu   sync.Mutex
	recs []Record
}

// Capture is the handler; loggers derived with With share its records.
type Capture struct {
	sink  *sink
	attrs []slog.Attr
}

// New returns an empty Capture.
func New() *Capture { return &Capture{sink: &sink{}} }

func (c *Capture) Enabled(context.Context, slog.Level) bool { return true }

func (c *Capture) Handle(_ context.Context, r slog.Record) error {
	lr := Record{Msg: r.Message, Level: r.Level.String(), Attrs: map[string]string{}}
	for _, a := range c.attrs {
		lr.Attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { lr.Attrs[a.Key] = a.Value.String(); return true })
	c.sink.mu.Lock()
	c.sink.recs = append(c.sink.recs, lr)
	c.sink.mu.Unlock()
	return nil
}

func (c *Capture) WithAttrs(as []slog.Attr) slog.Handler {
	return &Capture{sink: c.sink, attrs: append(slices.Clip(c.attrs), as...)}
}

func (c *Capture) WithGroup(string) slog.Handler { return c }

// Records returns every record so far.
func (c *Capture) Records() []Record {
	c.sink.mu.Lock()
	defer c.sink.mu.Unlock()
	return slices.Clone(c.sink.recs)
}

// Matching returns the records whose attribute key is value.
func (c *Capture) Matching(key, value string) []Record {
	var out []Record
	for _, r := range c.Records() {
		if r.Attrs[key] == value {
			out = append(out, r)
		}
	}
	return out
}

// Buffer collects what a process writes (a CLI's standard error, a text
// log handler's output) and is safe to read while it is written.
type Buffer struct {
	mu sync.Mutex
	b  []byte
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	return len(p), nil
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}
