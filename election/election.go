// Package election runs leader election on a pglease Manager: one lease
// key per election, a term per leadership with the lease's fencing token,
// callbacks when a term ends and when the leader changes. It is built only
// on the Manager's public calls (Acquire, Watch, Lookup, Config), in the
// shape of etcd's concurrency.Election on a Session and client-go's
// leaderelection on a resource lock: a candidate campaigns (waits for the
// lease), leads while it holds it, and resigns (releases it).
package election

import (
	"context"
	"errors"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/manager"
)

// op is the operation every error of Run names.
const op = "election.Run"

// Config configures Run: leader election on one lease key, in the shape
// of Kubernetes' leaderelection (callbacks for stopped leading and for a
// new leader) and etcd's concurrency.Election (campaign, lead with a
// fencing revision, resign). A term starts when Run's function is called
// with it: what should happen when this candidate starts leading goes at
// the start of that function.
type Config struct {
	// Name is the election's lease key (required): every candidate of one
	// election uses the same Name, e.g. "leader:billing-cron".
	Name string
	// TTL is the leadership lease's TTL (default the Manager's
	// Config.TTL). The leader's lease is extended by the Manager's
	// heartbeat; when the leader dies or hangs, another candidate leads
	// at most TTL + 1 s (the tolerance past a lease's expiry) + one retry
	// delay of the Manager's Config.Retry after the leader's last extend.
	// A candidate that does not lead learns of a new leader as its grant
	// commits (Manager.Watch), without polling; when it cannot watch
	// (Config.DisableNotify, or once its Manager stopped listening for
	// good) it reads who leads every TTL/4 (at least 100 ms).
	TTL time.Duration

	// OnStoppedLeading, if set, is called when a term of this candidate
	// ended, after the function returned and the lease was released (or
	// found lost). cause is nil after a resignation (the function
	// returned while leading, or called term.Release), else term.Err():
	// an error matching pglease.ErrLockLost (the lease was lost),
	// pglease.ErrClosed (the Manager closed) or pglease.ErrReleased
	// wrapping the election context's error (ctx ended).
	OnStoppedLeading func(term *Term, cause error)
	// OnNewLeader, if set, is called when the observed leader changes,
	// with the leader's identity (its Manager's Config.Holder, by default
	// "program[pid]@host"; "" for a holder that recorded none, such as
	// SyncGuard) and whether it is this candidate. Calls are sequential.
	OnNewLeader func(identity string, self bool)
}

// Term is one leadership term of a Run candidate: a pglease.Handle for
// the lease the candidate leads with, whose Context is the context Run's
// function runs under. Err is nil while the candidate leads, then why the
// term ended, always a *pglease.Error:
//   - pglease.ErrLockLost: the lease was lost (not extended in time, or
//     taken over after it expired); the function must stop at once;
//   - pglease.ErrClosed: the Manager was closed;
//   - pglease.ErrReleased: the term was resigned, by Release or because
//     the function returned, or because the election's context ended
//     (the error then wraps that context's error: errors.Is(err,
//     context.Canceled) holds; the lease is released once the function
//     returns).
//
// Release resigns early: the term's Context ends at once (ErrReleased)
// and the lease is released; Run then goes on as if the function had
// returned nil. Fence is the term's fencing token; Lock gives the
// underlying lease (Key, ExpiresAt, Remaining, GrantID, Extend, Guard).
// Every method is safe for concurrent use, and on a nil *Term (Release
// and Err answer pglease.ErrInvalidArgument, Context an ended context).
type Term struct {
	lock    *manager.Lock           // immutable
	ctx     context.Context         // immutable: a child of lock's context
	cancel  context.CancelCauseFunc // ends the term with a cause (first wins)
	parent  context.Context         // immutable: the election's context
	timeout time.Duration           // immutable: the Manager's StatementTimeout, which bounds a release after the term ended
}

var _ pglease.Handle = (*Term)(nil)

// errNilTerm is what the methods of a nil *Term answer.
var errNilTerm = invalid("election.Term", "nil Term")

// nilTermCtx is the Context of a nil *Term: ended, with cause errNilTerm.
var nilTermCtx = endedContext(errNilTerm)

// resigned is the cause a term ends with when it resigns (Release).
var resigned = pgerr.New(pglease.CodeReleased, "election.Term.Release", "the term resigned", nil)

func invalid(op, msg string) error {
	return pgerr.New(pglease.CodeInvalidArgument, op, msg, nil)
}

// endedContext returns a context that has ended with cause.
func endedContext(cause error) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return ctx
}

// newTerm starts the term of lock within the election context parent.
// The term's context is a child of the lock's (it ends with the lock's
// cause at once when the lock ends) that also ends, with ErrReleased
// wrapping parent's cause, when parent ends; stop stops watching parent.
func newTerm(parent context.Context, lock *manager.Lock, timeout time.Duration) (t *Term, stop func() bool) {
	ctx, cancel := context.WithCancelCause(lock.Context())
	t = &Term{lock: lock, ctx: ctx, cancel: cancel, parent: parent, timeout: timeout}
	stop = context.AfterFunc(parent, t.parentEnded)
	return t, stop
}

// parentEnded ends the term because the election's context ended.
func (t *Term) parentEnded() {
	t.cancel(pgerr.New(pglease.CodeReleased, op,
		"the election's context ended: the term resigns", context.Cause(t.parent)))
}

// Fence returns the term's fencing token: strictly greater than the fence
// of every earlier term of the election (0 for a nil Term). Guard the
// leader's writes with it (pg.FenceGuard).
func (t *Term) Fence() pglease.Fence {
	if t == nil {
		return 0
	}
	return t.lock.Fence()
}

// Lock returns the term's lease lock (nil for a nil Term). Its Context
// ends only with the lease (loss, release, Close), not when the election's
// context ends; use the Term's Context for the leader's work.
func (t *Term) Lock() *manager.Lock {
	if t == nil {
		return nil
	}
	return t.lock
}

// Context returns the context the leader's work runs under: cancelled
// when the term ends; context.Cause then returns the same error as Err.
func (t *Term) Context() context.Context {
	if t == nil {
		return nilTermCtx
	}
	return t.ctx
}

// Done is Context().Done().
func (t *Term) Done() <-chan struct{} { return t.Context().Done() }

// Err returns nil while the candidate leads in this term, then why the
// term ended (see Term).
func (t *Term) Err() error {
	if t == nil {
		return errNilTerm
	}
	t.settle()
	if t.ctx.Err() == nil {
		return nil
	}
	return context.Cause(t.ctx)
}

// settle ends the term if the election's context ended and the AfterFunc
// watching it has not run yet, so Err and Release see the end at once.
// (The lease's end reaches t.ctx synchronously: it is its parent.)
func (t *Term) settle() {
	if t.ctx.Err() == nil && t.parent.Err() != nil {
		t.parentEnded()
	}
}

// Release resigns the term: its Context ends at once with a cause
// matching pglease.ErrReleased (unless it had ended already), and the
// lease is released (see manager.Lock.Release for the result: nil, an
// error matching pglease.ErrLockLost if the lease had been lost before,
// or another error if the outcome is unknown). Releasing twice is a
// no-op. ctx may be the term's own Context (fn's ctx) or derived from
// it: the term's end does not abort the release, which is then bounded
// by the Manager's StatementTimeout.
func (t *Term) Release(ctx context.Context) error {
	if t == nil {
		return errNilTerm
	}
	if ctx == nil {
		return invalid("election.Term.Release", "nil context")
	}
	t.settle()
	t.cancel(resigned) // no effect if the term had ended
	if ctx.Err() != nil && context.Cause(ctx) == context.Cause(t.ctx) {
		// ctx is the term's Context or derived from it: its end is the
		// term's, not the caller giving up on the release.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.timeout)
		defer cancel()
		ctx = rctx
	}
	return t.lock.Release(ctx)
}

// resignation reports whether the term ended by a resignation: Release
// (its own, or the lease's released through Lock) rather than a loss,
// the Manager's Close, or the end of the election's context.
func (t *Term) resignation() bool {
	cause := t.Err()
	if cause == resigned {
		return true
	}
	if pglease.CodeOf(cause) != pglease.CodeReleased {
		return false
	}
	// Released: by the lease's own Release (term.Lock().Release), or by
	// the election's context ending (parentEnded wraps its cause).
	pc := context.Cause(t.parent)
	return pc == nil || !errors.Is(cause, pc)
}

// Run campaigns for leadership of cfg.Name on m until ctx ends: it waits
// for the lease, runs fn while it leads, then resigns (releases the
// lease) and campaigns again: after a loss at once; after a resignation
// once another candidate leads, so that a waiting candidate takes over,
// or after TTL if none does (a lone candidate that resigned leads again
// after TTL). fn runs under the term's Context, which ends when the lease
// is lost (context.Cause is then a pglease.ErrLockLost error), when ctx
// ends (pglease.ErrReleased wrapping ctx's error), when the Manager
// closes (pglease.ErrClosed) or when fn resigns early with term.Release;
// fn must return then. The term (fn's second argument, a pglease.Handle)
// carries the term's fence: use it for fenced writes (pg.FenceGuard), so
// a leader that lost its lease without noticing yet (paused, partitioned)
// cannot overwrite the next leader's work. Only one candidate leads at a
// time by the lease; by the fence, no old leader's fenced write lands
// after a newer leader's.
//
// Run returns, when ctx ends, a CodeAborted error wrapping ctx's error
// (errors.Is(err, context.Canceled) holds after a cancel); the error of
// fn, unchanged, when fn fails while still leading (after resigning); or
// the Manager's error when the Manager closes or the election cannot run
// (bad configuration: InvalidArgument, before any I/O). Every error but
// fn's own is a *pglease.Error.
func Run(ctx context.Context, m *manager.Manager, cfg Config, fn func(ctx context.Context, term *Term) error) error {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if m == nil {
		return invalid(op, "nil Manager")
	}
	if fn == nil {
		return invalid(op, "nil function")
	}
	if _, err := keys.NormalizeKey(cfg.Name); err != nil {
		return invalid(op, "bad election Name")
	}
	mc := m.Config()
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = mc.TTL
	}
	if err := checkTTL(ttl, mc.LossMargin); err != nil {
		return err
	}
	every := max(ttl/4, 100*time.Millisecond)
	obs := &observer{m: m, cfg: cfg, key: cfg.Name, holder: mc.Holder, timeout: mc.StatementTimeout}
	// ctx's end, as a *pglease.Error like every error of the package:
	// errors.Is(err, context.Canceled) still holds.
	ended := func() error {
		return pgerr.New(pglease.CodeAborted, op, "the election's context ended", ctx.Err())
	}
	for {
		// Campaign: wait for the lease while watching who leads.
		octx, stopObs := context.WithCancel(ctx)
		done := make(chan struct{})
		won := make(chan pglease.Fence, 1) // this campaign's grant, for the observer
		go func() { defer close(done); obs.watch(octx, every, won) }()
		lk, err := m.Acquire(ctx, cfg.Name, manager.WithTTL(ttl))
		if err == nil {
			won <- lk.Fence()
		}
		stopObs()
		<-done
		if err != nil {
			if ctx.Err() != nil {
				return ended()
			}
			if pglease.Retryable(err) {
				// The database is away: campaign again after a pause.
				select {
				case <-ctx.Done():
					return ended()
				case <-time.After(every):
				}
				continue
			}
			if pglease.CodeOf(err) == pglease.CodeClosed {
				return electionClosed()
			}
			return err
		}
		obs.saw(mc.Holder, true, true)
		obs.mine = lk.Fence()
		t, stopWatch := newTerm(ctx, lk, mc.StatementTimeout)
		ferr := fn(t.Context(), t)
		stopWatch()
		lost := lk.Err() // nil while the lease is still held
		if errors.Is(lost, pglease.ErrReleased) {
			lost = nil // fn resigned with term.Release
		}
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), mc.StatementTimeout)
		rerr := t.Release(rctx) // resign (a no-op if fn released it)
		rcancel()
		var cause error // nil for a resignation
		if !t.resignation() {
			cause = t.Err() // lost, closed, or ctx ended
		} else if errors.Is(rerr, pglease.ErrLockLost) {
			cause = rerr // the release found the lease lost
		}
		if cfg.OnStoppedLeading != nil {
			cfg.OnStoppedLeading(t, cause)
		}
		obs.saw("", false, false) // the next observation reports whoever leads next
		switch {
		case ctx.Err() != nil:
			return ended()
		case ferr != nil && lost == nil:
			return ferr
		case errors.Is(rerr, pglease.ErrClosed):
			return electionClosed()
		}
		if lost == nil {
			// A resignation hands over: campaigning again at once would
			// usually win again (the release and the next acquire come
			// from this process first). Let a waiting candidate, which
			// the release woke, take the lease: campaign again once
			// another candidate leads, or after TTL if none does. (A
			// fixed pause raced the other candidate's wake-up on a busy
			// machine.)
			if !obs.awaitOther(ctx, every, ttl) {
				return ended()
			}
		}
	}
}

// checkTTL validates the leadership lease's TTL before any I/O, by the
// rules the Manager's Acquire applies to an auto-extended lease: a valid
// lease TTL (whole milliseconds, not too large), at least
// heartbeat.MinAutoExtendTTL, and a LossMargin (when set) that leaves a
// trust window after the first extend. TestRunBadTTLAsAcquire holds the
// two to the same answers.
func checkTTL(ttl, margin time.Duration) error {
	if err := keys.ValidateTTL(ttl); err != nil {
		var e *pglease.Error
		if errors.As(err, &e) {
			return pgerr.New(e.Code, op, e.Msg, nil)
		}
		return pgerr.New(pglease.CodeInvalidArgument, op, "bad TTL", err)
	}
	switch {
	case ttl < heartbeat.MinAutoExtendTTL:
		return invalid(op, "TTL below the auto-extend floor of 300ms: a leader's lease is extended by the heartbeat")
	case margin > 0 && margin >= ttl-ttl/3:
		return invalid(op, "the Manager's LossMargin leaves no trust window after the first extend (must be below 2/3 of the TTL)")
	}
	return nil
}

// electionClosed is Run's error when its Manager closes: the election
// ends there (CodeClosed); campaigning again needs a new Manager.
func electionClosed() error {
	return pgerr.New(pglease.CodeClosed, op, "the election ended because its Manager closed (Close was called): "+
		"no term runs any more; campaign again with a new Manager", nil)
}

// observer reports leader changes to OnNewLeader. A candidate learns
// of them through Watch of the election's key (a grant is seen as it
// commits), or, when its Manager cannot watch, by reading the lease
// every TTL/4 (Lookup).
type observer struct {
	m       *manager.Manager
	cfg     Config
	key     string
	holder  string        // this Manager's holder identity
	timeout time.Duration // bounds each Lookup: the Manager's StatementTimeout
	last    string
	lastMe  bool
	leading bool          // a leader is currently known
	mine    pglease.Fence // the fence of this candidate's last term (0: none)
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
	if o.cfg.OnNewLeader != nil {
		o.cfg.OnNewLeader(identity, self)
	}
}

// ownGrantWait bounds how long a campaign's observer waits, on a grant
// made under its own holder identity, to learn whether the grant is its
// campaign's (Run then reports it) or another candidate's in the same
// process.
const ownGrantWait = time.Second

// sawEvent reports a watch event of the election's key during a
// campaign. A grant at or below this candidate's last term is not news
// (a state read again after a reconnect); nor is the campaign's own
// grant (won gets its fence), which Run reports: a grant made under this
// process's holder identity may be it, and is reported only once it is
// known not to be. It returns false when the observer should stop.
func (o *observer) sawEvent(ctx context.Context, ev manager.Event, won <-chan pglease.Fence) bool {
	switch {
	case ev.Kind != manager.EventGranted:
		o.saw("", false, false)
	case ev.Fence <= o.mine:
	case ev.Holder == o.holder:
		t := time.NewTimer(ownGrantWait)
		defer t.Stop()
		select {
		case <-won:
			return false // the campaign won: it stops observing
		case <-ctx.Done():
			return false
		case <-t.C:
			o.saw(ev.Holder, true, false)
		}
	default:
		o.saw(ev.Holder, true, false)
	}
	return true
}

// awaitOther waits until another candidate holds the lease (reported to
// OnNewLeader: a grant after this candidate's last term) or d has passed;
// false if ctx ended.
func (o *observer) awaitOther(ctx context.Context, every, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if ch, err := o.m.Watch(wctx, o.key); err == nil {
		for {
			select {
			case <-ctx.Done():
				return false
			case <-deadline.C:
				return true
			case ev, ok := <-ch:
				if !ok {
					if ctx.Err() != nil {
						return false
					}
					return o.pollOther(ctx, every, deadline.C) // the Manager stopped listening
				}
				if ev.Kind == manager.EventGranted && ev.Fence > o.mine {
					o.saw(ev.Holder, true, false)
					return true
				}
			}
		}
	}
	return o.pollOther(ctx, every, deadline.C)
}

// pollOther is awaitOther by reading the lease's holder every interval.
func (o *observer) pollOther(ctx context.Context, every time.Duration, deadline <-chan time.Time) bool {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-deadline:
			return true
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, o.timeout)
		info, err := o.m.Lookup(lctx, o.key)
		cancel()
		if err == nil && info != nil {
			o.saw(info.Holder, true, false)
			return true
		}
	}
}

// watch reports who leads until ctx ends: from the key's watch events,
// or, when the Manager cannot watch, by reading the lease's holder every
// interval.
func (o *observer) watch(ctx context.Context, every time.Duration, won <-chan pglease.Fence) {
	if ch, err := o.m.Watch(ctx, o.key); err == nil {
		for ev := range ch {
			if ctx.Err() != nil || !o.sawEvent(ctx, ev, won) {
				return // Run stopped observing
			}
		}
		if ctx.Err() != nil {
			return
		}
		// Closed while observing: the Manager stopped listening for good
		// (or closed: then the campaign's Acquire fails too).
	}
	o.poll(ctx, every)
}

// poll reads the lease's holder every interval until ctx ends.
func (o *observer) poll(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, o.timeout)
		info, err := o.m.Lookup(lctx, o.key)
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
