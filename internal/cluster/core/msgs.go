package core

import (
	"fmt"
	"strings"

	"github.com/streamd/streamd/control"
)

// AttemptRef names one attempt of one job.
type AttemptRef struct {
	Job     string
	Attempt int
}

func (r AttemptRef) String() string { return fmt.Sprintf("%s#%d", r.Job, r.Attempt) }

// Event is an input to Core.Step.
type Event interface {
	isEvent()
	String() string
}

// Tick advances the core's clock by one tick: heartbeat timeouts, the
// lease, slot waits and every job's lifecycle (restart delays, checkpoint
// intervals) count ticks.
type Tick struct{}

// Heartbeat is a host's periodic report: its slots and the attempts it runs
// (from their assignment until it reported their end).
type Heartbeat struct {
	Host    string
	Slots   int
	Running []AttemptRef
}

// HostLost says a host is gone for good (it said goodbye, or the loop knows
// otherwise); a host that only falls silent is declared lost by the core
// after Config.HeartbeatTimeout ticks.
type HostLost struct {
	Host   string
	Reason string
}

// Deploy asks for a new job. Request identifies the request in the Reply.
type Deploy struct {
	Request string
	Spec    JobSpec
}

// CancelJob asks to cancel a job.
type CancelJob struct {
	Request string
	Job     string
}

// AttemptReport is a host's report about its part of an attempt: a subtask
// event for the job's checkpoint coordinator (Task), or the end of its part
// (Ended, or Failed with a reason).
type AttemptReport struct {
	Ref  AttemptRef
	Host string
	// Task is a subtask's event (TaskRunning, Ack, TaskFinished, ...); nil
	// for an end.
	Task    control.Event
	Ended   bool
	Failed  string
	Class   control.FailureClass
	Subtask control.SubtaskID
}

// AssignResult is a host's answer to Assign; Err "" : it runs its part.
type AssignResult struct {
	Ref  AttemptRef
	Host string
	Err  string
}

// CancelResult: the host stopped its part of an attempt (its slots are free).
type CancelResult struct {
	Ref  AttemptRef
	Host string
}

// JobTaskEvent is the outcome of a job's coordinator action that the loop
// carried out: Persisted or PersistFailed of a checkpoint's metadata.
type JobTaskEvent struct {
	Ref   AttemptRef
	Event control.Event
}

// StoreResult answers Persist. OK: written at revision Rev. Else the
// record's current revision (Rev) and the term that wrote it (Term); Err
// says what went wrong when the store could not be reached (Rev, Term 0).
type StoreResult struct {
	Job  string
	Ver  uint64 // the Persist's version
	OK   bool
	Rev  uint64
	Term uint64
	Err  string
}

// LeaseSeen is the lease record as the loop read or watched it.
type LeaseSeen struct {
	Holder   string
	Term     uint64
	Rev      uint64
	Released bool
}

// LeaseResult answers AcquireLease and RenewLease: OK with the lease's new
// revision, or the lease as it is (Holder, Term, Rev; Err when the store
// could not be reached).
type LeaseResult struct {
	Term   uint64 // the term asked for
	OK     bool
	Rev    uint64
	Holder string
	Held   uint64 // the term of the lease as it is, when not OK
	Err    string
}

// TableLoaded answers LoadTable: every job record in the store.
type TableLoaded struct {
	Term    uint64
	Records []Stored
}

// Stored is a job record with its revision in the store.
type Stored struct {
	Record Record
	Rev    uint64
}

// RecordSeen is a job record written by anyone, as the loop watched it.
type RecordSeen struct{ Stored }

// Announced is a controller's announcement of the term it leads.
type Announced struct {
	ID   string
	Term uint64
}

func (Tick) isEvent()          {}
func (Heartbeat) isEvent()     {}
func (HostLost) isEvent()      {}
func (Deploy) isEvent()        {}
func (CancelJob) isEvent()     {}
func (AttemptReport) isEvent() {}
func (AssignResult) isEvent()  {}
func (CancelResult) isEvent()  {}
func (JobTaskEvent) isEvent()  {}
func (StoreResult) isEvent()   {}
func (LeaseSeen) isEvent()     {}
func (LeaseResult) isEvent()   {}
func (TableLoaded) isEvent()   {}
func (RecordSeen) isEvent()    {}
func (Announced) isEvent()     {}

func (Tick) String() string { return "tick" }
func (e Heartbeat) String() string {
	return fmt.Sprintf("heartbeat %s slots=%d running=%s", e.Host, e.Slots, refs(e.Running))
}
func (e HostLost) String() string { return fmt.Sprintf("host-lost %s reason=%q", e.Host, e.Reason) }
func (e Deploy) String() string   { return fmt.Sprintf("deploy %s req=%s", e.Spec.ID, e.Request) }
func (e CancelJob) String() string {
	return fmt.Sprintf("cancel %s req=%s", e.Job, e.Request)
}
func (e AttemptReport) String() string {
	switch {
	case e.Task != nil:
		return fmt.Sprintf("report %s %s %s", e.Ref, e.Host, e.Task)
	case e.Ended:
		return fmt.Sprintf("report %s %s ended", e.Ref, e.Host)
	}
	return fmt.Sprintf("report %s %s failed %q", e.Ref, e.Host, e.Failed)
}
func (e AssignResult) String() string {
	return fmt.Sprintf("assign-result %s %s err=%q", e.Ref, e.Host, e.Err)
}
func (e CancelResult) String() string { return fmt.Sprintf("cancel-result %s %s", e.Ref, e.Host) }
func (e JobTaskEvent) String() string { return fmt.Sprintf("%s: %s", e.Ref, e.Event) }
func (e StoreResult) String() string {
	return fmt.Sprintf("store-result %s v%d ok=%t rev=%d term=%d", e.Job, e.Ver, e.OK, e.Rev, e.Term)
}
func (e LeaseSeen) String() string {
	return fmt.Sprintf("lease-seen %s term=%d rev=%d released=%t", e.Holder, e.Term, e.Rev, e.Released)
}
func (e LeaseResult) String() string {
	return fmt.Sprintf("lease-result term=%d ok=%t rev=%d", e.Term, e.OK, e.Rev)
}
func (e TableLoaded) String() string { return fmt.Sprintf("table-loaded %d", len(e.Records)) }
func (e RecordSeen) String() string {
	return fmt.Sprintf("record-seen %s term=%d rev=%d", e.Record.Job, e.Record.Term, e.Rev)
}
func (e Announced) String() string { return fmt.Sprintf("announced %s term=%d", e.ID, e.Term) }

// Action is an output of Core.Step, for the loop to carry out in order.
// Assignments and cancels carry the term: hosts refuse those of a term
// older than the newest they know.
type Action interface {
	isAction()
	String() string
}

// Assign sends attempt Ref's part on Host: the job's slots Slots (indices
// into Placement), restored from Restore. The record naming the attempt
// is durable by then (a later leader never reuses the attempt number).
type Assign struct {
	Ref       AttemptRef
	Term      uint64
	Host      string
	Graph     *control.JobGraph
	Placement []string
	Slots     []int
	Restore   *control.RestorePoint
}

// CancelAttempt tells Host to stop its part of attempt Ref; it answers
// with CancelResult once stopped.
type CancelAttempt struct {
	Ref    AttemptRef
	Term   uint64
	Host   string
	Reason string
}

// AskOutcome asks Host how its part of attempt Ref ended: its heartbeats
// stopped listing it but its end report never came. It answers with an
// AttemptReport.
type AskOutcome struct {
	Ref  AttemptRef
	Term uint64
	Host string
}

// Persist writes Record if the job's record is still at revision Rev (0:
// create it); the loop answers with StoreResult.
type Persist struct {
	Record Record
	Ver    uint64
	Rev    uint64
}

// Announce tells hosts and other controllers that this one leads Term.
type Announce struct {
	ID   string
	Term uint64
}

// Reply answers request Request: Code "" on success (Job names the job),
// else one of the Code* values with a message.
type Reply struct {
	Request string
	Job     string
	Code    string
	Msg     string
}

// Reply codes.
const (
	CodeNotFound    = "not_found"
	CodeConflict    = "conflict"
	CodeBadRequest  = "bad_request"
	CodeUnavailable = "unavailable"
)

// AcquireLease takes the lease for Term if it is still at revision Rev (0:
// create it); the loop answers with LeaseResult.
type AcquireLease struct {
	ID   string
	Term uint64
	Rev  uint64
}

// RenewLease renews the lease of Term at revision Rev.
type RenewLease struct {
	ID   string
	Term uint64
	Rev  uint64
}

// LoadTable reads every job record; the loop answers with TableLoaded.
type LoadTable struct{ Term uint64 }

// JobAction is an action of a job's checkpoint coordinator (trigger,
// persist metadata, notify, abort, discard) for the loop to carry out
// against attempt Ref's subtasks and the checkpoint storage.
type JobAction struct {
	Ref    AttemptRef
	Action control.Action
}

// JobChanged says a job's state changed (for status and waiting requests).
type JobChanged struct {
	Job    string
	State  control.JobState
	Slots  int // the parallelism it runs (or is to run) at
	Reason string
}

// Deposed: this core stopped acting (its lease expired, another leader
// wrote in a later term). Nothing follows; the loop stands a new core by.
type Deposed struct {
	Term   uint64
	Reason string
}

func (Assign) isAction()        {}
func (CancelAttempt) isAction() {}
func (AskOutcome) isAction()    {}
func (Persist) isAction()       {}
func (Announce) isAction()      {}
func (Reply) isAction()         {}
func (AcquireLease) isAction()  {}
func (RenewLease) isAction()    {}
func (LoadTable) isAction()     {}
func (JobAction) isAction()     {}
func (JobChanged) isAction()    {}
func (Deposed) isAction()       {}

func (a Assign) String() string {
	return fmt.Sprintf("assign %s %s slots=%s term=%d from=%s", a.Ref, a.Host, ints(a.Slots), a.Term, a.Restore)
}
func (a CancelAttempt) String() string {
	return fmt.Sprintf("cancel %s %s term=%d reason=%q", a.Ref, a.Host, a.Term, a.Reason)
}
func (a AskOutcome) String() string {
	return fmt.Sprintf("ask-outcome %s %s term=%d", a.Ref, a.Host, a.Term)
}
func (a Persist) String() string  { return fmt.Sprintf("persist %s v%d rev=%d", a.Record, a.Ver, a.Rev) }
func (a Announce) String() string { return fmt.Sprintf("announce %s term=%d", a.ID, a.Term) }
func (a Reply) String() string {
	if a.Code == "" {
		return fmt.Sprintf("reply %s ok job=%s", a.Request, a.Job)
	}
	return fmt.Sprintf("reply %s %s %q", a.Request, a.Code, a.Msg)
}
func (a AcquireLease) String() string {
	return fmt.Sprintf("acquire-lease %s term=%d rev=%d", a.ID, a.Term, a.Rev)
}
func (a RenewLease) String() string {
	return fmt.Sprintf("renew-lease term=%d rev=%d", a.Term, a.Rev)
}
func (a LoadTable) String() string { return fmt.Sprintf("load-table term=%d", a.Term) }
func (a JobAction) String() string { return fmt.Sprintf("%s: %s", a.Ref, a.Action) }
func (a JobChanged) String() string {
	s := fmt.Sprintf("job %s %s p=%d", a.Job, a.State, a.Slots)
	if a.Reason != "" {
		s += fmt.Sprintf(" reason=%q", a.Reason)
	}
	return s
}
func (a Deposed) String() string { return fmt.Sprintf("deposed term=%d reason=%q", a.Term, a.Reason) }

func refs(rs []AttemptRef) string {
	if len(rs) == 0 {
		return "-"
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
