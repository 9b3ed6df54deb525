// Package wire is what streamd's controller (package cluster), its host
// agents (package agent) and its clients (package client) share, and the
// only package the three of them import in common: the subjects and JSON
// messages of the control plane (the control API, the host protocol, the
// subtask protocol of a job spread over hosts), the error codes a reply
// carries, the job spec, and the JetStream stores every end uses
// (artifacts, checkpoints, job logs). None of the three imports another:
// what one end says to another is written here, once.
//
// Every message is JSON. Subjects are versioned (streamd.v1.) and listed in
// docs/subjects.md; the constants below are the only place code names them.
package wire

import (
	"errors"
	"fmt"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// APIVersion is the version in every subject name.
const APIVersion = "v1"

// Control API subjects (client -> controller, request/reply).
const (
	SubjectDeploy    = "streamd.v1.ctl.deploy"
	SubjectList      = "streamd.v1.ctl.list"
	SubjectStatus    = "streamd.v1.ctl.status"
	SubjectCancel    = "streamd.v1.ctl.cancel"
	SubjectSavepoint = "streamd.v1.ctl.savepoint"
	SubjectStop      = "streamd.v1.ctl.stop"
	SubjectHosts     = "streamd.v1.ctl.hosts"
	SubjectDelete    = "streamd.v1.ctl.delete"
	SubjectUpgrade   = "streamd.v1.ctl.upgrade"
)

// Host subjects.
const (
	// SubjectHeartbeat: every host publishes a Heartbeat here (the first one
	// registers it).
	SubjectHeartbeat = "streamd.v1.hosts.heartbeat"
	// SubjectHostEvents: hosts report attempt state changes here (request/reply,
	// the controller acknowledges).
	SubjectHostEvents = "streamd.v1.hosts.events"
	// SubjectLeader: the leading controller publishes a LeaderAnnounce here
	// when it takes the lead and at every renewal of its lease; hosts
	// refuse commands of older terms from then on.
	SubjectLeader = "streamd.v1.hosts.leader"
)

// LeaderAnnounce (streamd.v1.hosts.leader) names the leading controller and
// its term.
type LeaderAnnounce struct {
	ID   string `json:"id"`
	Term uint64 `json:"term"`
}

// HostSubject is the subject on which host id receives verb from the
// controller (request/reply): "assign", "cancel", "savepoint", "stop" or
// "outcome".
func HostSubject(id, verb string) string { return "streamd.v1.hosts." + id + "." + verb }

// Host verbs.
const (
	HostVerbAssign    = "assign"
	HostVerbCancel    = "cancel"
	HostVerbSavepoint = "savepoint"
	HostVerbStop      = "stop"
	// HostVerbOutcome asks a host how an attempt ended there (OutcomeReply):
	// the controller asks when the host's heartbeats stopped listing an
	// attempt whose end it never reported.
	HostVerbOutcome = "outcome"
)

// ArtifactBucket is the JetStream object store bucket of modules, job files
// and input files, keyed by content hash.
const ArtifactBucket = "STREAMD_ARTIFACTS"

// Job states in JobStatus: control's words (control.JobState).
const (
	JobCreated    = string(control.JobCreated)
	JobRunning    = string(control.JobRunning)
	JobFinishing  = string(control.JobFinishing)
	JobFinished   = string(control.JobFinished)
	JobRestarting = string(control.JobRestarting)
	JobFailed     = string(control.JobFailed)
	JobStopping   = string(control.JobStopping)
	JobStopped    = string(control.JobStopped)
	JobCanceled   = string(control.JobCanceled)
)

// Subtask states in JobStatus and HostEvent: control's words
// (control.SubtaskState).
const (
	SubtaskScheduled = string(control.SubtaskScheduled)
	SubtaskDeploying = string(control.SubtaskDeploying)
	SubtaskRunning   = string(control.SubtaskRunning)
	SubtaskEndOfData = string(control.SubtaskEndOfData)
	SubtaskFinished  = string(control.SubtaskFinished)
	SubtaskFailed    = string(control.SubtaskFailed)
	SubtaskCanceled  = string(control.SubtaskCanceled)
)

// TerminalJobState reports whether a job in state s never changes again.
func TerminalJobState(s string) bool { return control.JobState(s).Terminal() }

// Reply is embedded in every reply: a non-empty Error means the request failed.
type Reply struct {
	Error string `json:"error,omitempty"`
	// Code classifies Error (one of the Code* words; "" for none, as from
	// a controller before codes): the client matches it with errors.Is
	// against ErrNotFound, ErrConflict, ErrBadRequest, ErrUnavailable.
	Code string `json:"code,omitempty"`
	// Retry: the controller stopped before it acted on the request (it lost
	// the lead); send it again (to the new leader).
	Retry bool `json:"retry,omitempty"`
	// NewerTerm: a host refused the request because a controller of this
	// later term leads; the sender stops acting.
	NewerTerm uint64 `json:"newer_term,omitempty"`
}

// Err returns the reply's error, or nil: a *RemoteError, which matches
// (errors.Is) the sentinel of its code.
func (r Reply) Err() error {
	if r.Error == "" {
		return nil
	}
	return &RemoteError{Code: r.Code, Msg: r.Error}
}

// Error codes of a Reply (the wire's words) and the errors they match.
const (
	CodeNotFound    = "not_found"   // no such job (or host)
	CodeConflict    = "conflict"    // the job is in a state the request does not apply to
	CodeBadRequest  = "bad_request" // the request itself is wrong
	CodeUnavailable = "unavailable" // no controller could act on it now
)

var (
	ErrNotFound    = errors.New("cluster: not found")
	ErrConflict    = errors.New("cluster: the job is in the wrong state")
	ErrBadRequest  = errors.New("cluster: bad request")
	ErrUnavailable = errors.New("cluster: unavailable")
)

var codeErrors = map[string]error{CodeNotFound: ErrNotFound, CodeConflict: ErrConflict, CodeBadRequest: ErrBadRequest, CodeUnavailable: ErrUnavailable}

// RemoteError is an error a controller or host answered, with its code.
type RemoteError struct {
	Code string
	Msg  string
}

func (e *RemoteError) Error() string { return e.Msg }

// Is matches the sentinel of the error's code.
func (e *RemoteError) Is(target error) bool {
	sentinel, ok := codeErrors[e.Code]
	return ok && target == sentinel
}

// codeOf is the wire code of err: that of the first sentinel it wraps.
func codeOf(err error) string {
	for code, sentinel := range codeErrors {
		if errors.Is(err, sentinel) {
			return code
		}
	}
	return ""
}

// codedError is an error with a sentinel for its code and its own text.
type codedError struct {
	sentinel error
	msg      string
}

func (e *codedError) Error() string        { return e.msg }
func (e *codedError) Is(target error) bool { return target == e.sentinel }

// NotFoundf, Conflictf and BadRequestf are fmt.Errorf for errors that cross
// the wire with a code.
func NotFoundf(format string, args ...any) error {
	return &codedError{ErrNotFound, fmt.Sprintf(format, args...)}
}

func Conflictf(format string, args ...any) error {
	return &codedError{ErrConflict, fmt.Sprintf(format, args...)}
}

func BadRequestf(format string, args ...any) error {
	return &codedError{ErrBadRequest, fmt.Sprintf(format, args...)}
}

// Unavailable is an error that matches ErrUnavailable, with its own text.
func Unavailable(msg string) error { return &codedError{ErrUnavailable, msg} }

// Base is the reply itself (promoted to every reply that embeds it).
func (r Reply) Base() Reply { return r }

// DeployRequest (streamd.v1.ctl.deploy) submits a job.
type DeployRequest struct {
	Job JobSpec `json:"job"`
	// From is the checkpoint or savepoint the job starts from (a
	// jetstream:// location or a directory the hosts see); "" = fresh state.
	From string `json:"from,omitempty"`
	// RequestID, chosen by the client, makes the deploy idempotent: a
	// request sent again with the same id (its answer was lost, or the
	// controller that took it stopped) names the job the first one made.
	RequestID string `json:"request_id,omitempty"`
}

// DeployReply names the new job.
type DeployReply struct {
	Reply
	JobID string `json:"job_id,omitempty"`
}

// ListRequest (streamd.v1.ctl.list) asks for the jobs: those finished,
// failed or canceled longer ago than the controller's job retention only
// with All.
type ListRequest struct {
	All bool `json:"all,omitempty"`
}

// ListReply lists jobs, newest first.
type ListReply struct {
	Reply
	Jobs []JobStatus `json:"jobs"`
}

// JobRequest names a job: status and cancel take it.
type JobRequest struct {
	JobID string `json:"job_id"`
}

// JobReply carries one job's status.
type JobReply struct {
	Reply
	Job *JobStatus `json:"job,omitempty"`
}

// DeleteRequest (streamd.v1.ctl.delete) removes the record of an ended job
// and, with Checkpoints, its checkpoint directory (or its prefix in the
// JetStream object store). The reply is a JobReply with the job as it was.
type DeleteRequest struct {
	JobID       string `json:"job_id"`
	Checkpoints bool   `json:"checkpoints,omitempty"`
}

// SavepointRequest (streamd.v1.ctl.savepoint) takes a savepoint into Dir (a
// directory on the host; empty = the job's checkpoint directory).
type SavepointRequest struct {
	JobID string `json:"job_id"`
	Dir   string `json:"dir,omitempty"`
}

// StopRequest (streamd.v1.ctl.stop) stops a job with a savepoint.
type StopRequest struct {
	JobID        string `json:"job_id"`
	SavepointDir string `json:"savepoint_dir,omitempty"`
	Drain        bool   `json:"drain,omitempty"`
}

// SavepointReply says where the savepoint went.
type SavepointReply struct {
	Reply
	Path string `json:"path,omitempty"`
}

// HostsReply (streamd.v1.ctl.hosts) lists the registered hosts.
type HostsReply struct {
	Reply
	Hosts []HostStatus `json:"hosts"`
}

// Host states (HostStatus.State).
const (
	HostAlive = "alive" // heartbeats come
	HostLost  = "lost"  // none for the heartbeat timeout; its slots are not counted
	// HostUnconfirmed: named by the job table (the previous leader placed
	// jobs there) and not heard from since this controller took the lead;
	// it is lost when it stays silent for the heartbeat timeout.
	HostUnconfirmed = "unconfirmed"
)

// HostStatus is one host as the controller sees it.
type HostStatus struct {
	ID       string    `json:"id"`
	Slots    int       `json:"slots"`
	Free     int       `json:"free"`
	State    string    `json:"state"` // HostAlive, HostLost or HostUnconfirmed
	LastSeen time.Time `json:"last_seen"`
}

// JobStatus is what `streamd status --json` prints.
type JobStatus struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"` // why it failed, or what it waits for
	Attempt int    `json:"attempt"`          // current attempt, 0-based
	Slots   int    `json:"slots"`            // slots the job needs
	// Parallelism is the parallelism (slots) the job runs at, or will
	// when placed; DeclaredParallelism the one its job file declares (the
	// largest of its operators'), MinParallelism the least it runs at. The
	// adaptive scheduler runs it below its declared parallelism while fewer
	// slots are free (docs/job-file.md "Adaptive scheduling").
	Parallelism         int        `json:"parallelism"`
	DeclaredParallelism int        `json:"declared_parallelism"`
	MinParallelism      int        `json:"min_parallelism"`
	Hosts               []string   `json:"hosts,omitempty"` // hosts of the current attempt
	Created             time.Time  `json:"created"`
	Updated             time.Time  `json:"updated"`
	Ended               *time.Time `json:"ended,omitempty"`
	Elapsed             string     `json:"elapsed,omitempty"`   // of the current attempt's run, as the host measured it
	Savepoint           string     `json:"savepoint,omitempty"` // where a stopped job's savepoint is
	// CheckpointMode is how checkpoints align: "aligned", "unaligned" or
	// "aligned, unaligned after D" (checkpoint.aligned_timeout); "" without
	// checkpointing.
	CheckpointMode string `json:"checkpoint_mode,omitempty"`
	// Leader is the controller that answered, leading in Term.
	Leader string `json:"leader,omitempty"`
	Term   uint64 `json:"term,omitempty"`

	Operators []OperatorStatus `json:"operators"`
	Attempts  []AttemptStatus  `json:"attempts,omitempty"`
	// Checkpoints are the latest completed checkpoints and savepoints
	// (at most runtime.RecentCheckpoints), oldest first.
	Checkpoints []runtime.CheckpointStats `json:"checkpoints,omitempty"`
	// Versions is the job's version history, oldest first, from its first
	// upgrade on (streamd upgrade); none before.
	Versions []VersionStatus `json:"versions,omitempty"`
	// Rescales are the adaptive scheduler's latest rescales of the job,
	// oldest first.
	Rescales []RescaleStatus `json:"rescales,omitempty"`
	// Autoscaler is the job's autoscaler (autoscale.go): nil when off.
	Autoscaler *AutoscalerStatus `json:"autoscaler,omitempty"`
}

// OperatorStatus is one operator of a job.
type OperatorStatus struct {
	UID         string `json:"uid"`
	Parallelism int    `json:"parallelism"` // as it runs (or will run), as many as Subtasks
	// DeclaredParallelism is the operator's parallelism in the job file
	// (above Parallelism while the job runs on fewer slots).
	DeclaredParallelism int   `json:"declared_parallelism"`
	RecordsIn           int64 `json:"records_in"`
	RecordsOut          int64 `json:"records_out"`
	// UnionDeclines counts the checkpoints declined because the operator
	// has union list state and was partially finished (FLIP-147).
	UnionDeclines int             `json:"union_declines,omitempty"`
	Subtasks      []SubtaskStatus `json:"subtasks"`
	// Kind is source, operator or sink; Inputs are its input edges, in
	// input order (the job graph, for the REST API's plan).
	Kind   string       `json:"kind,omitempty"`
	Inputs []EdgeStatus `json:"inputs,omitempty"`
	// Connector describes a source or sink as its connector does
	// (connector.Describe: "source nats stream ORDERS"); "" for a wasm
	// operator.
	Connector string `json:"connector,omitempty"`
}

// EdgeStatus is one input edge of an operator.
type EdgeStatus struct {
	From         string `json:"from"`             // the upstream operator's uid
	Partitioning string `json:"partitioning"`     // forward, rebalance, hash or broadcast
	Input        int    `json:"input"`            // the input index at the receiver
	Output       string `json:"output,omitempty"` // the side output of From it reads ("": the main output)
}

// EdgeStatuses are the edges of a vertex's inputs.
func EdgeStatuses(inputs []control.Edge) []EdgeStatus {
	var out []EdgeStatus
	for _, e := range inputs {
		out = append(out, EdgeStatus{From: e.From, Partitioning: string(e.Partition), Input: e.Input, Output: e.Output})
	}
	return out
}

// SubtaskStatus is one subtask: where it runs and its state.
type SubtaskStatus struct {
	Index int    `json:"index"`
	Host  string `json:"host,omitempty"`
	State string `json:"state"`
	// Live are the subtask's counters as its host reported them last
	// (watermark, back-pressured, busy and idle time, source lag); nil
	// before the first report.
	Live *telemetry.SubtaskLive `json:"live,omitempty"`
}

// AttemptStatus is the history of one attempt.
type AttemptStatus struct {
	Attempt     int      `json:"attempt"`
	Parallelism int      `json:"parallelism,omitempty"` // the slots it ran on
	Hosts       []string `json:"hosts,omitempty"`
	State       string   `json:"state"`
	Reason      string   `json:"reason,omitempty"`
}

// Heartbeat is what a host publishes every heartbeat interval.
type Heartbeat struct {
	HostID   string       `json:"host_id"`
	Slots    int          `json:"slots"`
	Running  []AttemptRef `json:"running,omitempty"` // attempts the host runs now
	Interval string       `json:"interval"`          // the host's heartbeat interval
	Version  string       `json:"version,omitempty"`
}

// AttemptRef names one attempt of one job.
type AttemptRef struct {
	JobID   string `json:"job_id"`
	Attempt int    `json:"attempt"`
}

// SubtaskRef names one subtask.
type SubtaskRef struct {
	Operator string `json:"operator"`
	Subtask  int    `json:"subtask"`
}

// Assignment (streamd.v1.hosts.<id>.assign) tells a host to run its part of
// one attempt. Placement has every subtask's host (slot i of the job runs
// subtask i of every operator with parallelism > i), so a host knows which
// subtasks are local and where the remote ends of its channels are.
type Assignment struct {
	JobID   string `json:"job_id"`
	Attempt int    `json:"attempt"`
	// Term is the assigning controller's term (every controller -> host
	// request carries it): a host refuses requests of a term older than
	// the newest it knows.
	Term      uint64       `json:"term,omitempty"`
	Job       JobSpec      `json:"job"`
	Placement []string     `json:"placement"` // host of each slot
	Local     []SubtaskRef `json:"local"`     // the subtasks this host runs
	// Distributed: the job is spread over hosts (remote channels over
	// NATS, the checkpoint coordinator in the controller); then Restore is
	// the checkpoint to restore from ("" = fresh state).
	Distributed bool   `json:"distributed,omitempty"`
	Restore     string `json:"restore,omitempty"`
	// Trace is the W3C trace context of the controller's span of this
	// attempt (a job spread over hosts; nil with tracing off): the host's
	// task spans are its children.
	Trace map[string]string `json:"trace,omitempty"`
}

// AssignReply answers an Assignment. Busy: the host refused it because its
// slots are taken (by attempts still running or ending there); the
// controller then reschedules the attempt once it has seen slots freed,
// without counting a failure of the job.
type AssignReply struct {
	Reply
	Busy bool `json:"busy,omitempty"`
}

// HostRequest (streamd.v1.hosts.<id>.cancel|savepoint|stop) acts on an
// attempt a host runs.
type HostRequest struct {
	JobID   string `json:"job_id"`
	Attempt int    `json:"attempt"`
	Term    uint64 `json:"term,omitempty"` // the controller's term (Assignment.Term)
	Dir     string `json:"dir,omitempty"`
	Drain   bool   `json:"drain,omitempty"`
}

// OutcomeReply (streamd.v1.hosts.<id>.outcome, request: HostRequest) is how
// an attempt ended on the host: Event is the final report the host sent (or
// tried to send) for it, nil if the host does not know the attempt (it never
// ran it, or forgot it: a host keeps the outcomes of its latest attempts
// only, in memory). Running: the attempt still runs there.
type OutcomeReply struct {
	Reply
	Running bool       `json:"running,omitempty"`
	Event   *HostEvent `json:"event,omitempty"`
}

// HostEvent (streamd.v1.hosts.events) reports an attempt's state on a host:
// running (with stats, about every second), finished, failed or canceled.
type HostEvent struct {
	HostID  string                  `json:"host_id"`
	JobID   string                  `json:"job_id"`
	Attempt int                     `json:"attempt"`
	State   string                  `json:"state"` // a subtask state word
	Error   string                  `json:"error,omitempty"`
	Elapsed string                  `json:"elapsed,omitempty"`
	Stats   []runtime.OperatorStats `json:"stats,omitempty"`
	// Savepoint is set with state finished when the attempt stopped with a
	// savepoint (streamd stop).
	Savepoint string `json:"savepoint,omitempty"`
	// Subtasks are the subtasks the event is about; empty = all of the
	// host's. With state failed: the subtask whose failure failed the
	// attempt, when the error names one.
	Subtasks []SubtaskRef `json:"subtasks,omitempty"`
	// Class, with state failed, says what a restart can do about the
	// failure (control.FailureClass): "non-recoverable" (the job fails at
	// once), "in-open" (it failed while opening); absent: restartable.
	Class string `json:"class,omitempty"`
	// Checkpoints are the latest completed checkpoints of a job the host
	// runs whole (with its own coordinator), oldest first.
	Checkpoints []runtime.CheckpointStats `json:"checkpoints,omitempty"`
}
