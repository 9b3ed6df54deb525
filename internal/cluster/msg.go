package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// request sends req as JSON on subject and decodes the reply into resp.
func request(ctx context.Context, nc *nats.Conn, subject string, req, resp any) error {
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

// requestTimeout is request with a timeout.
func requestTimeout(nc *nats.Conn, subject string, timeout time.Duration, req, resp any) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return request(ctx, nc, subject, req, resp)
}

// respond answers msg with v as JSON (nothing if msg has no reply subject).
func respond(msg *nats.Msg, v any) {
	if msg.Reply == "" {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		data, _ = json.Marshal(Reply{Error: "cluster: encode reply: " + err.Error()})
	}
	_ = msg.Respond(data)
}

func errReply(err error) Reply {
	if err == nil {
		return Reply{}
	}
	r := Reply{Error: err.Error(), Code: codeOf(err)}
	var f *fencedError
	if errors.As(err, &f) {
		r.NewerTerm = f.current
	}
	return r
}

// fencedError is a host's refusal of a request of an older controller term.
type fencedError struct {
	host, what, leader string
	term, current      uint64
}

func (e *fencedError) Error() string {
	return fmt.Sprintf("cluster: host %s: %s of controller term %d refused: term %d (%s) leads", e.host, e.what, e.term, e.current, e.leader)
}
