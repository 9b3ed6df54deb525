package cluster

// The durable, highly available controller (DESIGN.md "Distribution"): the
// job table and every job's lifecycle state live in the JetStream key-value
// bucket ControllerBucket; one controller leads by a lease in the bucket,
// any others stand by. A leader (a new one, or one started again) loads the
// table and adopts the attempts that still run from the hosts' reports,
// without restarting them.
//
// Keys of the bucket:
//
//	leader        leaseRecord: holder, term, when renewed
//	jobs.<job id> jobRecord: the job's spec, state, attempt, placement,
//	              history, latest restore point, restart strategy state
//
// Timing, from the heartbeat interval I (ControllerOptions.HeartbeatInterval):
// the leader renews its lease every I/2; a standby takes the lease over
// when it has seen no renewal for 3 renewals (1.5 I), with the next term;
// a leader that could not renew for I stops acting (it may be cut off), so
// it has stopped before a standby takes over. Writes of the leader use the
// revision it last read or wrote (KV Update): a deposed leader's write
// fails, and it stops at once. Hosts accept commands of the newest term they
// know only (the leader announces its term on SubjectLeader every renewal
// and sends it with every command).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/core"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/runtime"
)

// DefaultControllerBucket is the default of ControllerOptions.Bucket.
const DefaultControllerBucket = "STREAMD_CONTROLLER"

// maxReplicas is the most replicas JetStream allows for a stream.
const maxReplicas = 5

const (
	leaseKey  = "leader"
	jobPrefix = "jobs."
)

// leaseRecord is the value of the lease key.
type leaseRecord struct {
	Holder   string    `json:"holder"`
	Term     uint64    `json:"term"`
	Renewed  time.Time `json:"renewed"`
	Interval string    `json:"interval"`
	// Released: the holder stopped (Close) and gave the lease up; a
	// standby takes it at once.
	Released bool `json:"released,omitempty"`
}

// openControllerBucket opens the controller's bucket, creating it with
// replicas replicas (0: as many as the NATS cluster has servers, at most
// maxReplicas; 1 without a cluster).
func openControllerBucket(ctx context.Context, nc *nats.Conn, bucket string, replicas int) (jetstream.KeyValue, int, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: controller bucket %s: %w", bucket, err)
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err == nil {
		st, err := kv.Status(ctx)
		r := 0
		if err == nil {
			if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
				r = s.StreamInfo().Config.Replicas
			}
		}
		return kv, r, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, 0, fmt.Errorf("cluster: controller bucket %s (the NATS server needs JetStream): %w", bucket, err)
	}
	if replicas <= 0 {
		replicas = clusterReplicas(nc)
	}
	cfg := jetstream.KeyValueConfig{Bucket: bucket, Description: "streamd controller: job table and leader lease",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, bucket)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: create controller bucket %s with %d replicas: %w", bucket, replicas, err)
	}
	return kv, replicas, nil
}

// clusterReplicas is the replica count of a bucket that follows the NATS
// cluster nc is connected to: its known servers, at most maxReplicas; 1
// without a cluster.
func clusterReplicas(nc *nats.Conn) int {
	if nc.ConnectedClusterName() == "" {
		return 1
	}
	return max(1, min(len(nc.Servers()), maxReplicas))
}

func newControllerID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return wire.NewHostID() + "-" + hex.EncodeToString(b[:2])
}

// leaseTiming is how often the leader renews, how long a lease lasts
// without renewal for a standby, and how long the leader itself goes on
// without a renewal.
func (c *Controller) leaseTiming() (renew, expiry, selfExpiry time.Duration) {
	renew = max(c.opts.HeartbeatInterval/2, 5*time.Millisecond)
	return renew, 3 * renew, 2 * renew
}

// leaseLoop renews the lease while this controller leads, and tries to take
// it while it stands by; core.Lease decides when, in ticks of renew/2 (the
// time that passed, however long the bucket took to answer): the leader
// renews every tick and stops acting after 4 without a renewal (2 renew
// intervals), a standby takes over after 6 (3). It ends with the controller.
func (c *Controller) leaseLoop() {
	defer c.lwg.Done()
	renew, _, _ := c.leaseTiming()
	period := renew / 2
	t := time.NewTicker(period)
	defer t.Stop()
	start, ticks := time.Now(), int64(0)
	for first := true; ; first = false {
		// The ticks that passed first, then (standing by) the lease as it
		// is now, then this tick: a read is as fresh as the tick it counts
		// from, however late this loop ran.
		due := int64(time.Since(start)/period) + 1
		for ; ticks < due-1; ticks++ {
			c.stepLease(core.Tick{})
		}
		if c.lease.Term() == 0 && !c.lease.Deposed() {
			if seen, ok := c.readLease(); ok {
				c.stepLease(seen)
			}
		}
		for ; ticks < due; ticks++ {
			c.stepLease(core.Tick{})
		}
		if first && c.leaseTerm == 0 {
			c.firstTried()
		}
		select {
		case <-c.done:
			return
		case <-t.C:
		}
	}
}

func (c *Controller) kvCtx() (context.Context, context.CancelFunc) {
	_, _, self := c.leaseTiming()
	return context.WithTimeout(context.Background(), max(self, time.Second))
}

// leaseConfig is the lease's timing in ticks of the lease loop.
func (c *Controller) leaseConfig() core.Config {
	return core.Config{ID: c.id, LeaseRenew: 1, LeaseSelf: 4, LeaseTTL: 6}
}

// stepLease steps the lease with ev and carries its actions out.
func (c *Controller) stepLease(ev core.Event) {
	for _, a := range c.lease.Step(ev) {
		switch x := a.(type) {
		case core.AcquireLease:
			c.stepLease(c.writeLease(x.Term, x.Rev, false))
		case core.RenewLease:
			c.stepLease(c.writeLease(x.Term, x.Rev, true))
		case core.Elected:
			c.elected(x.Term)
		case core.Deposed:
			c.depose(fmt.Errorf("cluster: controller %s: %s", c.id, x.Reason))
		}
	}
}

// readLease reads the lease (Rev 0: there is none); false when it could
// not be read.
func (c *Controller) readLease() (core.LeaseSeen, bool) {
	ctx, cancel := c.kvCtx()
	defer cancel()
	e, err := c.kv.Get(ctx, leaseKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return core.LeaseSeen{}, true
	case err != nil:
		c.log.Debug("lease not read", "err", err)
		return core.LeaseSeen{}, false
	}
	var cur leaseRecord
	if err := json.Unmarshal(e.Value(), &cur); err != nil {
		c.log.Warn("bad lease record; taking the lease", "err", err)
		return core.LeaseSeen{Rev: e.Revision(), Released: true}, true
	}
	return core.LeaseSeen{Holder: cur.Holder, Term: cur.Term, Rev: e.Revision(), Released: cur.Released}, true
}

// writeLease writes the lease of term if it is at revision rev (0: create
// it): a standby taking it, or the leader renewing it (then announcing its
// term to the hosts).
//
// A renewal gets until the lease could expire for a standby (its last
// successful write's send time plus the expiry: a standby counts the expiry
// from when it saw that write, which is later) and no longer: a renewal
// held up by NATS must not keep the lease loop, which counts the ticks that
// depose this leader, from stepping them while a standby takes the lease
// over (the leader's checkpoint coordinators would go on committing, and
// retention would remove what the new leader restores). A renewal that
// succeeds at all proves no standby took the lease (its write would have
// changed the revision).
func (c *Controller) writeLease(term, rev uint64, renewal bool) core.LeaseResult {
	ctx, cancel := c.kvCtx()
	if renewal && !c.leaseSent.IsZero() {
		cancel()
		_, expiry, _ := c.leaseTiming()
		ctx, cancel = context.WithDeadline(context.Background(), c.leaseSent.Add(expiry))
	}
	defer cancel()
	sent := time.Now()
	data, _ := json.Marshal(leaseRecord{Holder: c.id, Term: term, Renewed: sent, Interval: c.opts.HeartbeatInterval.String()})
	var err error
	var nrev uint64
	if rev == 0 {
		nrev, err = c.kv.Create(ctx, leaseKey, data)
	} else {
		nrev, err = c.kv.Update(ctx, leaseKey, data, rev)
	}
	switch {
	case err == nil:
		c.leaseRev, c.leaseSent = nrev, sent
		if renewal && c.announced.Load() {
			c.announce(term) // again, for hosts that missed it
		}
		return core.LeaseResult{Term: term, OK: true, Rev: nrev}
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		r := core.LeaseResult{Term: term}
		if seen, ok := c.readLease(); ok {
			r.Holder, r.Held, r.Rev = seen.Holder, seen.Term, seen.Rev
		}
		return r
	}
	if renewal {
		c.log.Warn("lease not renewed; trying again", "term", term, "err", err)
	} else {
		c.log.Debug("lease not taken", "err", err)
	}
	return core.LeaseResult{Term: term, Err: err.Error()}
}

// elected: this controller took the lease of term. It is renewed while
// lead loads the table and adopts the jobs, however long that takes.
func (c *Controller) elected(term uint64) {
	c.leaseTerm = term
	c.log.Info("taking the lead", "term", term)
	c.lwg.Add(1)
	go func() {
		defer c.lwg.Done()
		defer c.firstTried()
		select {
		case <-c.done:
			return
		default:
		}
		if err := c.lead(term); err != nil {
			c.depose(fmt.Errorf("cluster: controller %s: could not take the lead in term %d: %w", c.id, term, err))
		}
	}()
}

// firstTried ends StartController's wait for the first try for the lease.
func (c *Controller) firstTried() { c.firstOnce.Do(func() { close(c.firstTry) }) }

// announce tells the hosts who leads in which term (they fence older terms).
func (c *Controller) announce(term uint64) {
	data, _ := json.Marshal(wire.LeaderAnnounce{ID: c.id, Term: term})
	_ = c.nc.Publish(wire.SubjectLeader, data)
}

// resign gives the lease up (Close of a leader; a standby takes it at once)
// when release is set, else only stops leading.
func (c *Controller) resign(release bool) {
	if !release {
		return
	}
	ctx, cancel := c.kvCtx()
	defer cancel()
	data, _ := json.Marshal(leaseRecord{Holder: c.id, Term: c.leaseTerm, Renewed: time.Now(), Released: true})
	if _, err := c.kv.Update(ctx, leaseKey, data, c.leaseRev); err != nil {
		c.log.Debug("lease not released", "err", err)
	}
}

// depose stops a leader that lost its lease or a write to the bucket: it
// ends at once (Done), without a word to the hosts; the new leader adopts
// its jobs.
func (c *Controller) depose(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.deposedErr = err
	c.mu.Unlock()
	c.log.Error("controller deposed: it stops acting", "err", err)
	go c.shutdown(false)
}

// RunController runs a controller on nc until ctx ends. A controller that
// was deposed (it lost its lease, or could not renew it in time) stops
// acting at once; a new one then stands by in its place, so the process
// keeps a controller that can lead again.
func RunController(ctx context.Context, nc *nats.Conn, opts ControllerOptions) error {
	for {
		ctl, err := StartController(nc, opts)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			ctl.Close()
			return nil
		case <-ctl.Done():
			if opts.Logger != nil {
				opts.Logger.Warn("controller deposed; standing by again", "err", ctl.Err())
			}
		}
	}
}

// Done is closed when the controller has stopped: Close, or deposed (Err
// says why; start a new controller to stand by again).
func (c *Controller) Done() <-chan struct{} { return c.ended }

// Err is why the controller stopped when it was deposed, else nil.
func (c *Controller) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deposedErr
}

func (c *Controller) leaderTerm() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term
}

// Leader is this controller's id and the term it leads (0: it stands by).
func (c *Controller) Leader() (string, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id, c.term
}

// loadTableFirstTry bounds the first listing of the job table's keys when
// taking the lead; each try after it gets twice as long, up to
// loadTableMaxTry. A listing takes milliseconds; one that stalls (its
// ordered consumer started as NATS restarted) is better cut early: clients
// wait for a leader for DefaultLeaderWait (10 s), and a first try of 10 s
// took all of it (TestChaos, round 18), one of 2 s most of a takeover.
const (
	loadTableFirstTry = 250 * time.Millisecond
	loadTableMaxTry   = 16 * time.Second
)

// lead makes this controller the leader of term: it loads the job table,
// sets up the jobs whose attempt runs (adopted: not restarted; their hosts'
// reports decide whether they still run), subscribes to the control API
// and the hosts, and announces its term.
func (c *Controller) lead(term uint64) error {
	leadStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), wire.DefaultRetry.Total)
	defer cancel()
	// Records written after the table is read, by a leader of an older term
	// that has not stopped yet (its writes held up by a NATS outage), are
	// watched from before the read: see lateRecord.
	if err := natsutil.WaitConnected(ctx, c.nc); err != nil { // a watch begun while it is down stalls too
		return err
	}
	wctx, wcancel := context.WithCancel(context.Background())
	w, err := c.kv.Watch(wctx, jobPrefix+">", jetstream.UpdatesOnly())
	if err != nil {
		wcancel()
		return fmt.Errorf("cluster: watch the jobs in bucket %s: %w", c.opts.Bucket, err)
	}
	var recs []jobRecord
	err = wire.DefaultRetry.Do(ctx, c.log, "read the job table", func(ctx context.Context) error {
		var err error
		recs, err = c.loadJobs(ctx)
		return err
	})
	if err != nil {
		wcancel()
		return err
	}
	now := time.Now()
	c.log.Debug("job table read", "records", len(recs), "took", now.Sub(leadStart))
	c.mu.Lock()
	c.term = term
	c.mu.Unlock()
	var adopted []*ctlJob
	for _, r := range recs {
		took := time.Now()
		if j := c.takeRecord(r, term, now); j.dist != nil {
			adopted = append(adopted, j)
		}
		if !wire.TerminalJobState(r.State) {
			// A job not ended opens its checkpoint store and lists it:
			// what a takeover spends its time on.
			c.log.Debug("job record taken", "job", r.ID, "state", r.State, "took", time.Since(took))
		}
	}
	// What each adopted job runs, read here: once this leader subscribes,
	// a host's report may fail the attempt (and clear its placement)
	// before its adopt is posted (the job's side holds that failure until
	// then: distJob.failover).
	type adoption struct {
		j       *ctlJob
		attempt int
		p       control.Placement
	}
	adoptions := make([]adoption, 0, len(adopted))
	// Taking the records can take seconds (each job's checkpoint store is
	// listed): the adopted hosts' heartbeat timeout starts now, not
	// before, or they would be lost before their next heartbeat.
	now = time.Now()
	c.mu.Lock()
	for _, j := range adopted {
		c.adoptLocked(j, now)
		adoptions = append(adoptions, adoption{j, j.attempt, *j.placement})
	}
	// The hosts the attempts of the jobs not ended ran on: one that died
	// before this leader took over is shown lost, as it was, instead of
	// missing from the hosts.
	for _, r := range recs {
		if wire.TerminalJobState(r.State) {
			continue
		}
		for _, id := range r.LastHosts {
			c.expectHostLocked(id, now)
		}
		for _, a := range r.Attempts {
			for _, id := range a.Hosts {
				c.expectHostLocked(id, now)
			}
		}
	}
	for _, id := range c.order {
		if j := c.jobs[id]; j.ver == 0 && !wire.TerminalJobState(j.state) {
			c.saveLocked(j) // written in this term: a deposed leader's later write fails
		}
	}
	c.mu.Unlock()
	if err := c.subscribe(term); err != nil {
		wcancel()
		return err
	}
	c.announce(term)
	// From now on the renewals announce it too: not before, or a host
	// that learns the term would report its attempts before this leader
	// listens for them.
	c.announced.Store(true)
	for _, a := range adoptions {
		c.log.Info("job adopted", "job", a.j.id, "attempt", a.attempt, "hosts", a.p.Hosts())
		a.j.dist.adopt(a.attempt, a.p)
	}
	c.wg.Add(3)
	go c.ticker()
	go c.watchStalls()
	go c.watchRecords(w, wcancel)
	c.log.Info("controller leads", "id", c.id, "term", term, "jobs", len(recs), "adopted", len(adopted), "took", time.Since(leadStart).Round(time.Millisecond))
	return nil
}

// takeRecord makes the job of record r this leader's (term): a job whose
// attempt was assigned gets its controller side, which takes the attempt
// over without deploying anything (j.dist; adoptLocked and dist.adopt
// finish that). Called without c.mu.
func (c *Controller) takeRecord(r jobRecord, term uint64, now time.Time) *ctlJob {
	j := jobFromRecord(r, now)
	if j.placement != nil {
		// The attempt was assigned: it may run.
		dj, err := c.newDistJob(j.id, j.spec, j.restoreFrom(), j.attempt, true, &runtime.Takeover{Restarts: j.restarts})
		if err != nil {
			c.log.Error("running job cannot be adopted; it fails", "job", j.id, "attempt", j.attempt, "err", err)
			j.placement = nil
			c.mu.Lock()
			c.endLocked(j, now, wire.JobFailed, fmt.Sprintf("controller term %d could not adopt attempt %d: %v", term, j.attempt, err))
			c.mu.Unlock()
		} else {
			j.dist = dj
		}
	}
	c.mu.Lock()
	c.jobs[j.id] = j
	c.order = append(c.order, j.id)
	c.mu.Unlock()
	return j
}

// adoptLocked holds the slots of j's adopted attempt. Until the hosts of
// adopted attempts have reported (or two heartbeat intervals passed)
// nothing is placed: their slots are not known yet. A host that never
// reports is lost as usual.
func (c *Controller) adoptLocked(j *ctlJob, now time.Time) {
	if until := now.Add(2 * c.opts.HeartbeatInterval); until.After(c.adoptUntil) {
		c.adoptUntil = until
	}
	for _, id := range j.placement.Hosts() {
		if c.expectHostLocked(id, now) {
			c.awaiting[id] = true
		}
	}
	c.holdLocked(j, *j.placement)
	for _, id := range j.placement.Hosts() {
		c.settleLocked(id, wire.AttemptRef{JobID: j.id, Attempt: j.attempt}, now)
	}
	c.saveLocked(j) // written in this term: a deposed leader's later write fails
}

// expectHostLocked adds host id, named by the job table, to the hosts
// unless known: it counts no slots and is shown unconfirmed until its
// first heartbeat, and is lost when none comes within the heartbeat
// timeout (as if it had been seen now). It reports whether it added it.
func (c *Controller) expectHostLocked(id string, now time.Time) bool {
	if id == "" || c.hosts[id] != nil {
		return false
	}
	c.hosts[id] = &ctlHost{id: id, interval: c.opts.HeartbeatInterval, lastSeen: now, unconfirmed: true,
		busy: map[wire.AttemptRef]*slotUse{}, ended: map[wire.AttemptRef]time.Time{}}
	return true
}

// catchUp takes job id from the bucket if this leader does not know it
// (yet): a request naming a job the previous leader deployed just before it
// stopped can come before the record's update reaches watchRecords.
func (c *Controller) catchUp(id string) {
	c.mu.Lock()
	skip := id == "" || c.term == 0 || c.jobs[id] != nil
	c.mu.Unlock()
	if skip {
		return
	}
	ctx, cancel := c.kvCtx()
	defer cancel()
	e, err := c.kv.Get(ctx, jobKey(id))
	if err != nil {
		return
	}
	var r jobRecord
	if json.Unmarshal(e.Value(), &r) == nil && r.ID == id {
		c.lateRecord(r, e.Key(), e.Revision())
	}
}

// watchRecords hands every job record written after this leader read the
// table to lateRecord, until the controller stops.
func (c *Controller) watchRecords(w jetstream.KeyWatcher, cancel context.CancelFunc) {
	defer c.wg.Done()
	defer cancel()
	for {
		select {
		case <-c.done:
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var r jobRecord
			if err := json.Unmarshal(e.Value(), &r); err != nil || r.ID == "" {
				continue
			}
			c.lateRecord(r, e.Key(), e.Revision())
		}
	}
}

// lateRecord takes a job record that appeared after this leader read the
// table. One of a later term means another controller leads: this one
// stops. One of an earlier term, of a job this leader does not know, was
// written by the previous leader before it stopped (a deploy it answered,
// perhaps an attempt it assigned): the job is taken as if it had been in
// the table. Records of known jobs need nothing: this leader rewrote every
// job not ended, so an older leader's write of one fails.
func (c *Controller) lateRecord(r jobRecord, key string, rev uint64) {
	c.mu.Lock()
	term, known, stopped := c.term, c.jobs[r.ID] != nil || c.taking[r.ID], c.closed
	if !stopped && term != 0 && r.Term < term && !known {
		c.taking[r.ID] = true
	}
	c.mu.Unlock()
	switch {
	case stopped || term == 0 || r.Term == term:
		return
	case r.Term > term:
		c.depose(fmt.Errorf("cluster: controller %s: job %s was written in term %d, later than this one's %d", c.id, r.ID, r.Term, term))
		return
	case known:
		return
	}
	defer func() {
		c.mu.Lock()
		delete(c.taking, r.ID)
		c.mu.Unlock()
	}()
	now := time.Now()
	c.setRev(key, rev)
	c.log.Warn("job written by an earlier leader after the takeover; taking it", "job", r.ID, "term", r.Term, "state", r.State)
	j := c.takeRecord(r, term, now)
	c.mu.Lock()
	if j.dist != nil {
		c.adoptLocked(j, now)
	} else if !wire.TerminalJobState(j.state) {
		c.saveLocked(j)
	}
	effects := c.scheduleLocked(now)
	c.mu.Unlock()
	if j.dist != nil {
		c.log.Info("job adopted", "job", j.id, "attempt", j.attempt, "hosts", j.placement.Hosts(), "state", j.state)
		j.dist.adopt(j.attempt, *j.placement)
	}
	c.run(effects)
}

// adoptionLocked reports whether placing is held back: right after taking
// the lead, until the hosts of the adopted attempts reported.
func (c *Controller) adoptionLocked(now time.Time) bool {
	if c.adoptUntil.IsZero() {
		return false
	}
	if len(c.awaiting) == 0 || !now.Before(c.adoptUntil) {
		if len(c.awaiting) > 0 {
			hosts := make([]string, 0, len(c.awaiting))
			for h := range c.awaiting {
				hosts = append(hosts, h)
			}
			sort.Strings(hosts)
			c.log.Warn("hosts of adopted jobs have not reported; placing jobs anyway", "hosts", strings.Join(hosts, ","))
		}
		c.adoptUntil, c.awaiting = time.Time{}, map[string]bool{}
		return false
	}
	return true
}
