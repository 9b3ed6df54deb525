package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
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

func (p *LogPublisher) publish(rec *LogRecord) {
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
	h.p.publish(rec)
	return nil
}

// jobLoggers are the loggers of an attempt run by a LocalExecutor with
// Logs: its task logger, which also publishes, and the handler of its guest
// lines (nil without Logs).
func (e *LocalExecutor) jobLoggers(r ExecRequest) (*slog.Logger, slog.Handler) {
	if e.Logs == nil || r.Logger == nil {
		return r.Logger, nil
	}
	task := e.Logs.Handler(r.HostID, r.JobID, r.Attempt, "task")
	return slog.New(telemetry.TeeHandler(r.Logger.Handler(), task)), e.Logs.Handler(r.HostID, r.JobID, r.Attempt, "guest")
}

// logged publishes the start and the end of this host's part of an attempt
// as job lines (to the log stream only: the host agent logs them itself).
func (e *LocalExecutor) logged(r ExecRequest, x Execution) Execution {
	if e.Logs == nil {
		return x
	}
	log := slog.New(e.Logs.Handler(r.HostID, r.JobID, r.Attempt, "task"))
	log.Info("attempt started", "subtasks", len(r.Local))
	return loggedExecution{x, log}
}

type loggedExecution struct {
	Execution
	log *slog.Logger
}

func (x loggedExecution) Wait() (runtime.Stats, error) {
	st, err := x.Execution.Wait()
	switch {
	case err == nil:
		x.log.Info("attempt finished")
	case errors.Is(err, context.Canceled):
		x.log.Info("attempt canceled")
	default:
		x.log.Error("attempt failed", "err", err.Error())
	}
	return st, err
}

// ControllerLogHost is the Host of the log records the controller publishes
// about a job (Source "controller"): its decisions, as `streamd logs`
// shows them beside the hosts' lines.
const ControllerLogHost = "controller"

// jobEventHandler passes every record to the controller's own handler and
// publishes those about one job (a "job" attribute) at info level and above
// on the job's log subject, so `streamd logs` shows why an attempt failed
// over, an upgrade, a rollback, a stop and its savepoint.
type jobEventHandler struct {
	inner slog.Handler
	pub   *LogPublisher
	attrs []slog.Attr
}

func (h *jobEventHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || h.inner.Enabled(ctx, l)
}

func (h *jobEventHandler) Handle(ctx context.Context, r slog.Record) error {
	var err error
	if h.inner.Enabled(ctx, r.Level) {
		err = h.inner.Handle(ctx, r)
	}
	if r.Level < slog.LevelInfo {
		return err
	}
	rec := &LogRecord{Time: r.Time, Level: r.Level.String(), Host: ControllerLogHost, Source: "controller", Msg: r.Message, Attrs: map[string]string{}}
	take := func(a slog.Attr) bool {
		v := a.Value.Resolve().String()
		switch a.Key {
		case "job":
			rec.Job = v
		case "attempt":
			rec.Attempt, _ = strconv.Atoi(v)
		case "component", "controller":
		default:
			rec.Attrs[a.Key] = v
		}
		return true
	}
	for _, a := range h.attrs {
		take(a)
	}
	r.Attrs(take)
	if rec.Job == "" || !validJobID(rec.Job) {
		return err
	}
	h.pub.publish(rec)
	return err
}

func (h *jobEventHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &jobEventHandler{inner: h.inner.WithAttrs(as), pub: h.pub, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *jobEventHandler) WithGroup(name string) slog.Handler {
	return &jobEventHandler{inner: h.inner.WithGroup(name), pub: h.pub, attrs: h.attrs}
}

// validJobID: id can be a token of a log subject.
func validJobID(id string) bool {
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

// Logs reads the job's stored log lines, oldest first (not following new
// ones), and says whether more are stored past them. It is what
// `streamd logs` prints, for the REST API.
func (c *Client) Logs(ctx context.Context, jobID string, q LogQuery) ([]StoredLog, bool, error) {
	if !validJobID(jobID) {
		return nil, false, fmt.Errorf("job %q: not a job id", jobID)
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return nil, false, err
	}
	stream, err := js.Stream(ctx, LogStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, fmt.Errorf("job %s: no log stream %s on the NATS server (the hosts create it when they start)", jobID, LogStream)
	}
	if err != nil {
		return nil, false, fmt.Errorf("job %s: log stream %s: %w", jobID, LogStream, err)
	}
	op := "*"
	if q.Operator != "" {
		op = q.Operator
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{SubjectLogsPrefix + jobID + "." + op + ".*"}}
	switch {
	case q.After > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, q.After+1
	case !q.Since.IsZero():
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &q.Since
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("job %s: read log stream %s: %w", jobID, LogStream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("job %s: read log stream %s: %w", jobID, LogStream, err)
	}
	n := min(int(info.NumPending), q.Limit)
	if n <= 0 {
		return nil, info.NumPending > 0, nil
	}
	wait := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(wait))
	if err != nil {
		return nil, false, fmt.Errorf("job %s: read log stream %s: %w", jobID, LogStream, err)
	}
	var out []StoredLog
	for m := range batch.Messages() {
		rec := StoredLog{}
		if md, err := m.Metadata(); err == nil {
			rec.Seq = md.Sequence.Stream
		}
		if err := json.Unmarshal(m.Data(), &rec.LogRecord); err != nil {
			rec.Msg, rec.Source = fmt.Sprintf("(not a log record: %q)", m.Data()), "stream"
		}
		out = append(out, rec)
	}
	if err := batch.Error(); err != nil && len(out) < n {
		return out, true, fmt.Errorf("job %s: read log stream %s: %w", jobID, LogStream, err)
	}
	return out, int(info.NumPending) > len(out), nil
}
