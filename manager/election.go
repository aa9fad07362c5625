package manager

import (
	"context"
	"errors"
	"time"

	"github.com/pglease/pglease"
)

// Election configures RunElection: leader election on one lease key, in
// the shape of Kubernetes' leaderelection (callbacks for started and
// stopped leading and for a new leader) and etcd's concurrency.Election
// (campaign, lead with a fencing revision, resign).
type Election struct {
	// Name is the election's lease key (required): every candidate of one
	// election uses the same Name, e.g. "leader:billing-cron".
	Name string
	// TTL is the leadership lease's TTL (default the Manager's
	// Config.TTL). The leader's lease is extended by the Manager's
	// heartbeat; when the leader dies or hangs, another candidate leads
	// at most TTL + pglease.TimeTolerance (1 s) + one retry delay of the
	// Manager's Config.Retry after the leader's last extend.
	TTL time.Duration
	// ObserveInterval is how often a candidate that does not lead reads
	// who does, for OnNewLeader, and how long a leader that resigned
	// waits before campaigning again. Default TTL/4, at least 100 ms.
	ObserveInterval time.Duration

	// OnStartedLeading, if set, is called when this candidate starts a
	// term, before the function runs, with the term's lock (its Fence is
	// the term's fencing token).
	OnStartedLeading func(term *Lock)
	// OnStoppedLeading, if set, is called when a term of this candidate
	// ended: the function returned (and the lease was released) or the
	// lease was lost. cause is nil after a resignation, else the lock's
	// Err (a pglease.ErrLockLost error) or the context's end.
	OnStoppedLeading func(term *Lock, cause error)
	// OnNewLeader, if set, is called when the observed leader changes,
	// with the leader's identity (its Manager's Config.Holder, by default
	// "program[pid]@host"; "" for a holder that recorded none, such as
	// SyncGuard) and whether it is this candidate. Calls are sequential.
	OnNewLeader func(identity string, self bool)
}

// errElectionEnded is the cause of fn's context once fn returned.
var errElectionEnded = errors.New("election term ended")

// RunElection campaigns for leadership of e.Name until ctx ends: it waits
// for the lease, runs fn while it leads, then resigns (releases the
// lease) and campaigns again: after a loss at once, after a resignation
// once ObserveInterval has passed, so that a waiting candidate takes
// over. fn's context ends when the lease is lost
// (context.Cause is then a pglease.ErrLockLost error), when ctx ends, or
// when the Manager closes; fn must return then. The term's lock (fn's
// second argument) carries the term's fence: use it for fenced writes
// (pg.FenceGuard), so a leader that lost its lease without noticing yet
// (paused, partitioned) cannot overwrite the next leader's work. Only
// one candidate leads at a time by the lease; by the fence, no old
// leader's fenced write lands after a newer leader's.
//
// RunElection returns ctx's error when ctx ends, the error of fn when fn
// fails while still holding the lease (after resigning), or the
// Manager's error when the Manager closes or the election cannot run
// (bad configuration: InvalidArgument, before any I/O).
func (m *Manager) RunElection(ctx context.Context, e Election, fn func(ctx context.Context, term *Lock) error) error {
	const op = "manager.RunElection"
	if err := pglease.CheckContext(op, ctx); err != nil {
		return err
	}
	if fn == nil {
		return invalid(op, "nil function")
	}
	if _, err := pglease.NormalizeKey(e.Name); err != nil {
		return invalid(op, "bad election Name")
	}
	ttl := e.TTL
	if ttl == 0 {
		ttl = m.cfg.TTL
	}
	if err := checkTTL(op, ttl, m.cfg.LossMargin, true); err != nil {
		return err
	}
	every := e.ObserveInterval
	if every == 0 {
		every = max(ttl/4, 100*time.Millisecond)
	}
	if every < 0 {
		return invalid(op, "ObserveInterval must not be negative")
	}
	obs := &observer{m: m, e: e, key: e.Name}
	for {
		// Campaign: wait for the lease while watching who leads.
		octx, stopObs := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); obs.watch(octx, every) }()
		term, err := m.Acquire(ctx, e.Name, WithTTL(ttl), WithAcquireTimeout(NoAcquireTimeout))
		stopObs()
		<-done
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pglease.Retryable(err) {
				// The database is away: campaign again after a pause.
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(every):
				}
				continue
			}
			return err
		}
		obs.saw(m.store.Holder(), true, true)
		if e.OnStartedLeading != nil {
			e.OnStartedLeading(term)
		}
		fctx, cancel := context.WithCancelCause(ctx)
		stop := context.AfterFunc(term.Context(), func() { cancel(context.Cause(term.Context())) })
		ferr := fn(fctx, term)
		stop()
		cancel(errElectionEnded)
		lost := term.Err() // nil while still held
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StatementTimeout)
		rerr := term.Release(rctx) // resign
		rcancel()
		cause := lost
		if cause == nil && ctx.Err() != nil {
			cause = ctx.Err()
		}
		if cause == nil && rerr != nil && errors.Is(rerr, pglease.ErrLockLost) {
			cause = rerr
		}
		if e.OnStoppedLeading != nil {
			e.OnStoppedLeading(term, cause)
		}
		obs.saw("", false, false) // the next observation reports whoever leads next
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case ferr != nil && lost == nil:
			return ferr
		case errors.Is(rerr, pglease.ErrClosed):
			return rerr
		}
		if lost == nil {
			// A resignation hands over: campaigning again at once would
			// usually win again (the release and the next acquire come
			// from this process first). Let a waiting candidate, which
			// the release woke, take the lease.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(every):
			}
		}
	}
}

// observer reports leader changes to OnNewLeader.
type observer struct {
	m       *Manager
	e       Election
	key     string
	last    string
	lastMe  bool
	leading bool // a leader is currently known
}

// saw records the observed leader: its identity, or lead false for none
// (an expired or released lease). self is true only for this candidate's
// own term.
func (o *observer) saw(identity string, lead, self bool) {
	if !lead {
		o.leading = false
		return
	}
	if o.leading && identity == o.last && self == o.lastMe {
		return
	}
	o.last, o.lastMe, o.leading = identity, self, true
	if o.e.OnNewLeader != nil {
		o.e.OnNewLeader(identity, self)
	}
}

// watch reads the lease's holder every interval until ctx ends.
func (o *observer) watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, o.m.cfg.StatementTimeout)
		info, err := o.m.store.LookupByKey(lctx, o.key)
		cancel()
		if err == nil {
			if info == nil {
				o.saw("", false, false)
			} else {
				o.saw(info.Holder, true, false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
