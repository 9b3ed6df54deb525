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
	"fmt"
	"log/slog"
	goruntime "runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/core"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
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
	// MaxFailovers bounds the restarts of one job caused by lost or
	// refusing hosts, which its restart strategy does not count: the job's
	// lifecycle restarts it at once that many times and fails it at the
	// next (control.LifecycleConfig.MaxLost); default 10.
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
	svc    *controlService // the control API (service.go), while leading
	wg     sync.WaitGroup  // effects and the ticker
	done   chan struct{}
	closed bool

	// Leadership and the bucket (ha.go).
	id         string
	kv         jetstream.KeyValue
	term       uint64 // the term this controller leads; 0: it stands by
	deposedErr error
	ended      chan struct{}  // closed once stopped
	lwg        sync.WaitGroup // the lease and persist loops
	// Of the lease loop only: the lease's machine; leaseTerm is the term of
	// the lease it holds (0: none), set before lead runs and makes it the
	// acting term; leaseRev its revision; leaseSent when the write of its
	// latest acquisition or renewal was sent.
	lease               *core.Lease
	leaseRev, leaseTerm uint64
	leaseSent           time.Time
	announced           atomic.Bool // lead announced its term: renewals announce it again
	// tickSince is when the tick running now began (UnixNano; 0: none
	// runs): watchStalls reports a tick that waits too long.
	tickSince atomic.Int64
	firstTry  chan struct{} // closed once the first try for the lease (and lead) is done
	firstOnce sync.Once
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
	// unconfirmed: named by the job table when this controller took the
	// lead (expectHostLocked), not heard from since.
	unconfirmed bool
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
	auto          *autoscaleJob // its autoscaler (autoscale.go); nil: none yet
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
	if c.lease, err = core.NewLease(c.leaseConfig()); err != nil {
		return nil, err
	}
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
	if c.closed || c.deposedErr != nil {
		// Deposed (or closed) while it took the lead: shutdown has
		// unsubscribed already, and would not see subscriptions made now.
		return fmt.Errorf("cluster: controller %s: stopped before it led in term %d", c.id, term)
	}
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
		svc.stop()
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
			c.tickSince.Store(time.Now().UnixNano())
			c.mu.Lock()
			effects := c.tickLocked(now)
			c.mu.Unlock()
			c.run(effects)
			c.tickSince.Store(0)
		}
	}
}

// stallReport is how long a tick may take before watchStalls logs every
// goroutine's stack. A tick takes the controller's mutex, which nothing
// should hold for long: a tick that waits seconds means every request and
// heartbeat waits too, and the stacks show on what.
var stallReport = 5 * time.Second

// watchStalls logs, once per stalled tick, a warning with the stacks of
// every goroutine when a tick has run for stallReport.
func (c *Controller) watchStalls() {
	defer c.wg.Done()
	t := time.NewTicker(max(stallReport/5, 10*time.Millisecond))
	defer t.Stop()
	var reported int64
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			since := c.tickSince.Load()
			if since == 0 || since == reported || time.Since(time.Unix(0, since)) < stallReport {
				continue
			}
			reported = since
			buf := make([]byte, 4<<20)
			buf = buf[:goruntime.Stack(buf, true)]
			c.log.Warn("controller stalled: a tick has waited for the controller's mutex (or its IO) since "+time.Unix(0, since).UTC().Format(time.RFC3339Nano),
				"waited", time.Since(time.Unix(0, since)).Round(time.Millisecond), "stacks", string(buf))
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
		c.goTracked(e)
	}
}

// goTracked runs f on a goroutine of the controller's wait group: Close
// waits for it. Call it from a goroutine the group tracks (an effect, a
// job's loop), or before Close.
func (c *Controller) goTracked(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
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
