package wire

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Version states (VersionStatus.State); a version that ran last shows its
// job's end state (stopped, canceled, failed, finished) once the job ended.
const (
	VersionStarting   = "starting"    // started by an upgrade (or a rollback), not running yet
	VersionRunning    = "running"     // every subtask runs, restored
	VersionReplaced   = "replaced"    // upgraded to a later version
	VersionRolledBack = "rolled back" // did not start or restore: the version before it was started again
	VersionFailed     = "failed"      // a rollback that did not start either
)

// DefaultUpgradeStartTimeout is how long a new version may take to run, by
// default (UpgradeRequest.StartTimeout). A rollback, which starts the
// version that ran before, has at least this long whatever the request
// said: a short timeout meant for the new version must not fail the job
// whose old version is merely slow to start again.
const DefaultUpgradeStartTimeout = 2 * time.Minute

// VersionStatus is one version of a job: what it ran, when it started,
// from which savepoint, and how it went.
type VersionStatus struct {
	Version int `json:"version"` // 1, 2, ...
	// Modules are the digests of the version's wasm modules, per operator.
	Modules []ModuleVersion `json:"modules"`
	// JobFile is the digest of the job file it was deployed or upgraded
	// with ("" for a module, or a module swapped into a job).
	JobFile string    `json:"job_file,omitempty"`
	Started time.Time `json:"started"`
	From    string    `json:"from,omitempty"`    // the savepoint (or checkpoint) it started from
	Attempt int       `json:"attempt"`           // its first attempt
	State   string    `json:"state"`             // a Version* word, or the job's end state
	Reason  string    `json:"reason,omitempty"`  // why it was rolled back or failed
	Rerun   int       `json:"rerun,omitempty"`   // a rollback: the version it runs again
	Timeout string    `json:"timeout,omitempty"` // of a version started by an upgrade: how long it had to run
}

// ModuleVersion is the module of one wasm operator.
type ModuleVersion struct {
	Operator string `json:"operator"`
	Name     string `json:"name"`
	Digest   string `json:"digest"`
}

// UpgradeRequest (streamd.v1.ctl.upgrade) upgrades a running job: to the
// job Job (a job file's spec), or, with Module, to the job as it runs with
// the module of operator Operator ("" = its only wasm operator) replaced.
type UpgradeRequest struct {
	JobID    string    `json:"job_id"`
	Job      *JobSpec  `json:"job,omitempty"`
	Module   *Artifact `json:"module,omitempty"`
	Operator string    `json:"operator,omitempty"`
	// StartTimeout bounds the time from the new version's start until it
	// runs (a rollback: at least DefaultUpgradeStartTimeout); 0:
	// DefaultUpgradeStartTimeout.
	StartTimeout time.Duration `json:"start_timeout,omitempty"`
}

// UpgradeReply answers once the job stopped with its savepoint and the new
// version was started (or, if the new version cannot restore that
// savepoint, the old one again): JobStatus.Versions[Version-1] tells how
// it goes on.
type UpgradeReply struct {
	Reply
	Savepoint string `json:"savepoint,omitempty"`
	Version   int    `json:"version,omitempty"`
	// Replaced: the job did not run (it restarted, or waited for slots), so
	// no savepoint was taken: the new version started from the job's latest
	// checkpoint, Savepoint, or from nothing when that is "".
	Replaced bool `json:"replaced,omitempty"`
}

// fromWhat says where a version starts: "from savepoint X" (or checkpoint),
// or "from nothing".
func StartsFrom(location string) string {
	switch {
	case location == "":
		return "from nothing"
	case strings.Contains(location, "savepoint-"):
		return "from savepoint " + location
	}
	return "from checkpoint " + location
}

// WithModule is s with the module of wasm operator uid (""; the only one)
// replaced by m; the job file no longer describes it.
func (s JobSpec) WithModule(uid string, m Artifact) (JobSpec, error) {
	var wasm []string
	at := -1
	for i, v := range s.Vertices {
		if v.Wasm == nil {
			continue
		}
		wasm = append(wasm, v.UID)
		if v.UID == uid || uid == "" {
			at = i
		}
	}
	switch {
	case uid == "" && len(wasm) != 1:
		return JobSpec{}, fmt.Errorf("the job has %d wasm operators (%s): name the one whose module to replace (--operator UID), or upgrade with a job file", len(wasm), strings.Join(wasm, ", "))
	case at < 0:
		return JobSpec{}, fmt.Errorf("the job has no wasm operator %q (its wasm operators: %s)", uid, strings.Join(wasm, ", "))
	}
	out := s
	out.JobFile = nil
	out.Vertices = slices.Clone(s.Vertices)
	w := *out.Vertices[at].Wasm
	w.Module = m
	out.Vertices[at].Wasm = &w
	return out, nil
}
