package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The job logs: each host publishes the log records of the deployed jobs it
// runs (the guests' output lines and log calls, and the runtime's task and
// job lines) as LogRecord JSON on LogsSubject; the JetStream stream
// LogStream keeps them for `streamd logs` within its limits (docs/subjects.md).
const (
	// LogStream is the JetStream stream of the job logs.
	LogStream = "STREAMD_LOGS"
	// SubjectLogsPrefix starts every log subject:
	// streamd.v1.logs.<job-id>.<operator>.<subtask>.
	SubjectLogsPrefix = "streamd.v1.logs."
	// LogJobToken stands for the operator and the subtask in the subject
	// of a job-level line (one that names no subtask).
	LogJobToken = "_"

	// DefaultLogMaxAge and DefaultLogMaxBytes are the stream's retention
	// when LogStreamConfig names none.
	DefaultLogMaxAge   = 24 * time.Hour
	DefaultLogMaxBytes = 1 << 30
	// logQueue is how many records a host buffers for publishing; more
	// are dropped (LogPublisher.Dropped).
	logQueue = 4096
)

// LogsSubject is the subject of the log lines of one subtask of a job;
// operator "" (and subtask < 0) is LogJobToken, "*" any.
func LogsSubject(jobID, operator string, subtask int) string {
	sub := LogJobToken
	switch {
	case subtask >= 0:
		sub = strconv.Itoa(subtask)
	case operator == "*":
		sub = "*"
	}
	if operator == "" {
		operator = LogJobToken
	}
	return SubjectLogsPrefix + jobID + "." + operator + "." + sub
}

// LogRecord is one published log line.
type LogRecord struct {
	Time     time.Time `json:"time"`
	Level    string    `json:"level"`
	Job      string    `json:"job"`
	Host     string    `json:"host"`
	Attempt  int       `json:"attempt"`
	Operator string    `json:"operator,omitempty"`
	Subtask  *int      `json:"subtask,omitempty"`
	// Source is "guest" (the module's output or log call) or "task" (the
	// runtime's line).
	Source string `json:"source"`
	// Stream is the guest's output stream, "stdout" or "stderr", if any.
	Stream string            `json:"stream,omitempty"`
	Msg    string            `json:"msg"`
	Attrs  map[string]string `json:"attrs,omitempty"`
}

// LogStreamConfig is the retention of LogStream: zero values are the
// defaults.
type LogStreamConfig struct {
	MaxAge   time.Duration
	MaxBytes int64
}

// EnsureLogStream creates LogStream if it does not exist yet.
func EnsureLogStream(ctx context.Context, nc *nats.Conn, cfg LogStreamConfig) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: log stream: %w", err)
	}
	if _, err := js.Stream(ctx, LogStream); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("cluster: log stream %s: %w", LogStream, err)
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultLogMaxAge
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultLogMaxBytes
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: LogStream, Subjects: []string{SubjectLogsPrefix + ">"},
		MaxAge: cfg.MaxAge, MaxBytes: cfg.MaxBytes, Discard: jetstream.DiscardOld, Storage: jetstream.FileStorage})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("cluster: create log stream %s: %w", LogStream, err)
	}
	return nil
}

// LogPublisher publishes the job log records of one host. It never blocks
// the caller: records are queued and published by one goroutine; when the
// queue is full or NATS refuses a publish (disconnected past its reconnect
// buffer) a record is dropped and counted.
type LogPublisher struct {
	nc      *nats.Conn
	cfg     LogStreamConfig
	log     *slog.Logger
	queue   chan *nats.Msg
	dropped atomic.Int64
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// NewLogPublisher starts publishing log records on nc; it creates
// LogStream (with cfg) if missing, retried in the background. log (nil:
// none) gets a warning when the stream cannot be made and, at most once a
// minute, how many lines were dropped.
func NewLogPublisher(nc *nats.Conn, cfg LogStreamConfig, log *slog.Logger) *LogPublisher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &LogPublisher{nc: nc, cfg: cfg, log: log, queue: make(chan *nats.Msg, logQueue),
		stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *LogPublisher) run() {
	defer close(p.done)
	ensured, warned := false, false
	retry := time.NewTimer(0)
	defer retry.Stop()
	report := time.NewTicker(time.Minute)
	defer report.Stop()
	var reported int64
	for {
		select {
		case <-p.stop:
			return
		case <-retry.C:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := EnsureLogStream(ctx, p.nc, p.cfg)
			cancel()
			ensured = err == nil
			if !ensured {
				if !warned {
					p.log.Warn("job log stream not available (retrying)", "stream", LogStream, "err", err)
					warned = true
				}
				retry.Reset(time.Second)
			}
		case <-report.C:
			if n := p.dropped.Load(); n != reported {
				p.log.Warn("job log lines dropped", "stream", LogStream, "dropped", n-reported, "total", n)
				reported = n
			}
		case m := <-p.queue:
			if err := p.nc.PublishMsg(m); err != nil {
				p.dropped.Add(1)
			}
		}
	}
}

// Dropped is how many records were not published.
func (p *LogPublisher) Dropped() int64 { return p.dropped.Load() }

// Close stops publishing; queued records are dropped.
func (p *LogPublisher) Close() {
	p.once.Do(func() { close(p.stop) })
	<-p.done
}

// Publish queues rec for the log stream (dropped, and counted, when the
// queue is full).
func (p *LogPublisher) Publish(rec *LogRecord) {
	data, err := json.Marshal(rec)
	if err != nil {
		p.dropped.Add(1)
		return
	}
	sub := -1
	if rec.Subtask != nil {
		sub = *rec.Subtask
	}
	m := &nats.Msg{Subject: LogsSubject(rec.Job, rec.Operator, sub), Data: data}
	select {
	case p.queue <- m:
	default:
		p.dropped.Add(1)
	}
}

// Handler is the slog.Handler of one attempt's records: source "task" or
// "guest". Records below Info are not published; the operator and subtask
// come from the attributes of those names.
func (p *LogPublisher) Handler(hostID, jobID string, attempt int, source string) slog.Handler {
	return &logHandler{p: p, host: hostID, job: jobID, attempt: attempt, source: source}
}

type logHandler struct {
	p       *LogPublisher
	host    string
	job     string
	attempt int
	source  string
	attrs   []slog.Attr // WithAttrs, prefixed with their groups
	group   string
}

func (h *logHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		a.Key = h.group + a.Key
		c.attrs = append(c.attrs, a)
	}
	return &c
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.group = h.group + name + "."
	return &c
}

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	rec := &LogRecord{Time: r.Time, Level: r.Level.String(), Job: h.job, Host: h.host, Attempt: h.attempt,
		Source: h.source, Msg: r.Message}
	add := func(a slog.Attr) {
		v := a.Value.Resolve()
		switch a.Key {
		case "operator":
			rec.Operator = v.String()
			return
		case "subtask":
			if v.Kind() == slog.KindInt64 {
				n := int(v.Int64())
				rec.Subtask = &n
				return
			}
		case "stream":
			if h.source == "guest" {
				rec.Stream = v.String()
				return
			}
		case "job", "attempt", "host", "component":
			return // known from the subject and the record
		}
		if rec.Attrs == nil {
			rec.Attrs = map[string]string{}
		}
		rec.Attrs[a.Key] = v.String()
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool {
		a.Key = h.group + a.Key
		add(a)
		return true
	})
	if rec.Operator == "" || rec.Subtask == nil {
		rec.Operator, rec.Subtask = "", nil
	}
	h.p.Publish(rec)
	return nil
}

// ValidJobID: id can be a token of a log subject.
func ValidJobID(id string) bool {
	return id != "" && !strings.ContainsAny(id, ". *>\t\r\n")
}

// StoredLog is one record of LogStream with its stream sequence.
type StoredLog struct {
	Seq uint64 `json:"seq"`
	LogRecord
}

// LogQuery selects the stored lines of one job: of one operator ("": all),
// after stream sequence After (0: from Since, zero: all kept), at most
// Limit.
type LogQuery struct {
	Operator string
	Since    time.Time
	After    uint64
	Limit    int
}
