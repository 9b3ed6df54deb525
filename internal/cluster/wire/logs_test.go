package wire

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/natstest"
)

// TestLogPublisher: a task line of a subtask and a line of the job land on
// their subjects as LogRecords, and the stream is made with the default
// retention.
func TestLogPublisher(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.URL())
	msgs := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(SubjectLogsPrefix+">", msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p := NewLogPublisher(natstest.Connect(t, srv.URL()), LogStreamConfig{}, nil)
	defer p.Close()
	log := slog.New(p.Handler("h1", "job-1", 2, "task"))
	log.With("operator", "op", "subtask", 1).Info("hello", "k", "v w")
	log.Debug("not published")
	log.Warn("job line")

	want := []struct{ subject, msg string }{{"streamd.v1.logs.job-1.op.1", "hello"}, {"streamd.v1.logs.job-1._._", "job line"}}
	for _, w := range want {
		select {
		case m := <-msgs:
			var r LogRecord
			if err := json.Unmarshal(m.Data, &r); err != nil {
				t.Fatalf("%s: %q: %v", m.Subject, m.Data, err)
			}
			if m.Subject != w.subject || r.Msg != w.msg || r.Job != "job-1" || r.Host != "h1" || r.Attempt != 2 || r.Source != "task" {
				t.Fatalf("got %s %s, want %s with %q of job-1 attempt 2 on h1", m.Subject, m.Data, w.subject, w.msg)
			}
			if w.msg == "hello" && (r.Operator != "op" || r.Subtask == nil || *r.Subtask != 1 || r.Attrs["k"] != "v w" || r.Level != "INFO") {
				t.Fatalf("subtask line %s", m.Data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10s", w.subject)
		}
	}
	js := natstest.JetStream(t, srv)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := js.Stream(context.Background(), LogStream)
		if err == nil {
			cfg := s.CachedInfo().Config
			if cfg.MaxAge != DefaultLogMaxAge || cfg.MaxBytes != DefaultLogMaxBytes || len(cfg.Subjects) != 1 || cfg.Subjects[0] != "streamd.v1.logs.>" {
				t.Fatalf("stream config: max age %v, max bytes %d, subjects %v", cfg.MaxAge, cfg.MaxBytes, cfg.Subjects)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream %s after 10s: %v", LogStream, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLogPublisherDropsWithoutNATS: with the connection closed, logging
// returns at once and every line is counted as dropped.
func TestLogPublisherDropsWithoutNATS(t *testing.T) {
	srv := natstest.Server(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	p := NewLogPublisher(nc, LogStreamConfig{}, nil)
	defer p.Close()
	log := slog.New(p.Handler("h1", "job-1", 0, "guest")).With("operator", "op", "subtask", 0)
	const n = 2 * logQueue // more than the queue holds: the excess is dropped at once
	for i := range n {
		log.Info("line", "i", i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Dropped() != n {
		if time.Now().After(deadline) {
			t.Fatalf("dropped %d of %d lines without NATS", p.Dropped(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !errors.Is(nc.Publish("x", nil), nats.ErrConnectionClosed) {
		t.Fatal("the connection is open")
	}
}
