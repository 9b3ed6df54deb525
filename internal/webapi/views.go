package webapi

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/telemetry"
)

// HostLister is a Backend that knows its hosts (GET /hosts):
// *client.Client and Local.
type HostLister interface {
	Hosts(ctx context.Context) ([]wire.HostStatus, error)
}

// LogReader is a Backend that reads a job's log stream (GET
// /jobs/{id}/logs): *client.Client. Local is none: `streamd run` prints
// its job's lines on its stderr and publishes none.
type LogReader interface {
	Logs(ctx context.Context, jobID string, q wire.LogQuery) ([]wire.StoredLog, bool, error)
}

// HostsReply is GET /hosts.
type HostsReply struct {
	Hosts []Host `json:"hosts"`
}

// Host is one host (a streamd run: its own process, "local").
type Host struct {
	ID       string    `json:"id"`
	State    string    `json:"state"` // alive or lost
	Slots    int       `json:"slots"`
	Free     int       `json:"free"`
	LastSeen time.Time `json:"last_seen"`
	// Jobs are the jobs not ended whose current attempt runs on the host.
	Jobs []string `json:"jobs"`
}

func (h *handler) hosts(w http.ResponseWriter, r *http.Request) {
	hl, ok := h.b.(HostLister)
	if !ok {
		writeError(w, errorf(http.StatusNotFound, "GET /hosts: this %s has no hosts", h.opts.Mode))
		return
	}
	hs, err := hl.Hosts(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	jobs, err := h.b.List(r.Context(), false)
	if err != nil {
		writeError(w, err)
		return
	}
	out := HostsReply{Hosts: []Host{}}
	for _, hs := range hs {
		o := Host{ID: hs.ID, State: hs.State, Slots: hs.Slots, Free: hs.Free, LastSeen: hs.LastSeen, Jobs: []string{}}
		for _, j := range jobs {
			if !wire.TerminalJobState(j.State) && slices.Contains(j.Hosts, hs.ID) {
				o.Jobs = append(o.Jobs, j.ID)
			}
		}
		out.Hosts = append(out.Hosts, o)
	}
	slices.SortFunc(out.Hosts, func(a, b Host) int { return strings.Compare(a.ID, b.ID) })
	writeJSON(w, http.StatusOK, out)
}

// Log limits of GET /jobs/{id}/logs.
const (
	defaultLogLimit = 1000
	maxLogLimit     = 10000
)

// LogsReply is GET /jobs/{id}/logs.
type LogsReply struct {
	Records []wire.StoredLog `json:"records"`
	// Next is the after= of the next request: the sequence of the last
	// record (or the after= of this one when there is none).
	Next uint64 `json:"next"`
	// More: more lines are stored past these (ask again with after=next).
	More bool `json:"more"`
}

func (h *handler) logs(w http.ResponseWriter, r *http.Request) {
	lr, ok := h.b.(LogReader)
	if !ok {
		writeError(w, errorf(http.StatusNotFound, "GET %s: streamd run publishes no job log stream: its modules' output and log lines are on its stderr", r.URL.Path))
		return
	}
	bad := func(format string, args ...any) {
		writeError(w, errorf(http.StatusBadRequest, "GET %s: "+format, append([]any{r.URL.Path}, args...)...))
	}
	q := wire.LogQuery{Limit: defaultLogLimit, Operator: r.URL.Query().Get("operator")}
	if q.Operator != "" && strings.ContainsAny(q.Operator, ".*> \t") {
		bad("operator %q: not an operator uid", q.Operator)
		return
	}
	if s := r.URL.Query().Get("since"); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			q.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			q.Since = t
		} else {
			bad("since %q: want a duration like 10m or an RFC 3339 time", s)
			return
		}
	}
	if s := r.URL.Query().Get("after"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			bad("after %q: want the next of a previous reply (a stream sequence)", s)
			return
		}
		q.After = n
	}
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLogLimit {
			bad("limit %q: want 1 to %d", s, maxLogLimit)
			return
		}
		q.Limit = n
	}
	st := h.lookup(w, r)
	if st == nil {
		return
	}
	recs, more, err := lr.Logs(r.Context(), st.ID, q)
	if err != nil {
		writeError(w, err)
		return
	}
	out := LogsReply{Records: recs, Next: q.After, More: more}
	if out.Records == nil {
		out.Records = []wire.StoredLog{}
	}
	if n := len(recs); n > 0 {
		out.Next = recs[n-1].Seq
	}
	writeJSON(w, http.StatusOK, out)
}

// VersionsReply is GET /jobs/{id}/versions: the job's version history,
// oldest first, from its first upgrade on (empty before).
type VersionsReply struct {
	Versions []wire.VersionStatus `json:"versions"`
}

func versions(st *wire.JobStatus) any {
	out := VersionsReply{Versions: st.Versions}
	if out.Versions == nil {
		out.Versions = []wire.VersionStatus{}
	}
	return out
}

// TraceReply is GET /jobs/{id}/checkpoints/{cid}/trace.
type TraceReply struct {
	JobID        string `json:"job_id"`
	CheckpointID int64  `json:"checkpoint_id"`
	// Spans are the checkpoint's spans by start time: the checkpoint
	// (the root), each subtask's part (checkpoint.subtask: trigger to
	// acknowledgement), writing the metadata (checkpoint.persist), and
	// the task.* and guest.* spans of subtasks run in this process.
	Spans []telemetry.RecordedSpan `json:"spans"`
	// Subtasks is each subtask's part, from its checkpoint.subtask span.
	Subtasks []SubtaskCheckpoint `json:"subtasks"`
}

// SubtaskCheckpoint is one subtask's part of a checkpoint.
type SubtaskCheckpoint struct {
	Operator string `json:"operator"`
	Subtask  int    `json:"subtask"`
	Attempt  int    `json:"attempt"`
	// AckMS is from the trigger to the subtask's acknowledgement (barrier
	// travel, alignment, snapshot and upload).
	AckMS          float64 `json:"ack_ms"`
	StateSize      int64   `json:"state_size"`
	InFlightBytes  int64   `json:"inflight_bytes"`
	Finished       bool    `json:"finished,omitempty"`          // it had finished (FLIP-147)
	AfterEndOfData bool    `json:"after_end_of_data,omitempty"` // acknowledged after its end of data
	Declined       string  `json:"declined,omitempty"`          // why it declined
}

func (h *handler) trace(w http.ResponseWriter, r *http.Request) {
	cid, err := strconv.ParseInt(r.PathValue("cid"), 10, 64)
	if err != nil || cid < 1 {
		writeError(w, errorf(http.StatusBadRequest, "GET %s: checkpoint id %q: want a number", r.URL.Path, r.PathValue("cid")))
		return
	}
	st := h.lookup(w, r)
	if st == nil {
		return
	}
	if h.opts.Traces == nil {
		writeError(w, errorf(http.StatusNotFound, "GET %s: this %s keeps no traces", r.URL.Path, h.opts.Mode))
		return
	}
	spans, ok := h.opts.Traces.Trace(st.ID, st.Name, cid)
	if !ok {
		writeError(w, errorf(http.StatusNotFound, "job %s: no trace of checkpoint %d kept (the console keeps the latest %d checkpoints' traces of each job, since this %s started)",
			st.ID, cid, telemetry.RecorderTraces, h.opts.Mode))
		return
	}
	out := TraceReply{JobID: st.ID, CheckpointID: cid, Spans: spans, Subtasks: []SubtaskCheckpoint{}}
	for _, s := range spans {
		if s.Name != telemetry.SpanCheckpointSubtask {
			continue
		}
		a := s.Attrs
		n := func(k string) int64 { v, _ := strconv.ParseInt(a[k], 10, 64); return v }
		out.Subtasks = append(out.Subtasks, SubtaskCheckpoint{Operator: a[string(telemetry.AttrOperator)], Subtask: int(n(string(telemetry.AttrSubtask))),
			Attempt: int(n(string(telemetry.AttrAttempt))), AckMS: float64(s.End.Sub(s.Start).Microseconds()) / 1000,
			StateSize: n(string(telemetry.AttrStateBytes)), InFlightBytes: n(string(telemetry.AttrInFlightBytes)),
			Finished: a["streamd.finished"] == "true", AfterEndOfData: a["streamd.after_end_of_data"] == "true",
			Declined: strings.TrimPrefix(s.Error, "declined: ")})
	}
	slices.SortFunc(out.Subtasks, func(a, b SubtaskCheckpoint) int {
		if c := strings.Compare(a.Operator, b.Operator); c != 0 {
			return c
		}
		return a.Subtask - b.Subtask
	})
	writeJSON(w, http.StatusOK, out)
}

// explanations turn the runtime's and the controller's failure texts into
// words a user understands; the first that matches wins.
var explanations = []struct {
	re  *regexp.Regexp
	say func(m []string, attempt int) string
}{
	{regexp.MustCompile(`host (\S+) lost \(no heartbeat for ([^)]+)\)`), func(m []string, a int) string {
		return fmt.Sprintf("The process running attempt %d on host %s died or lost its connection: it sent no heartbeat for %s.", a, m[1], m[2])
	}},
	{regexp.MustCompile(`host (\S+) reported no end for attempt (\d+)`), func(m []string, _ int) string {
		return fmt.Sprintf("Host %s restarted while it ran attempt %s: the attempt was lost with its process.", m[1], m[2])
	}},
	{regexp.MustCompile(`host (\S+) (refused the assignment|did not take the assignment)`), func(m []string, a int) string {
		return fmt.Sprintf("Host %s could not start attempt %d (no free slots or no answer); it was placed again.", m[1], a)
	}},
	{regexp.MustCompile(`waiting for slots`), func(_ []string, _ int) string {
		return "Waiting for hosts with enough free slots to run the job."
	}},
	{regexp.MustCompile(`operator "([^"]+)" subtask (\d+)/\d+ phase (\S+): guest (trap|failed|exited)(: ([^\n]*))?`), func(m []string, a int) string {
		how := map[string]string{"trap": "crashed", "failed": "failed", "exited": "exited"}[m[4]]
		return fmt.Sprintf("The module of operator %s (subtask %s) %s in %s during attempt %d%s.", m[1], m[2], how, m[3], a, colon(m[6]))
	}},
	{regexp.MustCompile(`operator "([^"]+)" subtask (\d+)/\d+ phase (\S+): (call deadline exceeded|memory limit exceeded)`), func(m []string, a int) string {
		return fmt.Sprintf("The module of operator %s (subtask %s) was stopped in %s during attempt %d: %s.", m[1], m[2], m[3], a, m[4])
	}},
	{regexp.MustCompile(`operator "([^"]+)" subtask (\d+)/\d+ phase (\S+): ([^:\n]+)(: ([^\n]*))?`), func(m []string, a int) string {
		return fmt.Sprintf("Operator %s (subtask %s) failed in %s during attempt %d: %s%s.", m[1], m[2], m[3], a, m[4], colon(m[6]))
	}},
	{regexp.MustCompile(`(?i)checkpoint.*(expired|timed? ?out)`), func(_ []string, a int) string {
		return fmt.Sprintf("Attempt %d failed because its checkpoints did not complete in time.", a)
	}},
	{regexp.MustCompile(`context deadline exceeded|i/o timeout`), func(_ []string, a int) string {
		return fmt.Sprintf("Attempt %d failed waiting for an answer that did not come in time.", a)
	}},
	{regexp.MustCompile(`(?i)nats: (connection closed|no responders|timeout)`), func(_ []string, a int) string {
		return fmt.Sprintf("Attempt %d lost its connection to NATS (the messaging between the hosts).", a)
	}},
}

var attemptFailed = regexp.MustCompile(`^attempt (\d+) failed: `)

func colon(s string) string {
	if s = strings.TrimSpace(s); s == "" {
		return ""
	}
	return ": " + s
}

// Explain says why attempt failed in words a user understands, from the
// raw reason (which the API keeps beside it); "" when no rule knows it.
func Explain(reason string, attempt int) string {
	// A job's reason names the attempt that failed ("attempt 1 failed: ...").
	if m := attemptFailed.FindStringSubmatch(reason); m != nil {
		attempt, _ = strconv.Atoi(m[1])
	}
	for _, e := range explanations {
		if m := e.re.FindStringSubmatch(reason); m != nil {
			return e.say(m, attempt)
		}
	}
	return ""
}
