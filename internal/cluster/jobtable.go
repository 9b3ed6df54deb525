package cluster

// The job table in the controller's key-value bucket: each job's record,
// written by the leader in order (persistLoop) and fenced by its term, and
// read by the next leader.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/runtime"
)

// jobRecord is what the bucket keeps of one job: enough for another
// controller to list it, to adopt its running attempt, or to place its next
// one without reusing an attempt number.
type jobRecord struct {
	ID        string               `json:"id"`
	Spec      wire.JobSpec         `json:"spec"` // with its artifacts' digests (the modules are in ArtifactBucket)
	From      string               `json:"from,omitempty"`
	RequestID string               `json:"request_id,omitempty"` // of the deploy that made it
	State     string               `json:"state"`
	Reason    string               `json:"reason,omitempty"`
	Attempt   int                  `json:"attempt"`
	Slots     int                  `json:"slots"`
	Placement []string             `json:"placement,omitempty"` // of the current attempt, once assigned; nil: not placed
	LastHosts []string             `json:"last_hosts,omitempty"`
	Attempts  []wire.AttemptStatus `json:"attempts,omitempty"`
	// Failovers: lost-host restarts as records before the lifecycle counted
	// them (RestartState.Lost) kept them; read only.
	Failovers int        `json:"failovers,omitempty"`
	Savepoint string     `json:"savepoint,omitempty"`
	Created   time.Time  `json:"created"`
	Updated   time.Time  `json:"updated"`
	Ended     *time.Time `json:"ended,omitempty"`
	// Latest is the latest completed checkpoint or savepoint of the job
	// (or the one it was deployed from): what its next attempt restores.
	Latest   *control.RestorePoint `json:"latest,omitempty"`
	Restarts *control.RestartState `json:"restarts,omitempty"`
	Term     uint64                `json:"term"` // of the leader that wrote it
	// Versions and Upgrade: the version history, and the upgrade waiting
	// for its version to run (upgrade.go).
	Versions []wire.VersionStatus `json:"versions,omitempty"`
	Upgrade  *upgradeState        `json:"upgrade,omitempty"`
	// Declared is each operator's declared parallelism while Spec runs at
	// another (adaptive.go; nil: as declared); Rescales the latest
	// rescales; NoRescale why the job runs only as declared.
	Declared  map[string]int       `json:"declared,omitempty"`
	Rescales  []wire.RescaleStatus `json:"rescales,omitempty"`
	NoRescale string               `json:"no_rescale,omitempty"`
	// Autoscale is what the job's autoscaler decided (autoscale.go).
	Autoscale *autoscaleRecord `json:"autoscale,omitempty"`
}

var plainKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// jobKey is the bucket key of job id (ids that are not plain tokens are
// hex-encoded).
func jobKey(id string) string {
	if plainKeyRE.MatchString(id) {
		return jobPrefix + id
	}
	return jobPrefix + "=" + hex.EncodeToString([]byte(id))
}

// recordLocked is the record of j now.
func (c *Controller) recordLocked(j *ctlJob) jobRecord {
	r := jobRecord{ID: j.id, Spec: j.spec, From: j.from, RequestID: j.requestID, State: j.state, Reason: j.reason, Attempt: j.attempt, Slots: j.slots,
		Attempts: append([]wire.AttemptStatus(nil), j.attempts...), Savepoint: j.savepoint,
		Created: j.created, Updated: j.updated, Ended: j.ended, Latest: j.latest, Restarts: j.restarts, Term: c.term,
		Versions: slices.Clone(j.versions), Upgrade: j.upgrade, Declared: j.declared, Rescales: slices.Clone(j.rescales), NoRescale: j.noRescale,
		Autoscale: j.autoscaleRecord()}
	if j.placement != nil {
		r.Placement = append([]string(nil), j.placement.Slots...)
	}
	if j.lastPlaced != nil {
		r.LastHosts = j.lastPlaced.Slots
	}
	return r
}

// saveLocked queues the record of j for the bucket and returns its version:
// saved(j.id, version) waits until it is durable. Records are written in
// order by one goroutine (persistLoop), the newest of each job only.
func (c *Controller) saveLocked(j *ctlJob) uint64 {
	if c.term == 0 || c.closed {
		return 0
	}
	j.ver++
	c.queue[j.id] = queuedRecord{rec: c.recordLocked(j), ver: j.ver}
	select {
	case c.saveWake <- struct{}{}:
	default:
	}
	return j.ver
}

// forgetLocked removes the ended job j from the table and queues the
// deletion of its record from the bucket (after any write of it queued
// before); it returns the version saved waits for.
func (c *Controller) forgetLocked(j *ctlJob) uint64 {
	delete(c.jobs, j.id)
	c.order = slices.DeleteFunc(c.order, func(id string) bool { return id == j.id })
	if c.term == 0 || c.closed {
		return 0
	}
	j.ver++
	c.queue[j.id] = queuedRecord{rec: jobRecord{ID: j.id, Term: c.term}, ver: j.ver, deleted: true}
	select {
	case c.saveWake <- struct{}{}:
	default:
	}
	return j.ver
}

type queuedRecord struct {
	rec     jobRecord
	ver     uint64
	deleted bool // the job was deleted: its key is purged
}

// saved waits until version ver of job id's record is in the bucket; an
// error when the controller stopped first (deposed: the write failed).
func (c *Controller) saved(id string, ver uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return fmt.Errorf("cluster: controller stopped before job %s was saved", id)
		}
		if c.durable[id] >= ver {
			return nil
		}
		ch := c.savedCh
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
}

// persistLoop writes the queued job records. A write that finds another
// revision than the one this controller last wrote means another leader
// wrote it: this one is deposed.
func (c *Controller) persistLoop() {
	defer c.lwg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-c.saveWake:
		}
		for {
			c.mu.Lock()
			var ids []string
			for id := range c.queue {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			batch := make([]queuedRecord, 0, len(ids))
			for _, id := range ids {
				batch = append(batch, c.queue[id])
				delete(c.queue, id)
			}
			c.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, q := range batch {
				write := c.writeRecord
				if q.deleted {
					write = c.purgeRecord
				}
				if err := write(q.rec); err != nil {
					c.depose(err)
					return
				}
				c.mu.Lock()
				c.durable[q.rec.ID] = max(c.durable[q.rec.ID], q.ver)
				close(c.savedCh)
				c.savedCh = make(chan struct{})
				c.mu.Unlock()
			}
		}
	}
}

// writeRecord writes rec with the revision last seen of its key, retrying
// transient errors while the controller leads.
func (c *Controller) writeRecord(rec jobRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("cluster: encode the record of job %s: %w", rec.ID, err)
	}
	return c.changeRecord(rec, "saved", func(ctx context.Context, key string, last uint64) (uint64, error) {
		if last == 0 {
			return c.kv.Create(ctx, key, data)
		}
		return c.kv.Update(ctx, key, data, last)
	})
}

// purgeRecord removes the record of rec.ID from the bucket (its key and
// history), if it is still the revision this controller last saw.
func (c *Controller) purgeRecord(rec jobRecord) error {
	if c.rev(jobKey(rec.ID)) == 0 {
		return nil // never written
	}
	return c.changeRecord(rec, "deleted", func(ctx context.Context, key string, last uint64) (uint64, error) {
		return 0, c.kv.Purge(ctx, key, jetstream.LastRevision(last))
	})
}

// changeRecord applies op to the key of rec with the revision last seen of
// it and keeps the revision op returns (0: none, the key is gone), retrying
// transient errors while the controller leads.
func (c *Controller) changeRecord(rec jobRecord, done string, op func(ctx context.Context, key string, last uint64) (uint64, error)) error {
	key := jobKey(rec.ID)
	delay := 50 * time.Millisecond
	for {
		ctx, cancel := c.kvCtx()
		last := c.rev(key)
		rev, err := op(ctx, key, last)
		cancel()
		switch {
		case err == nil:
			c.setRev(key, rev)
			return nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			// Written by a leader of an earlier term that had not stopped
			// yet: this leader's change replaces it (and that leader's next
			// write fails). Of this or a later term: another leader acts.
			if newer, ok := c.olderWrite(key, rec.Term); ok {
				c.setRev(key, newer)
				continue
			}
			return fmt.Errorf("cluster: controller %s: job %s was written by another controller (revision %d is not the latest): %w", c.id, rec.ID, last, err)
		}
		c.log.Warn("job record not "+done+"; trying again", "job", rec.ID, "err", err)
		select {
		case <-c.done:
			return fmt.Errorf("cluster: job %s not %s: %w", rec.ID, done, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// olderWrite reports whether the record at key was written in a term before
// term, and its revision.
func (c *Controller) olderWrite(key string, term uint64) (uint64, bool) {
	ctx, cancel := c.kvCtx()
	defer cancel()
	e, err := c.kv.Get(ctx, key)
	if err != nil {
		return 0, false
	}
	var cur jobRecord
	if json.Unmarshal(e.Value(), &cur) != nil || cur.Term >= term {
		return 0, false
	}
	c.log.Warn("job record of an earlier leader replaced", "key", key, "its_term", cur.Term, "term", term)
	return e.Revision(), true
}

func (c *Controller) rev(key string) uint64 {
	c.revMu.Lock()
	defer c.revMu.Unlock()
	return c.revs[key]
}

func (c *Controller) setRev(key string, rev uint64) {
	c.revMu.Lock()
	defer c.revMu.Unlock()
	c.revs[key] = rev
}

// loadJobs reads the job table from the bucket.
func (c *Controller) loadJobs(ctx context.Context) ([]jobRecord, error) {
	var keys []string
	// Each listing of the keys gets a part of ctx (loadTableFirstTry, then
	// twice as long each time): it runs on an ordered consumer, which can
	// stall when NATS restarts under it (a new leader takes over just
	// then), and is tried again. The records are read after it, within ctx.
	try := loadTableFirstTry
	err := wire.DefaultRetry.Do(ctx, c.log, "list the job table", func(ctx context.Context) error {
		if err := natsutil.WaitConnected(ctx, c.nc); err != nil {
			return err
		}
		tctx, tcancel := context.WithTimeout(ctx, try)
		try = min(2*try, loadTableMaxTry)
		defer tcancel()
		lister, err := c.kv.ListKeysFiltered(tctx, jobPrefix+">")
		if err != nil {
			return fmt.Errorf("cluster: list the jobs in bucket %s: %w", c.opts.Bucket, err)
		}
		keys = keys[:0]
		for k := range lister.Keys() {
			keys = append(keys, k)
		}
		if err := tctx.Err(); err != nil {
			// The lister ends its keys silently when ctx ends: a table
			// read in part must not pass for the whole.
			return fmt.Errorf("cluster: list the jobs in bucket %s: %d keys before %w", c.opts.Bucket, len(keys), err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []jobRecord
	for _, k := range keys {
		e, err := c.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cluster: read %s from bucket %s: %w", k, c.opts.Bucket, err)
		}
		var r jobRecord
		if err := json.Unmarshal(e.Value(), &r); err != nil || r.ID == "" {
			c.log.Error("job record unreadable; skipped", "key", k, "err", err)
			continue
		}
		c.setRev(k, e.Revision())
		out = append(out, r)
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Created.Before(out[b].Created) })
	return out, nil
}

// jobFromRecord is the job of record r, as a new leader sees it at now.
func jobFromRecord(r jobRecord, now time.Time) *ctlJob {
	j := &ctlJob{id: r.ID, spec: r.Spec, state: r.State, reason: r.Reason, attempt: r.Attempt, slots: r.Slots,
		created: r.Created, updated: r.Updated, ended: r.Ended, savepoint: r.Savepoint, from: r.From, requestID: r.RequestID,
		attempts: r.Attempts, latest: r.Latest, restarts: r.Restarts, versions: r.Versions, upgrade: r.Upgrade,
		declared: r.Declared, rescales: r.Rescales, noRescale: r.NoRescale, auto: autoscaleFromRecord(r.Autoscale),
		placed: map[int]control.Placement{}, changed: make(chan struct{}), subtaskState: wire.SubtaskScheduled, resumed: true}
	if r.Failovers > 0 && (j.restarts == nil || j.restarts.Lost < r.Failovers) {
		rs := control.RestartState{Lost: r.Failovers}
		if j.restarts != nil {
			rs = *j.restarts
			rs.Lost = r.Failovers
		}
		j.restarts = &rs
	}
	if len(r.LastHosts) > 0 {
		j.lastPlaced = &control.Placement{Slots: r.LastHosts}
	}
	switch {
	case wire.TerminalJobState(r.State):
		j.subtaskState = map[string]string{wire.JobFinished: wire.SubtaskFinished, wire.JobStopped: wire.SubtaskFinished,
			wire.JobCanceled: wire.SubtaskCanceled, wire.JobFailed: wire.SubtaskFailed}[r.State]
	case len(r.Placement) > 0:
		p := control.Placement{Slots: r.Placement}
		j.placement, j.lastPlaced = &p, &p
		j.placed[j.attempt] = p
		j.hostStats = map[string][]runtime.OperatorStats{}
		j.assignedAt, j.endedOn, j.unlisted, j.asking = now, map[string]bool{}, map[string]int{}, map[string]bool{}
		j.subtaskState = wire.SubtaskRunning
		if r.State != wire.JobRunning && r.State != wire.JobFinishing {
			j.subtaskState = wire.SubtaskDeploying
		}
		if r.State == wire.JobStopping {
			// The stop's request went with the old leader: the job runs on.
			j.state, j.reason = wire.JobRunning, "a stop with savepoint was interrupted by a change of controller"
		}
	case r.State == wire.JobRestarting:
		j.restartAt = now
	}
	return j
}

// restoreFrom is what the next attempt of j restores: its latest restore
// point, else the checkpoint it was deployed from.
func (j *ctlJob) restoreFrom() string {
	if j.latest != nil && j.latest.Location != "" {
		return j.latest.Location
	}
	return j.from
}
