// Command sessionize groups page views into sessions per user: a session
// window of a user closes after gap (config, default 30s) without views. For
// every session it emits, when the watermark passes its end, the JSON line
// {"user":U,"start":MS,"end":MS,"views":N}, with the user as key and the
// session's last millisecond as event time. Views up to allowed_lateness
// (default 1m) late are added to their session, which fires again with the
// new count (or merges with its neighbours); views later than that go,
// unchanged, to the side output "late" (read it as sessions.late).
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o sessionize.wasm .
//
// The records must be keyed by user (keyby/ does it) and reach this operator
// through a hash edge.
package main

import (
	"encoding/json"
	"errors"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
)

// view is a record's value: {"ts": ms, "user": ..., "page": ...}.
type view struct {
	TS   int64  `json:"ts"`
	User string `json:"user"`
	Page string `json:"page"`
}

// countViews counts the views of a session; merging sessions adds counts.
type countViews struct{}

func (countViews) CreateAccumulator() int64  { return 0 }
func (countViews) Add(_ view, n int64) int64 { return n + 1 }
func (countViews) GetResult(n int64) int64   { return n }
func (countViews) Merge(a, b int64) int64    { return a + b }

type session struct {
	User  string `json:"user"`
	Start int64  `json:"start"`
	End   int64  `json:"end"`
	Views int64  `json:"views"`
}

func emitSession(key []byte, w streamd.TimeWindow, views int64, out *streamd.WindowOutput) error {
	b, err := json.Marshal(session{User: string(key), Start: w.Start, End: w.End, Views: views})
	if err != nil {
		return err
	}
	out.Emit(b)
	return nil
}

// sessionize is the window operator, built in Open from the config.
type sessionize struct {
	*streamd.WindowOperator[view]
}

func (s *sessionize) Open(ctx *streamd.Context) error {
	gap, err := duration(ctx.Config, "gap", 30*time.Second, true)
	if err != nil {
		return err
	}
	lateness, err := duration(ctx.Config, "allowed_lateness", time.Minute, false)
	if err != nil {
		return err
	}
	s.WindowOperator = streamd.Window(
		streamd.EventTimeSessionWindows(gap),
		streamd.JSON[view](),
		streamd.AggregateProcessWindow(streamd.Int64, streamd.Aggregator[view, int64, int64](countViews{}), emitSession),
		streamd.AllowedLateness(lateness),
		streamd.LateOutput("late"),
	)
	return s.WindowOperator.Open(ctx)
}

// duration reads a Go duration from the config: positive, or at least 0.
func duration(c streamd.Config, key string, def time.Duration, positive bool) (time.Duration, error) {
	s, ok := c[key]
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || positive && d == 0 {
		want := "a non-negative"
		if positive {
			want = "a positive"
		}
		return 0, errors.New("sessionize: config " + key + " is " + s + ", not " + want + " Go duration (30s, 1m)")
	}
	return d, nil
}

func newOperator() streamd.Operator { return &sessionize{} }

func init() { streamd.Register(newOperator()) }

func main() {}
