package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Request sends req as JSON on subject and decodes the reply into resp.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, resp any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("cluster: encode %s request: %w", subject, err)
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("cluster: %s: no one answers on this subject: %w", subject, err)
		}
		return fmt.Errorf("cluster: %s: %w", subject, err)
	}
	if err := json.Unmarshal(msg.Data, resp); err != nil {
		return fmt.Errorf("cluster: decode %s reply: %w", subject, err)
	}
	return nil
}

// RequestTimeout is Request with a timeout.
func RequestTimeout(nc *nats.Conn, subject string, timeout time.Duration, req, resp any) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return Request(ctx, nc, subject, req, resp)
}

// Respond answers msg with v as JSON (nothing if msg has no reply subject).
func Respond(msg *nats.Msg, v any) {
	if msg.Reply == "" {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		data, _ = json.Marshal(Reply{Error: "cluster: encode reply: " + err.Error()})
	}
	_ = msg.Respond(data)
}

// ErrorReply is the Reply of err: its text, its code, and a fenced
// host's newer term (the zero Reply for nil).
func ErrorReply(err error) Reply {
	if err == nil {
		return Reply{}
	}
	r := Reply{Error: err.Error(), Code: codeOf(err)}
	var f *FencedError
	if errors.As(err, &f) {
		r.NewerTerm = f.Current
	}
	return r
}

// FencedError is a host's refusal of a request of an older controller term.
type FencedError struct {
	Host, What, Leader string
	Term, Current      uint64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("cluster: host %s: %s of controller term %d refused: term %d (%s) leads", e.Host, e.What, e.Term, e.Current, e.Leader)
}
