package core

import "fmt"

// Lease is the leader lease as a pure machine, the part of Core that
// decides who leads, and usable alone. A standby takes the lease when it
// has not changed for Config.LeaseTTL ticks (or was released, or there is
// none): AcquireLease with the next term, at the revision it saw. The
// leader renews it every LeaseRenew ticks, one request at a time, and is
// deposed when it could not renew it for LeaseSelf ticks (less than
// LeaseTTL: it stops before a standby takes over), when a renewal finds
// the lease taken, or when it sees a later term.
//
// Step takes Tick, LeaseSeen (the lease as the loop read or watched it;
// Rev 0: there is none) and LeaseResult (the answer to the last request),
// and returns AcquireLease, RenewLease, Elected (this controller leads from
// now on) and Deposed (it stopped for good: nothing follows).
type Lease struct {
	cfg  Config
	now  int64
	role role
	term uint64 // the term it leads

	// The lease as last seen (standby) or held (leader).
	seenTerm, seenRev uint64
	seenAt            int64
	seenReleased      bool
	seen              bool
	inFlight          bool  // an AcquireLease or RenewLease awaits its result
	renewedAt         int64 // leader: its last renewal (or the takeover)
	askedAt           int64 // leader: when it last asked to renew
}

// Elected says the controller leads Term from now on (it won the lease).
type Elected struct {
	ID   string
	Term uint64
}

func (Elected) isAction()        {}
func (a Elected) String() string { return fmt.Sprintf("elected %s term=%d", a.ID, a.Term) }

// NewLease returns the lease machine of a standby controller.
func NewLease(cfg Config) (*Lease, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Lease{cfg: cfg}, nil
}

// Term is the term it leads, 0 when it does not.
func (l *Lease) Term() uint64 {
	if l.role != leader {
		return 0
	}
	return l.term
}

// Deposed reports whether it stopped for good.
func (l *Lease) Deposed() bool { return l.role == deposed }

// Step applies Tick, LeaseSeen or LeaseResult (other events are ignored).
func (l *Lease) Step(ev Event) []Action {
	if l.role == deposed {
		return nil
	}
	switch e := ev.(type) {
	case Tick:
		l.now++
		return l.tick()
	case LeaseSeen:
		return l.leaseSeen(e)
	case LeaseResult:
		return l.result(e)
	}
	return nil
}

func (l *Lease) tick() []Action {
	switch l.role {
	case standby:
		if l.seen && !l.inFlight && (l.seenRev == 0 || l.seenReleased || l.now-l.seenAt >= l.cfg.LeaseTTL) {
			l.inFlight = true
			return []Action{AcquireLease{ID: l.cfg.ID, Term: l.seenTerm + 1, Rev: l.seenRev}}
		}
	case leader:
		if l.now-l.renewedAt >= l.cfg.LeaseSelf {
			return []Action{l.Depose(fmt.Sprintf("the lease of term %d not renewed for %d ticks", l.term, l.now-l.renewedAt))}
		}
		if !l.inFlight && l.now-l.askedAt >= l.cfg.LeaseRenew {
			l.inFlight, l.askedAt = true, l.now
			return []Action{RenewLease{ID: l.cfg.ID, Term: l.term, Rev: l.seenRev}}
		}
	}
	return nil
}

func (l *Lease) leaseSeen(e LeaseSeen) []Action {
	switch l.role {
	case standby:
		if !l.seen || e.Rev != l.seenRev {
			l.seenTerm, l.seenRev, l.seenAt = e.Term, e.Rev, l.now
		}
		l.seen, l.seenReleased = true, e.Released
	case leader:
		if e.Term > l.term {
			return []Action{l.Depose(fmt.Sprintf("the lease was taken over in term %d by %s", e.Term, e.Holder))}
		}
	}
	return nil
}

func (l *Lease) result(e LeaseResult) []Action {
	if !l.inFlight {
		return nil
	}
	l.inFlight = false
	switch {
	case l.role == standby && e.OK:
		l.role, l.term, l.seenTerm, l.seenRev, l.renewedAt, l.askedAt = leader, e.Term, e.Term, e.Rev, l.now, l.now
		return []Action{Elected{ID: l.cfg.ID, Term: l.term}}
	case l.role == standby && e.Err == "":
		l.seenTerm, l.seenRev, l.seenAt, l.seenReleased = e.Held, e.Rev, l.now, false
	case l.role == leader && e.Term != l.term:
	case l.role == leader && e.OK:
		l.seenRev, l.renewedAt = e.Rev, l.now
	case l.role == leader && e.Err == "":
		return []Action{l.Depose(fmt.Sprintf("the lease of term %d was taken over (by %s in term %d)", l.term, e.Holder, e.Held))}
	}
	return nil
}

// Depose stops it for good (another leader wrote in a later term, or
// announced one) and returns the Deposed action.
func (l *Lease) Depose(reason string) Deposed {
	l.role = deposed
	return Deposed{Term: l.term, Reason: reason}
}
