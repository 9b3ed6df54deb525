package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
)

// TestLoop runs a core on its loop against a store and a host that answer
// from other goroutines, as the controller's IO does: it takes the lease,
// a deployed job is placed and assigned, its status is read on the loop,
// and the loop stops with its context.
func TestLoop(t *testing.T) {
	c, err := New(Config{ID: "c1", HeartbeatTimeout: 50, LeaseRenew: 5, LeaseSelf: 50, LeaseTTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		rev      uint64
		replies  = make(chan Reply, 1)
		assigned = make(chan Assign, 1)
	)
	var l *Loop
	answer := func(ev Event) { go l.Post(ev) }
	l = NewLoop(c, time.Millisecond, func(a Action) {
		mu.Lock()
		defer mu.Unlock()
		switch x := a.(type) {
		case AcquireLease:
			rev++
			answer(LeaseResult{Term: x.Term, OK: true, Rev: rev})
		case RenewLease:
			rev++
			answer(LeaseResult{Term: x.Term, OK: true, Rev: rev})
		case LoadTable:
			answer(TableLoaded{Term: x.Term})
		case Persist:
			rev++
			answer(StoreResult{Job: x.Record.Job, Ver: x.Ver, OK: true, Rev: rev})
		case Assign:
			answer(AssignResult{Ref: x.Ref, Host: x.Host})
			assigned <- x
		case Reply:
			replies <- x
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	l.Post(LeaseSeen{})
	go func() { // the host's heartbeats
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-l.Done():
				return
			case <-t.C:
				l.Post(Heartbeat{Host: "h1", Slots: 2})
			}
		}
	}()
	g, err := control.NewJobGraph("j1", []*control.Vertex{{UID: "src", Parallelism: 2}})
	if err != nil {
		t.Fatal(err)
	}
	spec := JobSpec{ID: "j1", Graph: g, Restart: control.RestartConfig{Kind: control.RestartNone}}
	deadline := time.After(time.Minute)
	for done := false; !done; {
		l.Post(Deploy{Request: "r1", Spec: spec})
		select {
		case r := <-replies:
			// unavailable until it leads with its table: asked again
			done = r.Code == ""
			if r.Code != "" && r.Code != CodeUnavailable {
				t.Fatalf("deploy: %v", r)
			}
		case <-deadline:
			t.Fatal("no reply to the deploy within a minute")
		}
	}
	select {
	case a := <-assigned:
		if a.Ref != (AttemptRef{Job: "j1", Attempt: 1}) || a.Host != "h1" || len(a.Slots) != 2 {
			t.Fatalf("assigned %v", a)
		}
	case <-deadline:
		t.Fatal("not assigned within a minute")
	}
	var jobs []JobStatus
	if err := l.Read(func(c *Core) { jobs = c.Jobs() }); err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 || jobs[0].Slots != 2 || len(jobs[0].Placement) != 2 {
		t.Fatalf("jobs %+v", jobs)
	}
	cancel()
	if err := <-ran; !errors.Is(err, ErrStopped) {
		t.Fatalf("Run: %v", err)
	}
	if l.Post(Tick{}) || l.Read(func(*Core) {}) == nil {
		t.Fatal("the loop takes events after it stopped")
	}
}
