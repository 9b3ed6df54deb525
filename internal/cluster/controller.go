// Package cluster is streamd's controller: the job table, the host
// registry, slot scheduling (adaptive: a job runs on the slots there are),
// failover, upgrades, and the leader lease of a highly available
// controller. It talks to host agents (package agent) and answers clients
// (package client) only with the messages of package wire.
//
// # Threading and lock order
//
// The controller keeps all its state under one mutex (Controller.mu); NATS
// handlers take it, change the state and collect effects (assignments and
// cancels to send to hosts), and the effects run after the mutex is released,
// on goroutines tracked by the controller's wait group. Each deployed job
// has one goroutine, its loop (dist.go), which never takes Controller.mu.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// ControllerOptions configures a controller.
type ControllerOptions struct {
	Logger *slog.Logger
	// MeterProvider gets the controller's gauges (hosts, slots, jobs); nil:
	// the global provider (a no-op unless metrics are on).
	MeterProvider metric.MeterProvider
	// HeartbeatInterval is the interval the controller expects when a host
	// does not say its own; default 1s.
	HeartbeatInterval time.Duration
	// LostAfter is how many heartbeat intervals a host may miss before it is
	// declared lost; default 3.
	LostAfter int
	// MaxFailovers bounds the restarts of one job caused by lost hosts (task
	// failures follow the job's restart strategy); default 10.
	MaxFailovers int
	// RequestTimeout bounds requests to hosts; default 10s.
	RequestTimeout time.Duration
	// UnreportedAfter is how many consecutive heartbeats of a host may omit
	// an attempt that the controller believes runs there, and whose end the
	// host never reported, before the controller asks the host how it ended
	// (its final report was lost); the attempt must have been assigned at
	// least that many heartbeat intervals ago. Default 3.
	UnreportedAfter int
	// CheckpointStorage is the checkpoint storage of deployed jobs whose
	// job file does not choose one (checkpoint.storage): "" or
	// jobfile.StorageDir for their checkpoint directory,
	// jobfile.StorageJetStream for the JetStream object store.
	CheckpointStorage string
	// ID names the controller in its lease; letters, digits, '-' and '_'.
	// Default: the hostname and a random suffix.
	ID string
	// Bucket is the JetStream key-value bucket of the job table and the
	// leader lease; default DefaultControllerBucket.
	Bucket string
	// Replicas of the bucket when it is created: 0 (default) follows the
	// NATS cluster (its servers, at most 5; 1 without a cluster).
	Replicas int
	// JobRetention is how long a finished, failed or canceled job stays in
	// the list (ListRequest without All); default DefaultJobRetention. The
	// record stays until `streamd delete`.
	JobRetention time.Duration
	// Logs, when set, gets the controller's events about each job (its
	// log lines with a job: deploys, failovers and their cause, restarts,
	// upgrades and rollbacks, stops and their savepoints, ends), published
	// on the job's log subject beside the hosts' lines (streamd logs).
	Logs *wire.LogPublisher
	// SlotWait is the adaptive scheduler's resource stabilization (as Flink's
	// jobmanager.adaptive-scheduler.resource-stabilization-timeout): how
	// long at least a job's min_parallelism of slots must be free, when
	// fewer than it declares are, before it runs on them; and how long more
	// slots must stay free before a job that runs below its declared
	// parallelism scales up (adaptive.go). Default DefaultSlotWait.
	SlotWait time.Duration
	// RescaleInterval is the least time between a job's rescales before it
	// scales up again (Flink's
	// jobmanager.adaptive-scheduler.scaling-interval.min); default
	// DefaultRescaleInterval.
	RescaleInterval time.Duration
	// Version is the build's version: the control API's micro service
	// version (service.go) when it is a semantic version (a leading "v"
	// dropped), else 0.0.0-dev; its "build" metadata as given.
	Version string
}

// Defaults of ControllerOptions.
const (
	DefaultLostAfter       = 3
	DefaultMaxFailovers    = 10
	DefaultUnreportedAfter = 3
	DefaultJobRetention    = 24 * time.Hour
)

// Controller keeps the job table and the host registry, schedules jobs onto
// host slots and fails jobs over when a host is lost. Start it with
// StartController; stop it with Close.
type Controller struct {
	nc      *nats.Conn
	opts    ControllerOptions
	log     *slog.Logger
	metrics metric.Registration // the gauges' callback; nil: none

	mu    sync.Mutex // guards everything below
	jobs  map[string]*ctlJob
	order []string // job ids in deploy order
	hosts map[string]*ctlHost

	subs   []*nats.Subscription
	svc    micro.Service  // the control API (service.go), while leading
	wg     sync.WaitGroup // effects and the ticker
	done   chan struct{}
	closed bool

	// Leadership and the bucket (ha.go).
	id         string
	kv         jetstream.KeyValue
	term       uint64 // the term this controller leads; 0: it stands by
	deposedErr error
	ended      chan struct{}  // closed once stopped
	lwg        sync.WaitGroup // the lease and persist loops
	// Of the lease loop only. leaseTerm is the term of the lease it holds
	// (0: none), set before lead runs and makes it the acting term.
	seenRev, leaseRev, leaseTerm uint64
	seenAt, renewed              time.Time
	firstTry                     chan struct{} // closed once the first try for the lease (and lead) is done
	firstOnce                    sync.Once
	// The job records to write (persistLoop), per job the version durable,
	// closed and replaced whenever a record was written; revs (under
	// revMu) is each key's revision.
	queue    map[string]queuedRecord
	durable  map[string]uint64
	savedCh  chan struct{}
	saveWake chan struct{}
	revMu    sync.Mutex
	revs     map[string]uint64
	taking   map[string]bool // jobs lateRecord is taking
	// Right after taking the lead: no placing until the hosts of adopted
	// attempts (awaiting) reported, or adoptUntil.
	adoptUntil time.Time
	awaiting   map[string]bool
}

type ctlHost struct {
	id       string
	slots    int
	interval time.Duration
	lastSeen time.Time
	lost     bool
	// busy are the attempts that hold slots here as far as the controller
	// has seen: from their assignment until the host reported their end,
	// answered their cancel, refused them, stopped listing them in its
	// heartbeats, or was declared lost. Only the other slots are free.
	busy map[wire.AttemptRef]*slotUse
	// ended are attempts whose end this host confirmed (end report,
	// cancel answered, assignment refused), when: a heartbeat sent before
	// that and read after it does not take their slots again.
	ended map[wire.AttemptRef]time.Time
}

// slotUse is one attempt's hold on a host's slots.
type slotUse struct {
	slots int
	// settled is when the assignment request was answered or failed
	// (zero: in flight); only heartbeats at least one interval later count
	// in unlisted, so a heartbeat that overtook the assignment does not.
	settled  time.Time
	unlisted int // such heartbeats in a row that did not list the attempt
}

// unlistedRelease is how many heartbeats in a row must omit an attempt
// before its slots on that host are free.
const unlistedRelease = 2

type ctlJob struct {
	id        string
	requestID string // of the deploy that made it (DeployRequest.RequestID)
	spec      wire.JobSpec
	state     string
	reason    string
	attempt   int
	slots     int

	placement    *control.Placement // nil: not placed
	lastPlaced   *control.Placement // the placement of the latest attempt, kept after it ends for status
	subtaskState string             // of every subtask of the current attempt
	stats        []runtime.OperatorStats
	checkpoints  []runtime.CheckpointStats // the latest completed ones, from the host (a job on one host)
	elapsed      string

	created, updated time.Time
	ended            *time.Time
	restartAt        time.Time // restarting: not before
	awaitingRestart  bool      // restarting after a task failure: the job's lifecycle says when
	restartReady     bool      // the lifecycle restarted the job before failLocked heard of the failure
	failovers        int       // lost-host restarts
	savepoint        string    // of a stopped job
	from             string    // the checkpoint or savepoint the job was deployed from (deploy --from)
	canceling        bool      // a cancel request waits for the hosts; the placement holds its slots until then
	deleting         bool      // a delete request removes its checkpoints
	upgrading        bool      // an upgrade request stops and starts it (upgrade.go)
	preparing        bool      // the controller side of a job spread over hosts is being set up (newDistJob, outside the mutex)
	attempts         []wire.AttemptStatus
	placed           map[int]control.Placement // the placement of each attempt (slot counts of the slots they hold)
	// versions is the job's version history, from its first upgrade on;
	// upgrade the upgrade waiting for its version to run (upgrade.go).
	versions []wire.VersionStatus
	upgrade  *upgradeState

	// changed is closed (and replaced) whenever the job's state or attempt
	// changes: stop and savepoint requests wait on it.
	changed chan struct{}

	// Kept in the job's record (ha.go): ver is the version last queued;
	// latest the latest completed checkpoint or savepoint, restarts the
	// restart strategy's state, as the job's loop last published them.
	ver      uint64
	resumed  bool // loaded from the bucket: an earlier term ran it
	latest   *control.RestorePoint
	restarts *control.RestartState

	// dist is the controller's side of the job, set before its first
	// attempt is placed: the controller drives every deployed job's
	// checkpoints (dist.go), on one host or spread over several.
	dist      *distJob
	hostStats map[string][]runtime.OperatorStats // per host, of the current attempt

	// Of the current attempt, to notice a host's lost final report
	// (checkUnreportedLocked): when it was assigned, the hosts whose end
	// report arrived, per host the consecutive heartbeats that did not list
	// it, and the hosts being asked for its outcome.
	assignedAt time.Time
	endedOn    map[string]bool
	unlisted   map[string]int
	asking     map[string]bool

	// Adaptive scheduling (adaptive.go). declared is each operator's
	// declared parallelism while spec runs at another (nil: as declared);
	// slotWait since when fewer slots than it runs on (but its minimum)
	// are free while it waits to be placed; moreSince since when more are
	// free while it runs below its declared parallelism; rescaledAt when it
	// was last rescaled; rescale the scale-up in progress; rescales the
	// latest rescales; rescaleCtx and rescaleSpan the latest rescale's
	// trace until its controller side takes it; carryRestarts: the next
	// controller side carries the restart strategy's state over (a
	// rescale); noRescale why the job runs only as declared (its state does
	// not restore at another parallelism).
	declared      map[string]int
	slotWait      time.Time
	moreSince     time.Time
	rescaledAt    time.Time
	rescale       *rescaleUp
	rescales      []wire.RescaleStatus
	rescaleCtx    context.Context
	rescaleSpan   trace.Span
	carryRestarts bool
	noRescale     string
}

// StartController starts a controller on nc: it opens (or creates) the
// controller's bucket and takes the lease if nobody holds it, so it leads
// on return; else it stands by and takes over once the leader's lease
// lapses (ha.go). A leader subscribes to the control API and the host
// subjects. The controller ends with Close, or when it is deposed (Done).
func StartController(nc *nats.Conn, opts ControllerOptions) (*Controller, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = wire.DefaultHeartbeatInterval
	}
	if opts.LostAfter <= 0 {
		opts.LostAfter = DefaultLostAfter
	}
	if opts.MaxFailovers <= 0 {
		opts.MaxFailovers = DefaultMaxFailovers
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = wire.DefaultRequestTimeout
	}
	if opts.UnreportedAfter <= 0 {
		opts.UnreportedAfter = DefaultUnreportedAfter
	}
	if opts.JobRetention <= 0 {
		opts.JobRetention = DefaultJobRetention
	}
	if opts.SlotWait <= 0 {
		opts.SlotWait = DefaultSlotWait
	}
	if opts.RescaleInterval <= 0 {
		opts.RescaleInterval = DefaultRescaleInterval
	}
	if opts.Bucket == "" {
		opts.Bucket = DefaultControllerBucket
	}
	if opts.ID == "" {
		opts.ID = newControllerID()
	}
	switch {
	case !wire.HostIDRE.MatchString(opts.ID):
		return nil, fmt.Errorf("cluster: controller id %q: may contain only letters, digits, '-' and '_'", opts.ID)
	case !plainKeyRE.MatchString(opts.Bucket):
		return nil, fmt.Errorf("cluster: controller bucket %q: may contain only letters, digits, '-' and '_'", opts.Bucket)
	case opts.Replicas < 0 || opts.Replicas > maxReplicas:
		return nil, fmt.Errorf("cluster: controller bucket replicas %d: want 0 (follow the NATS cluster) to %d", opts.Replicas, maxReplicas)
	}
	switch opts.CheckpointStorage {
	case "", jobfile.StorageDir, jobfile.StorageJetStream:
	default:
		return nil, fmt.Errorf("cluster: controller: checkpoint storage %q: want dir or jetstream", opts.CheckpointStorage)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wire.DefaultRetry.Total)
	defer cancel()
	kv, replicas, err := openControllerBucket(ctx, nc, opts.Bucket, opts.Replicas)
	if err != nil {
		return nil, err
	}
	logger := opts.Logger
	if opts.Logs != nil {
		logger = slog.New(&jobEventHandler{inner: logger.Handler(), pub: opts.Logs})
	}
	c := &Controller{nc: nc, opts: opts, id: opts.ID, kv: kv, log: logger.With("component", "controller", "controller", opts.ID),
		jobs: map[string]*ctlJob{}, hosts: map[string]*ctlHost{}, done: make(chan struct{}), ended: make(chan struct{}),
		queue: map[string]queuedRecord{}, durable: map[string]uint64{}, revs: map[string]uint64{}, taking: map[string]bool{}, awaiting: map[string]bool{},
		savedCh: make(chan struct{}), saveWake: make(chan struct{}, 1), firstTry: make(chan struct{})}
	reg, err := c.registerMetrics(opts.MeterProvider)
	if err != nil {
		return nil, err
	}
	c.metrics = reg
	c.lwg.Add(2)
	go c.persistLoop()
	go c.leaseLoop()
	<-c.firstTry
	renew, expiry, _ := c.leaseTiming()
	_, term := c.Leader()
	c.log.Info("controller started", "nats", nc.ConnectedUrlRedacted(), "heartbeat_interval", opts.HeartbeatInterval, "lost_after", opts.LostAfter,
		"bucket", opts.Bucket, "replicas", replicas, "lease_renewal", renew, "lease_expiry", expiry, "term", term, "leads", term != 0)
	return c, nil
}

// subscribe subscribes the leader of term to the host subjects and starts
// the control API service (service.go).
func (c *Controller) subscribe(term uint64) error {
	handlers := map[string]nats.MsgHandler{
		wire.SubjectHeartbeat:  c.handleHeartbeat,
		wire.SubjectHostEvents: c.handleHostEvent,
		wire.SubjectLeader:     c.handleLeader,
	}
	subjects := make([]string, 0, len(handlers))
	for s := range handlers {
		subjects = append(subjects, s)
	}
	sort.Strings(subjects)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range subjects {
		sub, err := c.nc.Subscribe(s, handlers[s])
		if err != nil {
			return fmt.Errorf("cluster: controller: subscribe %s: %w", s, err)
		}
		c.subs = append(c.subs, sub)
	}
	svc, err := c.startService(term)
	if err != nil {
		return err
	}
	c.svc = svc
	if err := c.nc.Flush(); err != nil {
		return fmt.Errorf("cluster: controller: %w", err)
	}
	return nil
}

func (c *Controller) unsubscribe() {
	c.mu.Lock()
	subs, svc := c.subs, c.svc
	c.subs, c.svc = nil, nil
	c.mu.Unlock()
	if svc != nil {
		_ = svc.Stop()
	}
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

// Close stops the controller: it unsubscribes, gives its lease up (a
// standby takes over at once) and waits for its goroutines. Jobs keep
// running on their hosts; the next leader adopts them.
func (c *Controller) Close() { c.shutdown(true) }

// shutdown stops the controller; release: give the lease up (not when
// deposed: it is someone else's).
func (c *Controller) shutdown(release bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.ended
		return
	}
	c.closed = true
	leading := c.term != 0
	close(c.done)
	close(c.savedCh)
	c.savedCh = make(chan struct{})
	var dists []*distJob
	for _, j := range c.jobs {
		if j.dist != nil {
			dists = append(dists, j.dist)
		}
	}
	c.mu.Unlock()
	c.unsubscribe()
	for _, dj := range dists {
		dj.halt()
	}
	c.lwg.Wait()
	if release && leading {
		c.resign(true)
	}
	c.wg.Wait()
	if c.metrics != nil {
		_ = c.metrics.Unregister()
	}
	close(c.ended)
}

func (c *Controller) ticker() {
	defer c.wg.Done()
	t := time.NewTicker(max(c.opts.HeartbeatInterval/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case now := <-t.C:
			c.mu.Lock()
			effects := c.tickLocked(now)
			c.mu.Unlock()
			c.run(effects)
		}
	}
}

// effect is IO to do after the mutex is released.
type effect func()

func (c *Controller) run(effects []effect) {
	c.mu.Lock()
	stopped := c.closed || c.deposedErr != nil
	c.mu.Unlock()
	if stopped {
		return // a controller that stopped (deposed) acts no more
	}
	for _, e := range effects {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			e()
		}()
	}
}

// tickLocked declares silent hosts lost, fails their jobs over and schedules
// waiting jobs.
func (c *Controller) tickLocked(now time.Time) []effect {
	var effects []effect
	for _, id := range c.hostIDs() {
		h := c.hosts[id]
		if h.lost || now.Sub(h.lastSeen) <= time.Duration(c.opts.LostAfter)*h.interval {
			continue
		}
		h.lost = true
		c.log.Warn("host lost", "host", id, "last_seen", h.lastSeen, "missed_heartbeats", c.opts.LostAfter)
		// Its slots are no longer counted; should it come back still
		// running an attempt, its heartbeat takes them again.
		for ref := range h.busy {
			c.releaseLocked(id, ref, false, now, "host lost")
		}
		for _, jid := range c.order {
			j := c.jobs[jid]
			if j.placement == nil || wire.TerminalJobState(j.state) || j.canceling || !contains(j.placement.Slots, id) {
				continue
			}
			reason := fmt.Sprintf("host %s lost (no heartbeat for %s)", id, now.Sub(h.lastSeen).Round(time.Millisecond))
			effects = append(effects, c.failLocked(j, now, failure{reason: reason, kind: failInfra, host: id, skip: true})...)
		}
	}
	effects = append(effects, c.upgradeTimeoutsLocked(now)...)
	effects = append(effects, c.scaleUpLocked(now)...)
	return append(effects, c.scheduleLocked(now)...)
}

func (c *Controller) hostIDs() []string {
	ids := make([]string, 0, len(c.hosts))
	for id := range c.hosts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// freeSlotsLocked is each alive host's capacity and free slots: those no
// attempt holds (ctlHost.busy), so a slot of a failed or canceled attempt is
// free only once the controller has seen it freed.
func (c *Controller) freeSlotsLocked() []control.HostSlots {
	var out []control.HostSlots
	for _, id := range c.hostIDs() {
		h := c.hosts[id]
		if !h.lost {
			used := 0
			for _, u := range h.busy {
				used += u.slots
			}
			out = append(out, control.HostSlots{ID: id, Capacity: h.slots, Free: h.slots - used})
		}
	}
	return out
}

// holdLocked records that the current attempt of j holds its slots of p.
func (c *Controller) holdLocked(j *ctlJob, p control.Placement) {
	ref := wire.AttemptRef{JobID: j.id, Attempt: j.attempt}
	for _, id := range p.Slots {
		h := c.hosts[id]
		if h == nil {
			continue
		}
		u := h.busy[ref]
		if u == nil {
			u = &slotUse{}
			h.busy[ref] = u
		}
		u.slots++
	}
}

// releaseLocked frees the slots attempt ref holds on host id; ended: the
// host confirmed the attempt's end there. It reports whether slots were
// freed (then scheduleLocked may place waiting jobs).
func (c *Controller) releaseLocked(id string, ref wire.AttemptRef, ended bool, now time.Time, why string) bool {
	h := c.hosts[id]
	if h == nil {
		return false
	}
	if ended {
		h.ended[ref] = now
		for r, t := range h.ended {
			if now.Sub(t) > time.Minute {
				delete(h.ended, r)
			}
		}
	}
	u := h.busy[ref]
	if u == nil {
		return false
	}
	delete(h.busy, ref)
	c.log.Debug("slots freed", "host", id, "job", ref.JobID, "attempt", ref.Attempt, "slots", u.slots, "why", why)
	return true
}

// settleLocked notes that the assignment of ref to host id was answered
// (or failed without an answer).
func (c *Controller) settleLocked(id string, ref wire.AttemptRef, now time.Time) {
	if h := c.hosts[id]; h != nil {
		if u := h.busy[ref]; u != nil && u.settled.IsZero() {
			u.settled = now
		}
	}
}

// slotsFreed releases ref's slots on host id after the host confirmed its
// end outside an event (a cancel it answered), and places waiting jobs.
func (c *Controller) slotsFreed(id string, ref wire.AttemptRef, why string) {
	now := time.Now()
	c.mu.Lock()
	var effects []effect
	if c.releaseLocked(id, ref, true, now, why) {
		effects = c.scheduleLocked(now)
	}
	c.mu.Unlock()
	c.run(effects)
}

// changedLocked wakes the requests waiting on a change of j.
// The job's record is saved with every such change.
func (c *Controller) changedLocked(j *ctlJob) {
	close(j.changed)
	j.changed = make(chan struct{})
	c.saveLocked(j)
}

// scheduleLocked places waiting jobs, oldest first, and returns the
// assignments to send.
func (c *Controller) scheduleLocked(now time.Time) []effect {
	if c.term == 0 || c.closed || c.adoptionLocked(now) {
		return nil
	}
	var effects []effect
	for _, jid := range c.order {
		j := c.jobs[jid]
		if j.placement != nil || j.canceling || j.preparing || (j.state != wire.JobCreated && j.state != wire.JobRestarting) || now.Before(j.restartAt) {
			continue
		}
		free := c.freeSlotsLocked()
		rescaled, why := c.adaptLocked(j, now, free)
		if rescaled {
			free = c.freeSlotsLocked()
		}
		p, err := control.Schedule(free, j.slots, false)
		switch {
		case err != nil:
			reason := fmt.Sprintf("waiting for slots: %v", err)
			if why != "" {
				reason += "; " + why
			}
			if j.reason != reason {
				if !strings.HasPrefix(j.reason, "waiting for slots") {
					c.log.Info("job waits for slots", "job", j.id, "reason", reason)
				}
				j.reason, j.updated = reason, now
			}
			continue
		}
		if j.dist == nil {
			// Its controller side opens the checkpoint store (IO): set up
			// outside the mutex, then the job is scheduled again.
			j.preparing = true
			effects = append(effects, c.prepareDist(j))
			continue
		}
		j.placement = &p
		j.lastPlaced = &p
		j.slotWait = time.Time{}
		c.holdLocked(j, p)
		j.placed[j.attempt] = p
		j.hostStats = map[string][]runtime.OperatorStats{}
		j.assignedAt, j.endedOn, j.unlisted, j.asking = now, map[string]bool{}, map[string]int{}, map[string]bool{}
		j.subtaskState = wire.SubtaskDeploying
		j.reason = ""
		j.updated = now
		j.attempts = append(j.attempts, wire.AttemptStatus{Attempt: j.attempt, Hosts: p.Hosts(), State: wire.SubtaskDeploying, Parallelism: j.slots})
		c.log.Info("job scheduled", "job", j.id, "attempt", j.attempt, "hosts", p.Hosts(), "slots", j.slots)
		effects = append(effects, c.assignEffects(j, c.saveLocked(j))...)
	}
	return effects
}

// prepareDist returns the effect that sets up the controller side of job j,
// which the scheduler found must be spread over hosts (j.preparing is set).
func (c *Controller) prepareDist(j *ctlJob) effect {
	id, spec, from, attempt, resumed, takeover := j.id, j.spec, j.restoreFrom(), j.attempt, j.resumed, j.rescaleTakeover()
	scaled := takeover != nil && j.declared != nil
	return func() {
		var dj *distJob
		err := c.checkRescaled(j, spec, from, scaled)
		if err == nil {
			dj, err = c.newDistJob(id, spec, from, attempt, resumed, takeover)
		}
		now := time.Now()
		c.mu.Lock()
		j.preparing = false
		var effects []effect
		var notFit *rescaleMisfit
		switch {
		case wire.TerminalJobState(j.state) || j.canceling:
			if dj != nil {
				dj.close(control.Cancel{})
			}
		case errors.As(err, &notFit):
			// Its state does not restore at this parallelism: it runs
			// only as declared from now on, waiting for the slots.
			j.noRescale = notFit.Error()
			c.log.Warn("the job runs only at its declared parallelism", "job", j.id, "err", notFit.err)
			j.scaleLocked(j.declaredSlots())
			if j.rescaleSpan != nil {
				telemetry.EndSpan(j.rescaleSpan, notFit)
				j.rescaleCtx, j.rescaleSpan = nil, nil
			}
		case err != nil:
			c.endLocked(j, now, wire.JobFailed, err.Error())
		default:
			j.dist = dj
			j.carryRestarts = false
			j.rescaleTrace(dj)
		}
		effects = c.scheduleLocked(now)
		c.mu.Unlock()
		c.run(effects)
	}
}

// assignEffects sends the current attempt of j to each of its hosts. The
// job's loop records the attempt first (dist.deploy: after any failover
// queued before it, so the restore is the latest checkpoint the failed
// attempt completed) and waits until version ver of the job's record, which
// has the attempt and its placement, is in the bucket (a later leader never
// reuses the attempt number); then the assignments go out.
func (c *Controller) assignEffects(j *ctlJob, ver uint64) []effect {
	p := *j.placement
	dj, id, attempt, spec, term := j.dist, j.id, j.attempt, j.spec, c.term
	locals := map[string][]wire.SubtaskRef{}
	for _, v := range spec.Vertices {
		for i := 0; i < v.Parallelism; i++ {
			locals[p.Host(i)] = append(locals[p.Host(i)], wire.SubtaskRef{Operator: v.UID, Subtask: i})
		}
	}
	dj.post(func() {
		restore := dj.deploy(attempt, p)
		if err := c.saved(id, ver); err != nil {
			dj.log.Warn("attempt not assigned", "attempt", attempt, "err", err)
			return
		}
		tr := dj.attemptTrace()
		var effects []effect
		for _, h := range p.Hosts() {
			a := wire.Assignment{JobID: id, Attempt: attempt, Term: term, Job: spec, Placement: p.Slots, Distributed: true, Restore: restore, Trace: tr, Local: locals[h]}
			effects = append(effects, func() {
				var r wire.AssignReply
				err := wire.RequestTimeout(c.nc, wire.HostSubject(h, wire.HostVerbAssign), c.opts.RequestTimeout, a, &r)
				c.assigned(a, h, r, err)
			})
		}
		c.run(effects)
	})
	return nil
}

// failKind says what ended an attempt.
type failKind int

const (
	failTask  failKind = iota // a subtask failed: the job's restart strategy decides
	failInfra                 // a host was lost, refused or never reported: counts against MaxFailovers
	failBusy                  // a host refused the assignment for busy slots, or nobody listened for it: rescheduled, counts against nothing
)

// failure is why an attempt ended.
type failure struct {
	reason string
	kind   failKind
	// host is where it failed, when known; skip: it is not sent a cancel
	// (it is lost, or its part already ended).
	host string
	skip bool
	// subtask is the subtask whose failure it is, when known.
	subtask *control.SubtaskID
	// class says what a restart can do about a task failure.
	class control.FailureClass
}

// failLocked handles the failure of j's current attempt: it is canceled on
// its hosts and a new attempt follows, or the job ends. After a task failure
// the job's lifecycle decides (its restart strategy: lifecycleRestart or
// lifecycleGaveUp); after a lost or refusing host the controller restarts
// it at once, up to MaxFailovers (not the job's failure).
func (c *Controller) failLocked(j *ctlJob, now time.Time, f failure) []effect {
	var effects []effect
	reason := f.reason
	infra := f.kind == failInfra
	if j.dist != nil && !(infra && j.failovers >= c.opts.MaxFailovers) {
		j.dist.failover(reason, f.host, f.subtask, f.kind != failTask, f.class)
	}
	if j.placement != nil {
		skip := ""
		if f.skip {
			skip = f.host
		}
		effects = c.cancelEffects(j, skip)
	}
	if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt {
		j.attempts[n-1].State, j.attempts[n-1].Reason = wire.SubtaskFailed, reason
	}
	j.placement = nil
	defer c.changedLocked(j)
	restart, delay, why := false, time.Duration(0), ""
	switch {
	case f.kind == failBusy:
		// Not the job's failure: the attempt goes to slots the controller
		// has seen freed, after a heartbeat interval (no tight loop while
		// a host's view and the controller's differ).
		restart, delay, j.awaitingRestart = true, c.opts.HeartbeatInterval, false
		if h := c.hosts[f.host]; h != nil && h.interval > 0 {
			delay = h.interval
		}
	case infra && j.failovers < c.opts.MaxFailovers:
		j.failovers++
		restart, j.awaitingRestart = true, false
	case !infra:
		// The job's lifecycle decides: it restarts the job when its
		// restart strategy's delay has passed (lifecycleRestart), or fails
		// it (lifecycleGaveUp).
		restart = true
		if j.restartReady {
			j.restartReady = false // it already did
		} else {
			delay, j.awaitingRestart = 100*365*24*time.Hour, true
		}
	}
	if !restart {
		if why == "" {
			why = "the restart strategy gives up"
		}
		if infra {
			why = fmt.Sprintf("%d failovers after lost or refusing hosts, the limit", j.failovers)
		}
		c.endLocked(j, now, wire.JobFailed, fmt.Sprintf("attempt %d failed: %s (%s)", j.attempt, reason, why))
		return effects
	}
	blamed := ""
	if f.subtask != nil {
		blamed = f.subtask.String()
	}
	c.log.Warn("attempt failed", "job", j.id, "failed_attempt", j.attempt, "reason", reason, "host", f.host, "subtask", blamed, "infrastructure", f.kind != failTask)
	j.attempt++
	j.state = wire.JobRestarting
	j.reason = fmt.Sprintf("attempt %d failed: %s", j.attempt-1, reason)
	j.subtaskState = wire.SubtaskScheduled
	j.restartAt = now.Add(delay)
	j.updated = now
	return effects
}

// cancelEffects tells j's hosts (but skip) to cancel the current attempt.
func (c *Controller) cancelEffects(j *ctlJob, skip string) []effect {
	var effects []effect
	for _, h := range j.placement.Hosts() {
		if h == skip {
			continue
		}
		req := wire.HostRequest{JobID: j.id, Attempt: j.attempt, Term: c.term}
		effects = append(effects, func() {
			var r wire.Reply
			err := wire.RequestTimeout(c.nc, wire.HostSubject(h, wire.HostVerbCancel), c.opts.RequestTimeout, req, &r)
			if err == nil {
				err = r.Err()
			}
			if err != nil {
				c.log.Warn("cancel on host failed", "job", req.JobID, "attempt", req.Attempt, "host", h, "err", err)
				return
			}
			// The host answers once the attempt stopped there.
			c.slotsFreed(h, wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}, "cancel answered")
		})
	}
	return effects
}

func (c *Controller) endLocked(j *ctlJob, now time.Time, state, reason string) {
	if j.dist != nil {
		var final control.Event
		switch state {
		case wire.JobCanceled:
			final = control.Cancel{}
		case wire.JobFailed:
			final = control.RestartsExhausted{Reason: reason}
		}
		j.dist.close(final)
	}
	j.state, j.reason, j.updated = state, reason, now
	t := now
	j.ended = &t
	j.placement = nil
	c.changedLocked(j)
	switch state {
	case wire.JobFinished, wire.JobStopped:
		j.subtaskState = wire.SubtaskFinished
	case wire.JobCanceled:
		j.subtaskState = wire.SubtaskCanceled
	case wire.JobFailed:
		if j.subtaskState != wire.SubtaskFinished {
			j.subtaskState = wire.SubtaskFailed
		}
	}
	if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt && !wire.TerminalJobState(j.attempts[n-1].State) && j.attempts[n-1].State != wire.SubtaskFailed {
		j.attempts[n-1].State = state
		if state != wire.JobFinished {
			j.attempts[n-1].Reason = reason
		}
	}
	lvl := slog.LevelInfo
	if state == wire.JobFailed {
		lvl = slog.LevelWarn
	}
	attrs := []any{"job", j.id, "attempt", j.attempt, "reason", reason}
	if j.savepoint != "" {
		attrs = append(attrs, "savepoint", j.savepoint)
	}
	c.log.Log(context.Background(), lvl, "job "+state, attrs...)
	c.upgradeEndedLocked(j, now, state, reason) // a failed new version is rolled back
}

// ---- control API handlers ----

func (c *Controller) handleDeploy(msg micro.Request) {
	var req wire.DeployRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: "cluster: deploy: bad request: " + err.Error(), Code: wire.CodeBadRequest}})
		return
	}
	if cs := req.Job.Checkpoint; cs != nil && cs.Storage == "" && c.opts.CheckpointStorage != "" {
		withStorage := *cs
		withStorage.Storage = c.opts.CheckpointStorage
		req.Job.Checkpoint = &withStorage
	}
	// Validate the graph (artifacts are not resolved here).
	if _, err := req.Job.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil }); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: err.Error()}})
		return
	}
	now := time.Now()
	if req.From != "" && req.Job.Checkpoint == nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: "cluster: deploy --from: the job has no checkpoint section"}})
		return
	}
	if err := req.Job.Restart.Control(time.Millisecond).Validate(); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: "cluster: deploy: " + err.Error()}})
		return
	}
	if req.From == "" {
		req.Job.PinNewStart(now) // a restart before the first checkpoint reads from the deploy on
	}
	j := &ctlJob{id: newJobID(req.Job.Name), requestID: req.RequestID, spec: req.Job, state: wire.JobCreated, slots: req.Job.SlotsNeeded(),
		subtaskState: wire.SubtaskScheduled, created: now, updated: now, from: req.From,
		placed: map[int]control.Placement{}, changed: make(chan struct{})}
	c.mu.Lock()
	if old := c.deployedLocked(req.RequestID); old != nil {
		// The same request again: its first try made old.
		oldVer := old.ver
		c.mu.Unlock()
		if err := c.saved(old.id, oldVer); err != nil {
			reply(msg, wire.DeployReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: deploy: job %s not saved: %v", old.id, err), Retry: true}})
			return
		}
		reply(msg, wire.DeployReply{JobID: old.id})
		return
	}
	for c.jobs[j.id] != nil {
		j.id = newJobID(req.Job.Name)
	}
	j.spec.OwnFiles(j.id)
	c.jobs[j.id] = j
	c.order = append(c.order, j.id)
	c.log.Info("job deployed", "job", j.id, "name", j.spec.Name, "slots", j.slots)
	ver := c.saveLocked(j)
	effects := c.scheduleLocked(now)
	c.mu.Unlock()
	c.run(effects)
	// The job is in the bucket before its id is given out.
	if err := c.saved(j.id, ver); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: deploy: job %s not saved: %v", j.id, err), Retry: true}})
		return
	}
	reply(msg, wire.DeployReply{JobID: j.id})
}

// deployedLocked is the job that deploy request id made, if any.
func (c *Controller) deployedLocked(id string) *ctlJob {
	if id == "" {
		return nil
	}
	for _, j := range c.jobs {
		if j.requestID == id {
			return j
		}
	}
	return nil
}

// newJobID is the job's name, with every byte but letters, digits, '-' and
// '_' replaced by '_' (the id names a directory and goes into NATS subjects
// and file names), then '-' and 8 random hex digits.
func newJobID(name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	safe := []byte(name)
	for i, c := range safe {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			safe[i] = '_'
		}
	}
	return string(safe) + "-" + hex.EncodeToString(b[:])
}

func (c *Controller) handleList(msg micro.Request) {
	var req wire.ListRequest
	if len(msg.Data()) > 0 {
		if err := json.Unmarshal(msg.Data(), &req); err != nil {
			reply(msg, wire.ListReply{Reply: wire.ErrorReply(fmt.Errorf("cluster: bad request: %w", err))})
			return
		}
	}
	now := time.Now()
	c.mu.Lock()
	var out wire.ListReply
	out.Jobs = []wire.JobStatus{}
	for i := len(c.order) - 1; i >= 0; i-- {
		j := c.jobs[c.order[i]]
		if !req.All && c.retiredLocked(j, now) {
			continue
		}
		out.Jobs = append(out.Jobs, c.statusLocked(j))
	}
	c.mu.Unlock()
	reply(msg, out)
}

// retiredLocked reports whether j finished, failed or was canceled longer
// ago than the job retention: the list leaves it out (not ListRequest.All).
// Stopped jobs stay: their record says where their savepoint is.
func (c *Controller) retiredLocked(j *ctlJob, now time.Time) bool {
	switch j.state {
	case wire.JobFinished, wire.JobFailed, wire.JobCanceled:
		return j.ended != nil && now.Sub(*j.ended) > c.opts.JobRetention
	}
	return false
}

// handleDelete removes the record of an ended job: from the table and from
// the bucket (a new leader does not bring it back), after its checkpoints
// when the request says so. A job that has not ended is refused.
func (c *Controller) handleDelete(msg micro.Request) {
	var req wire.DeleteRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(fmt.Errorf("cluster: bad request: %w", err))})
		return
	}
	c.catchUp(req.JobID)
	c.mu.Lock()
	j := c.jobs[req.JobID]
	switch {
	case j == nil:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(wire.NotFoundf("cluster: no job %q (streamd list --all shows the jobs)", req.JobID))})
		return
	case !wire.TerminalJobState(j.state) || j.canceling:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(wire.Conflictf("cluster: job %s is %s: cancel it first (streamd cancel %s)", j.id, j.state, j.id))})
		return
	case j.deleting:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: job %s is being deleted", j.id)}})
		return
	case j.upgrading:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: job %s is being upgraded", j.id)}})
		return
	}
	j.deleting = true
	st := c.statusLocked(j)
	cs := j.spec.Checkpoint
	c.mu.Unlock()
	if req.Checkpoints && cs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.RequestTimeout)
		err := wire.DeleteStore(ctx, c.nc, cs, j.id)
		cancel()
		if err != nil {
			c.mu.Lock()
			j.deleting = false
			c.mu.Unlock()
			reply(msg, wire.JobReply{Reply: wire.ErrorReply(err)})
			return
		}
	}
	c.mu.Lock()
	ver := c.forgetLocked(j)
	c.mu.Unlock()
	if err := c.saved(j.id, ver); err != nil {
		reply(msg, wire.JobReply{Reply: wire.Reply{Error: err.Error(), Retry: true}})
		return
	}
	c.log.Info("job deleted", "job", j.id, "checkpoints", req.Checkpoints && cs != nil)
	reply(msg, wire.JobReply{Job: &st})
}

func (c *Controller) lookup(msg micro.Request) (*ctlJob, wire.JobRequest, error) {
	var req wire.JobRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		return nil, req, wire.BadRequestf("cluster: bad request: %v", err)
	}
	j := c.jobs[req.JobID]
	if j == nil {
		return nil, req, wire.NotFoundf("cluster: no job %q (streamd list shows the jobs)", req.JobID)
	}
	return j, req, nil
}

// catchUpRequest is catchUp of the job a JobRequest names.
func (c *Controller) catchUpRequest(msg micro.Request) {
	var req wire.JobRequest
	if json.Unmarshal(msg.Data(), &req) == nil {
		c.catchUp(req.JobID)
	}
}

func (c *Controller) handleStatus(msg micro.Request) {
	c.catchUpRequest(msg)
	c.mu.Lock()
	j, _, err := c.lookup(msg)
	var out wire.JobReply
	if err != nil {
		out.Reply = wire.ErrorReply(err)
	} else {
		st := c.statusLocked(j)
		out.Job = &st
	}
	c.mu.Unlock()
	reply(msg, out)
}

func (c *Controller) handleCancel(msg micro.Request) {
	c.catchUpRequest(msg)
	c.mu.Lock()
	j, _, err := c.lookup(msg)
	if err != nil {
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(err)})
		return
	}
	if wire.TerminalJobState(j.state) || j.canceling {
		st := c.statusLocked(j)
		c.mu.Unlock()
		what := "already " + j.state
		if j.canceling {
			what = "being canceled"
		}
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(wire.Conflictf("cluster: job %s is %s", j.id, what)), Job: &st})
		return
	}
	c.cancelAttemptAndWaitLocked(j) // before answering
	c.endLocked(j, time.Now(), wire.JobCanceled, "canceled by request")
	st := c.statusLocked(j)
	effects := c.scheduleLocked(time.Now()) // freed slots
	c.mu.Unlock()
	reply(msg, wire.JobReply{Job: &st})
	c.run(effects)
}

// cancelAttemptAndWaitLocked cancels j's attempt on its hosts, if it is
// placed, and waits until they stopped it, with c.mu released meanwhile (so
// j may have changed when it returns); j is marked canceling while it waits.
// Called and returns with c.mu held.
func (c *Controller) cancelAttemptAndWaitLocked(j *ctlJob) {
	var effects []effect
	if j.placement != nil {
		effects = c.cancelEffects(j, "")
	}
	j.canceling = true
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range effects {
		wg.Add(1)
		go func() { defer wg.Done(); e() }()
	}
	wg.Wait()
	c.mu.Lock()
	j.canceling = false
}

func (c *Controller) handleSavepoint(msg micro.Request) {
	var req wire.SavepointRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.SavepointReply{Reply: wire.Reply{Error: "cluster: savepoint: bad request: " + err.Error(), Code: wire.CodeBadRequest}})
		return
	}
	path, err := c.forwardSavepoint(req.JobID, wire.HostRequest{Dir: req.Dir}, wire.HostVerbSavepoint)
	reply(msg, wire.SavepointReply{Reply: wire.ErrorReply(err), Path: path})
}

func (c *Controller) handleStop(msg micro.Request) {
	var req wire.StopRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.SavepointReply{Reply: wire.Reply{Error: "cluster: stop: bad request: " + err.Error(), Code: wire.CodeBadRequest}})
		return
	}
	path, err := c.forwardSavepoint(req.JobID, wire.HostRequest{Dir: req.SavepointDir, Drain: req.Drain}, wire.HostVerbStop)
	reply(msg, wire.SavepointReply{Reply: wire.ErrorReply(err), Path: path})
}

// forwardSavepoint takes a savepoint of a running job, or stops it with
// one (distSavepoint): the controller drives every deployed job's
// checkpoints. A stop that fails leaves the job running or restarting,
// never stopping.
func (c *Controller) forwardSavepoint(jobID string, hr wire.HostRequest, verb string) (string, error) {
	c.mu.Lock()
	j := c.jobs[jobID]
	switch {
	case j == nil:
		c.mu.Unlock()
		return "", wire.NotFoundf("cluster: no job %q (streamd list shows the jobs)", jobID)
	case j.placement == nil || j.dist == nil || (j.state != wire.JobRunning && j.state != wire.JobFinishing):
		st := j.state
		c.mu.Unlock()
		return "", wire.Conflictf("cluster: %s job %s: the job is %s, not running", verb, jobID, st)
	}
	c.mu.Unlock()
	return c.distSavepoint(jobID, verb, hr.Dir, hr.Drain, false)
}

func (c *Controller) handleHosts(msg micro.Request) {
	c.mu.Lock()
	out := wire.HostsReply{Hosts: []wire.HostStatus{}}
	free := map[string]int{}
	for _, h := range c.freeSlotsLocked() {
		free[h.ID] = h.Free
	}
	for _, id := range c.hostIDs() {
		h := c.hosts[id]
		st := "alive"
		if h.lost {
			st = "lost"
		}
		out.Hosts = append(out.Hosts, wire.HostStatus{ID: id, Slots: h.slots, Free: free[id], State: st, LastSeen: h.lastSeen})
	}
	c.mu.Unlock()
	reply(msg, out)
}

// ---- host messages ----

// checkHeartbeat decodes a heartbeat and checks its values: a host id as
// StartHost allows, 1 to MaxSlots slots, an interval (default the
// controller's) from 1ms to 1h. Nothing out of range registers a host.
func (c *Controller) checkHeartbeat(data []byte) (wire.Heartbeat, time.Duration, error) {
	var hb wire.Heartbeat
	if err := json.Unmarshal(data, &hb); err != nil {
		return hb, 0, fmt.Errorf("not a heartbeat: %w", err)
	}
	if !wire.HostIDRE.MatchString(hb.HostID) {
		return hb, 0, fmt.Errorf("host id %q: want 1 to 128 letters, digits, '-' and '_'", hb.HostID)
	}
	if hb.Slots < 1 || hb.Slots > wire.MaxSlots {
		return hb, 0, fmt.Errorf("host %s: slots %d out of range [1, %d]", hb.HostID, hb.Slots, wire.MaxSlots)
	}
	interval := c.opts.HeartbeatInterval
	if hb.Interval != "" {
		d, err := time.ParseDuration(hb.Interval)
		if err != nil || d < time.Millisecond || d > time.Hour {
			return hb, 0, fmt.Errorf("host %s: heartbeat interval %q: want a duration from 1ms to 1h", hb.HostID, hb.Interval)
		}
		interval = d
	}
	return hb, interval, nil
}

// handleLeader hears the leader's announcements: a leader that hears of a
// later term than its own was taken over (it may not have noticed yet, its
// renewals held up by a NATS outage) and stops acting at once.
func (c *Controller) handleLeader(msg *nats.Msg) {
	var a wire.LeaderAnnounce
	if err := json.Unmarshal(msg.Data, &a); err != nil {
		return
	}
	c.mu.Lock()
	term := c.term
	c.mu.Unlock()
	if term != 0 && a.Term > term {
		c.depose(fmt.Errorf("cluster: controller %s: controller %s announced term %d, later than this one's %d", c.id, a.ID, a.Term, term))
	}
}

func (c *Controller) handleHeartbeat(msg *nats.Msg) {
	hb, interval, err := c.checkHeartbeat(msg.Data)
	if err != nil {
		c.log.Warn("heartbeat refused", "err", err)
		return
	}
	now := time.Now()
	c.mu.Lock()
	h := c.hosts[hb.HostID]
	wasLost := false
	switch {
	case h == nil:
		h = &ctlHost{id: hb.HostID, busy: map[wire.AttemptRef]*slotUse{}, ended: map[wire.AttemptRef]time.Time{}}
		c.hosts[hb.HostID] = h
		c.log.Info("host registered", "host", hb.HostID, "slots", hb.Slots)
	case h.lost:
		wasLost = true
		c.log.Info("host is back", "host", hb.HostID, "slots", hb.Slots)
	}
	h.slots, h.interval, h.lastSeen, h.lost = hb.Slots, interval, now, false
	delete(c.awaiting, hb.HostID)
	c.reconcileSlotsLocked(h, hb, wasLost, now)
	// A host that runs an attempt the controller no longer wants there (it
	// was lost and its jobs moved, or the job ended) is told to cancel it.
	var effects []effect
	for _, r := range hb.Running {
		j := c.jobs[r.JobID]
		if j != nil && j.attempt == r.Attempt && j.placement != nil && contains(j.placement.Slots, hb.HostID) && !wire.TerminalJobState(j.state) {
			continue
		}
		req := wire.HostRequest{JobID: r.JobID, Attempt: r.Attempt, Term: c.term}
		hostID := hb.HostID
		c.log.Info("host runs a stale attempt; canceling it", "host", hostID, "job", r.JobID, "attempt", r.Attempt)
		effects = append(effects, func() {
			var rep wire.Reply
			if err := wire.RequestTimeout(c.nc, wire.HostSubject(hostID, wire.HostVerbCancel), c.opts.RequestTimeout, req, &rep); err == nil && rep.Err() == nil {
				c.slotsFreed(hostID, wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}, "stale attempt canceled")
			}
		})
	}
	effects = append(effects, c.checkUnreportedLocked(hb, h, now)...)
	effects = append(effects, c.scheduleLocked(now)...)
	c.mu.Unlock()
	c.run(effects)
}

// reconcileSlotsLocked matches the slots the controller counts as held on h
// with the attempts h's heartbeat lists. An attempt it omits, whose
// assignment was answered at least one interval ago, frees its slots after
// unlistedRelease such heartbeats in a row (at once when h comes back after
// it was declared lost). An attempt it lists that holds no slots (h ran it
// while declared lost, or runs one of a job this controller does not know)
// takes them again, unless h confirmed its end already (a heartbeat sent
// before that).
func (c *Controller) reconcileSlotsLocked(h *ctlHost, hb wire.Heartbeat, wasLost bool, now time.Time) {
	listed := map[wire.AttemptRef]bool{}
	for _, r := range hb.Running {
		listed[r] = true
	}
	for ref, u := range h.busy {
		switch {
		case listed[ref]:
			u.unlisted = 0
		case u.settled.IsZero():
		case wasLost:
			c.releaseLocked(h.id, ref, false, now, "not listed by the host that came back")
		case now.Sub(u.settled) >= h.interval:
			if u.unlisted++; u.unlisted >= unlistedRelease {
				c.releaseLocked(h.id, ref, false, now, "no longer listed in the host's heartbeats")
			}
		}
	}
	for ref := range listed {
		if h.busy[ref] != nil {
			continue
		}
		if _, ended := h.ended[ref]; ended {
			continue
		}
		slots := h.slots // an unknown attempt: as if it took the whole host
		if j := c.jobs[ref.JobID]; j != nil {
			if p, ok := j.placed[ref.Attempt]; ok {
				slots = 0
				for _, id := range p.Slots {
					if id == h.id {
						slots++
					}
				}
			}
		}
		c.log.Info("host runs an attempt the controller counted no slots for; they are taken", "host", h.id, "job", ref.JobID, "attempt", ref.Attempt, "slots", slots)
		h.busy[ref] = &slotUse{slots: slots, settled: now}
	}
}

// checkUnreportedLocked notices attempts whose end a host never reported: the
// controller believes the attempt runs on host h (its placement has h, the job
// is not over, no end report of h arrived) but h's heartbeats stopped listing
// it (a host lists an attempt from the assignment until it reported its end).
// After opts.UnreportedAfter such heartbeats in a row, and only if the attempt
// was assigned at least that many of h's intervals ago (a heartbeat may
// overtake the assignment), the controller asks h for the outcome.
func (c *Controller) checkUnreportedLocked(hb wire.Heartbeat, h *ctlHost, now time.Time) []effect {
	listed := map[wire.AttemptRef]bool{}
	for _, r := range hb.Running {
		listed[r] = true
	}
	k := c.opts.UnreportedAfter
	var effects []effect
	for _, jid := range c.order {
		j := c.jobs[jid]
		if j.placement == nil || wire.TerminalJobState(j.state) || j.canceling || !contains(j.placement.Slots, h.id) ||
			j.endedOn[h.id] || j.asking[h.id] {
			continue
		}
		if listed[wire.AttemptRef{JobID: j.id, Attempt: j.attempt}] || now.Sub(j.assignedAt) < time.Duration(k)*h.interval {
			j.unlisted[h.id] = 0
			continue
		}
		j.unlisted[h.id]++
		if j.unlisted[h.id] < k {
			continue
		}
		j.asking[h.id] = true
		req, host := wire.HostRequest{JobID: j.id, Attempt: j.attempt, Term: c.term}, h.id
		c.log.Warn("host no longer runs an attempt whose end it did not report; asking for its outcome",
			"host", host, "job", j.id, "attempt", j.attempt, "heartbeats", j.unlisted[host])
		effects = append(effects, func() {
			var rep wire.OutcomeReply
			err := wire.RequestTimeout(c.nc, wire.HostSubject(host, wire.HostVerbOutcome), c.opts.RequestTimeout, req, &rep)
			if err == nil {
				err = rep.Err()
			}
			c.outcome(req, host, rep, err)
		})
	}
	return effects
}

// outcome applies a host's answer to an outcome request: its final report as
// if it had arrived, or, if the host does not know the attempt or did not
// answer, a failure of the attempt (failed over like a lost host).
func (c *Controller) outcome(req wire.HostRequest, host string, rep wire.OutcomeReply, err error) {
	now := time.Now()
	c.mu.Lock()
	var effects []effect
	defer func() {
		c.mu.Unlock()
		c.run(effects)
	}()
	ref := wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}
	if err == nil && !rep.Running && rep.Event == nil && c.releaseLocked(host, ref, true, now, "the host does not know the attempt") {
		effects = c.scheduleLocked(now)
	}
	j := c.jobs[req.JobID]
	if j == nil || j.attempt != req.Attempt || wire.TerminalJobState(j.state) || j.placement == nil || j.canceling || j.endedOn[host] {
		return
	}
	j.asking[host] = false
	j.unlisted[host] = 0
	switch {
	case err == nil && rep.Running:
		c.log.Info("host says the attempt still runs", "host", host, "job", req.JobID, "attempt", req.Attempt)
		return
	case err == nil && rep.Event != nil && rep.Event.JobID == req.JobID && rep.Event.Attempt == req.Attempt:
		ev := *rep.Event
		ev.HostID = host
		c.log.Warn("host's final report was lost; taking its outcome", "host", host, "job", req.JobID, "attempt", req.Attempt, "state", ev.State)
		effects = append(effects, func() { c.hostEvent(ev) })
		return
	}
	reason := fmt.Sprintf("host %s reported no end for attempt %d of job %s", host, req.Attempt, req.JobID)
	if err != nil {
		reason += fmt.Sprintf(" (outcome request: %v)", err)
	} else {
		reason += " (the host does not know its outcome)"
	}
	j.endedOn[host] = true
	effects = append(effects, c.failLocked(j, now, failure{reason: reason, kind: failInfra, host: host, skip: true})...)
	effects = append(effects, c.scheduleLocked(now)...)
}

func (c *Controller) handleHostEvent(msg *nats.Msg) {
	var ev wire.HostEvent
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		wire.Respond(msg, wire.Reply{Error: "cluster: bad host event: " + err.Error()})
		return
	}
	c.hostEvent(ev)
	wire.Respond(msg, wire.Reply{})
}

func (c *Controller) hostEvent(ev wire.HostEvent) {
	now := time.Now()
	c.mu.Lock()
	var effects []effect
	switch ev.State {
	case wire.SubtaskFinished, wire.SubtaskFailed, wire.SubtaskCanceled:
		// The attempt's slots on that host are free, whatever attempt it is.
		if c.releaseLocked(ev.HostID, wire.AttemptRef{JobID: ev.JobID, Attempt: ev.Attempt}, true, now, "end reported: "+ev.State) {
			effects = c.scheduleLocked(now)
		}
	}
	j := c.jobs[ev.JobID]
	if j == nil || j.attempt != ev.Attempt || wire.TerminalJobState(j.state) || j.placement == nil || j.canceling {
		c.mu.Unlock()
		c.log.Debug("stale host event ignored", "host", ev.HostID, "job", ev.JobID, "attempt", ev.Attempt, "state", ev.State)
		c.run(effects)
		return
	}
	if ev.Checkpoints != nil {
		j.checkpoints = ev.Checkpoints
	}
	if ev.Stats != nil {
		j.stats = ev.Stats
		if j.dist != nil {
			j.hostStats[ev.HostID] = ev.Stats
			j.stats = sumStats(j.hostStats)
		}
	}
	if ev.Elapsed != "" {
		j.elapsed = ev.Elapsed
	}
	switch ev.State {
	case wire.SubtaskFinished, wire.SubtaskFailed, wire.SubtaskCanceled:
		j.endedOn[ev.HostID] = true
	}
	switch ev.State {
	case wire.SubtaskDeploying:
		j.subtaskState = wire.SubtaskDeploying
	case wire.SubtaskRunning:
		j.subtaskState = wire.SubtaskRunning
		if j.dist != nil {
			j.dist.hostRunning(ev.HostID)
		}
		// A job spread over hosts with checkpoints runs once its coordinator
		// sees every subtask running (distRunning).
		if (j.state == wire.JobCreated || j.state == wire.JobRestarting) && !j.dist.ckpt {
			j.state, j.reason = wire.JobRunning, ""
			c.changedLocked(j)
			c.log.Info("job running", "job", j.id, "attempt", j.attempt, "host", ev.HostID)
		}
		c.setAttemptState(j, wire.SubtaskRunning, "")
	case wire.SubtaskFinished:
		j.dist.mu.Lock()
		j.dist.finished[ev.HostID] = true
		j.dist.mu.Unlock()
		j.updated = now
		c.mu.Unlock()
		c.run(effects)
		c.maybeEndDist(j.id)
		return
	case wire.SubtaskFailed, wire.SubtaskCanceled:
		f := failure{reason: "canceled on host " + ev.HostID, kind: failTask, host: ev.HostID, skip: true}
		if ev.Error != "" {
			// A subtask's error starts with "streamd: " (host.Error), said once by the CLI.
			f.reason = fmt.Sprintf("on host %s: %s", ev.HostID, strings.TrimPrefix(ev.Error, "streamd: "))
		}
		if len(ev.Subtasks) > 0 {
			f.subtask = &control.SubtaskID{Operator: ev.Subtasks[0].Operator, Index: ev.Subtasks[0].Subtask}
		}
		if ev.Class != "" {
			if cl, err := control.ParseFailureClass(ev.Class); err == nil {
				f.class = cl
			} else {
				c.log.Warn("host event with an unknown failure class: taken as restartable", "host", ev.HostID, "err", err)
			}
		}
		effects = append(effects, c.failLocked(j, now, f)...)
		effects = append(effects, c.scheduleLocked(now)...)
	}
	j.updated = now
	c.mu.Unlock()
	c.run(effects)
}

// assigned takes a host's answer to an assignment (or the request's error).
// Accepted: the host holds the slots until it reports the end. Refused for
// busy slots: the slots are not taken and the attempt is rescheduled, which
// does not count as a failure of the job. Refused otherwise, or no answer:
// the attempt fails over (an infrastructure failure: it counts against
// MaxFailovers, not against the job's restart strategy).
func (c *Controller) assigned(a wire.Assignment, h string, rep wire.AssignReply, err error) {
	now := time.Now()
	ref := wire.AttemptRef{JobID: a.JobID, Attempt: a.Attempt}
	if err == nil {
		err = rep.Err()
	}
	c.mu.Lock()
	var effects []effect
	defer func() {
		c.mu.Unlock()
		c.run(effects)
	}()
	c.settleLocked(h, ref, now)
	if err == nil {
		return
	}
	if rep.NewerTerm > c.term {
		// Not the host's fault: another controller leads now.
		effects = append(effects, func() {
			c.depose(fmt.Errorf("cluster: controller %s: host %s knows a later term %d", c.id, h, rep.NewerTerm))
		})
		return
	}
	f := failure{reason: fmt.Sprintf("assign to host %s: %v", h, err), kind: failInfra, host: h, skip: true}
	switch {
	case rep.Busy:
		f.kind, f.reason = failBusy, fmt.Sprintf("host %s refused the assignment: its slots are busy (%v); rescheduled", h, err)
		fallthrough
	case errors.Is(err, nats.ErrNoResponders):
		if !rep.Busy {
			// Nobody listens for the host (it reconnects to NATS, or is
			// gone, which its missed heartbeats will tell): not the job's
			// failure, tried again after a heartbeat interval.
			f.kind, f.reason = failBusy, fmt.Sprintf("host %s did not take the assignment (%v); rescheduled", h, err)
		}
		fallthrough
	case rep.Error != "":
		// The host does not run it.
		if c.releaseLocked(h, ref, true, now, "assignment refused") {
			effects = c.scheduleLocked(now)
		}
	default:
		f.skip = false // no answer: it may run there after all
	}
	j := c.jobs[a.JobID]
	if j == nil || j.attempt != a.Attempt || wire.TerminalJobState(j.state) || j.placement == nil || j.canceling {
		return
	}
	c.log.Warn("assignment refused", "job", a.JobID, "attempt", a.Attempt, "host", h, "busy", rep.Busy, "err", err)
	effects = append(effects, c.failLocked(j, now, f)...)
	effects = append(effects, c.scheduleLocked(now)...)
}

func (c *Controller) setAttemptState(j *ctlJob, state, reason string) {
	if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt {
		j.attempts[n-1].State, j.attempts[n-1].Reason = state, reason
	}
}

// statusLocked builds the JobStatus of j.
func (c *Controller) statusLocked(j *ctlJob) wire.JobStatus {
	_, declared, least := control.AdaptiveSlots(j.bounds(), 0)
	st := wire.JobStatus{ID: j.id, Name: j.spec.Name, State: j.state, Reason: j.reason, Attempt: j.attempt,
		Slots: j.slots, Parallelism: j.slots, DeclaredParallelism: declared, MinParallelism: least, Rescales: slices.Clone(j.rescales), Created: j.created, Updated: j.updated, Ended: j.ended, Elapsed: j.elapsed, Savepoint: j.savepoint,
		Attempts: append([]wire.AttemptStatus(nil), j.attempts...), Checkpoints: append([]runtime.CheckpointStats(nil), j.checkpoints...),
		Leader: c.id, Term: c.term, Versions: versionsLocked(j)}
	if j.dist != nil && j.dist.d != nil {
		st.Checkpoints = j.dist.d.Recent() // the controller drives its checkpoints
	}
	if cs := j.spec.Checkpoint; cs != nil {
		st.CheckpointMode = cs.ModeString()
	}
	if j.placement != nil {
		st.Hosts = j.placement.Hosts()
	} else if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt {
		st.Hosts = j.attempts[n-1].Hosts
	}
	stats := map[string]runtime.OperatorStats{}
	for _, s := range j.stats {
		stats[s.UID] = s
	}
	for _, v := range j.spec.Vertices {
		op := wire.OperatorStatus{UID: v.UID, Parallelism: v.Parallelism, DeclaredParallelism: j.declaredOf(v), RecordsIn: stats[v.UID].RecordsIn, RecordsOut: stats[v.UID].RecordsOut,
			UnionDeclines: stats[v.UID].UnionDeclines, Kind: string(v.Kind), Inputs: wire.EdgeStatuses(v.Inputs)}
		if v.Source != nil {
			op.Connector = connector.Describe(v.Source)
		} else if v.Sink != nil {
			op.Connector = connector.Describe(v.Sink)
		}
		if j.dist != nil && j.dist.d != nil {
			op.UnionDeclines = j.dist.d.UnionDeclines()[v.UID] // the controller drives its checkpoints
		}
		for i := 0; i < v.Parallelism; i++ {
			s := wire.SubtaskStatus{Index: i, State: j.subtaskState}
			if sub := stats[v.UID].Subtasks; i < len(sub) && sub[i] != "" && !wire.TerminalJobState(j.state) && j.placement != nil {
				// As the subtask's host reported it, while its attempt is
				// placed: between attempts (a lost host, a rescale) the
				// last attempt's states are stale.
				s.State = sub[i]
			} else if i < len(sub) && sub[i] == runtime.StateDeployedFinished {
				s.State = sub[i]
			}
			if sub := stats[v.UID].Subtasks; i < len(sub) && sub[i] != "" && i < len(stats[v.UID].Live) {
				live := stats[v.UID].Live[i] // as the subtask's host reported it last
				s.Live = &live
			}
			if j.placement != nil {
				s.Host = j.placement.Host(i)
			} else if wire.TerminalJobState(j.state) && j.lastPlaced != nil {
				s.Host = j.lastPlaced.Host(i) // where the subtask ran last
			} else if len(st.Hosts) == 1 {
				s.Host = st.Hosts[0]
			}
			op.Subtasks = append(op.Subtasks, s)
		}
		st.Operators = append(st.Operators, op)
	}
	return st
}

// sumStats adds up the operators' counters of every host.
func sumStats(byHost map[string][]runtime.OperatorStats) []runtime.OperatorStats {
	var out []runtime.OperatorStats
	idx := map[string]int{}
	hosts := make([]string, 0, len(byHost))
	for h := range byHost {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		for _, s := range byHost[h] {
			i, ok := idx[s.UID]
			if !ok {
				idx[s.UID] = len(out)
				out = append(out, runtime.OperatorStats{UID: s.UID, Parallelism: s.Parallelism})
				i = len(out) - 1
			}
			out[i].RecordsIn += s.RecordsIn
			out[i].RecordsOut += s.RecordsOut
			for k, state := range s.Subtasks { // each host knows the states of its own subtasks
				if state == "" {
					continue
				}
				if len(out[i].Subtasks) < len(s.Subtasks) {
					out[i].Subtasks = append(out[i].Subtasks, make([]string, len(s.Subtasks)-len(out[i].Subtasks))...)
				}
				out[i].Subtasks[k] = state
				if k < len(s.Live) {
					if len(out[i].Live) < len(s.Live) {
						out[i].Live = append(out[i].Live, make([]telemetry.SubtaskLive, len(s.Live)-len(out[i].Live))...)
					}
					out[i].Live[k] = s.Live[k]
				}
			}
		}
	}
	return out
}
