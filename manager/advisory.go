package manager

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/pg/advisory"
)

// advisoryState is the Manager's share of session-level advisory locks:
// one advisory.Session, opened on first use and replaced after it is
// lost, and the keys held (or being taken) through this Manager. It is
// not part of the actor: an advisory.Session already serialises its
// statements on its own connection, so callers use it directly and this
// state is guarded by mu. The zero value is ready to use.
type advisoryState struct {
	opts *advisory.Options // read at each Open; nil = advisory defaults (set by tests only)

	mu      sync.Mutex
	closed  bool                           // Close began: no new session, no new lock
	sess    *advisory.Session              // the current session; nil before first use and after loss
	opening chan struct{}                  // non-nil while one caller opens a session; closed when done
	keys    map[advisory.Key]*AdvisoryLock // held keys; a nil value is a key being taken
	queues  map[advisory.Key][]*advWaiter  // LockAdvisory callers waiting for a key in keys, FIFO
	stopped chan struct{}                  // made by beginClose, closed when the close has finished
	unlocks sync.WaitGroup                 // unlock statements in flight (Release); Add only under mu while !closed
}

// advWaiter is a LockAdvisory caller waiting for a key held (or being
// taken) by another caller of this Manager. ready is closed when the key
// is handed to it (granted: the key is reserved for it, as by reserve)
// or when Close begins (not granted).
type advWaiter struct {
	ready   chan struct{}
	granted bool // guarded by advisoryState.mu
	pos     int  // immutable: callers ahead of it when it came (telemetry)
}

// errHeldHere tells takeAdvisory that a TryLockAdvisory found its key
// held or being taken through this Manager: ok=false, like a key held by
// another session. Never returned to callers.
var errHeldHere = errors.New("advisory key held through this Manager")

// AdvisoryLock is a session-level PostgreSQL advisory lock held through a
// Manager (LockAdvisory, TryLockAdvisory): a pglease.Handle with no
// fencing token and no TTL. The server holds it until Release, until the
// Manager is closed, or until the session's connection dies.
//
// All advisory locks of a Manager share one advisory.Session (one
// dedicated connection hijacked from the pool, checked by a probe),
// opened on first use. When that session is lost (connection cut,
// pg_terminate_backend, server restart) the server has already freed its
// locks; every AdvisoryLock's Context is cancelled with a cause matching
// pglease.ErrLockLost once the probe notices (within about ProbeInterval
// + ProbeTimeout, 2 s by default), and the next call opens a new session.
// No fence covers that window: see package advisory for when to prefer a
// lease or a transaction lock. Close cancels the held advisory locks with
// ErrClosed, fails waiting calls with ErrClosed and closes the session
// (pg_advisory_unlock_all, then the connection), bounded by
// Config.CloseTimeout, before Done is closed.
//
// An AdvisoryLock is safe
// for concurrent use, and every method is safe on a nil *AdvisoryLock
// (what TryLockAdvisory returns with ok=false): Release and Err return an
// error matching pglease.ErrInvalidArgument, Context and Done an ended
// context, Key the zero Key.
type AdvisoryLock struct {
	m      *Manager                // immutable
	key    advisory.Key            // immutable
	inner  *advisory.Lock          // immutable
	acq    *obs.Acquisition        // immutable; the acquire that granted it
	ctx    context.Context         // immutable; ends when inner's does, or before
	cancel context.CancelCauseFunc // called by Release, by Close, when inner's context ends, and at the hold limit

	// limitCause is the cause the hold limit cancels ctx with (nil
	// without a limit): while ctx's cause is limitCause and inner is live,
	// the lock is still held. pastLimitEnd decides, for such a lock, who
	// records its end (Release or Close), as cancelling ctx first does
	// otherwise.
	limitCause   error // immutable
	limitTimer   *time.Timer
	pastLimitEnd atomic.Bool

	releaseOnce sync.Once
}

// heldPastLimit reports whether the lock's Context ended at its hold
// limit while the lock is still held.
func (l *AdvisoryLock) heldPastLimit() bool {
	return l.limitCause != nil && context.Cause(l.ctx) == l.limitCause && l.inner.Context().Err() == nil
}

var _ pglease.Handle = (*AdvisoryLock)(nil)

// advReleasedCause is the cause of an AdvisoryLock's Context after
// Release.
var advReleasedCause = pgerr.New(pglease.CodeReleased, "manager.AdvisoryLock.Release", "lock released", nil)

// errNilAdvisoryLock is what the methods of a nil *AdvisoryLock answer.
var errNilAdvisoryLock = invalid("manager.AdvisoryLock", "nil AdvisoryLock (TryLockAdvisory returns a nil lock when ok is false)")

var nilAdvisoryCtx = endedContext(errNilAdvisoryLock)

// Key returns the lock's advisory key (the zero Key for a nil lock).
func (l *AdvisoryLock) Key() advisory.Key {
	if l == nil {
		return advisory.Key{}
	}
	return l.key
}

// Context returns a context that is cancelled when the lock stops being
// held. context.Cause then tells why (see Err).
func (l *AdvisoryLock) Context() context.Context {
	if l == nil || l.ctx == nil {
		return nilAdvisoryCtx
	}
	return l.ctx
}

// Done is Context().Done().
func (l *AdvisoryLock) Done() <-chan struct{} { return l.Context().Done() }

// Err returns nil while the lock is held, and then the cause of its end,
// a *pglease.Error matching one of: pglease.ErrReleased (Release),
// pglease.ErrLockLost (the session's connection died, was terminated, or
// the server no longer had the lock; reported within the session's probe
// window, see package advisory), pglease.ErrClosed (the Manager was
// closed), pglease.ErrHoldLimitExceeded (WithHoldLimit: the limit
// passed; the lock is still held until Release).
func (l *AdvisoryLock) Err() error {
	if l == nil || l.ctx == nil {
		return errNilAdvisoryLock
	}
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Release releases the lock in PostgreSQL and returns once the server
// answered. It returns nil if the lock was held until now (or until
// Close released it), an error matching pglease.ErrLockLost if it had
// been lost before, and another error if the unlock failed (the session
// then usually ends, which frees the lock on the server). The lock's
// Context is cancelled with a cause matching pglease.ErrReleased at once.
// Releasing twice is a no-op. If ctx has ended or ends first, Release
// returns CodeAborted while the unlock goes on in the background (even
// with an already-ended ctx, so a deferred Release never leaves the key
// held).
func (l *AdvisoryLock) Release(ctx context.Context) error {
	const op = "manager.AdvisoryLock.Release"
	if l == nil || l.m == nil || l.inner == nil {
		return errNilAdvisoryLock
	}
	if ctx == nil {
		return invalid(op, "nil context")
	}
	var res chan error
	l.releaseOnce.Do(func() { res = l.startUnlock(ctx, op) })
	if res == nil {
		return nil // a second Release
	}
	if err := ctx.Err(); err != nil {
		return pgerr.New(pglease.CodeAborted, op, "context ended; the lock is being released in the background", err)
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the unlock was confirmed", ctx.Err())
	}
}

// startUnlock cancels the lock's context and starts the unlock statement
// (tracked, so Close waits for it). The answer arrives on the returned
// channel (capacity 1).
//
// Telemetry: whoever cancels l.ctx first owns the end of the lock's
// telemetry. If Release does (cause ErrReleased), it records the
// pglease.release span, a child of ctx linked to the lock's acquire span,
// with the pglease.advisory_unlock round trip as its child (or, when
// Close has begun and releases the lock with the session, a release span
// with no round trip of its own). A lock that was lost (Lost, recorded
// when the session ended) or closed (beginClose) gets no release span
// here.
func (l *AdvisoryLock) startUnlock(ctx context.Context, op string) chan error {
	res := make(chan error, 1)
	if ic := l.inner.Context(); ic.Err() != nil {
		l.cancel(context.Cause(ic)) // ended; the AfterFunc of lockAdvisory may not have run yet
	}
	l.cancel(advReleasedCause) // the first cause wins: a lost or closed lock keeps its own
	if c := context.Cause(l.ctx); c != advReleasedCause {
		// Past its hold limit the lock is still held: release it, unless
		// Close has already taken it over.
		if !l.heldPastLimit() || !l.pastLimitEnd.CompareAndSwap(false, true) {
			if c == l.limitCause {
				c = context.Cause(l.inner.Context()) // lost or closed after the limit
			}
			l.m.adv.forget(l)
			res <- endedAnswer(op, c)
			return res
		}
	}
	if l.limitTimer != nil {
		l.limitTimer.Stop()
	}
	rctx, rel := l.acq.StartRelease(ctx)
	a := &l.m.adv
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		rel.End(nil) // Close releases it with the session
		res <- nil
		return res
	}
	a.unlocks.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.unlocks.Done()
		// Not the caller's context: a deferred Release with an ended
		// context must still release. The wait for the connection ends
		// when the session ends; the statement is bounded by the
		// session's ProbeTimeout.
		dctx, db := l.m.rec.StartDB(context.WithoutCancel(rctx), obs.OpAdvisoryUnlock, 1, trace.SpanContext{})
		err := l.inner.Release(dctx)
		released := 0
		if err == nil && errors.Is(context.Cause(l.inner.Context()), pglease.ErrReleased) {
			released = 1 // not when the session's Close released it
		}
		db.End(released, err)
		rel.Served(db.SpanContext())
		if err != nil {
			err = reop(op, err)
		}
		a.forget(l)
		rel.End(err)
		res <- err
	}()
	return res
}

// endedAnswer is what Release returns for a lock that had ended before it.
func endedAnswer(op string, cause error) error {
	if errors.Is(cause, pglease.ErrLockLost) {
		return pgerr.New(pglease.CodeLockLost, op, "the advisory lock had been lost before it was released", cause)
	}
	return nil // closed: Close released it
}

// reop gives a *pglease.Error (from package advisory, pg or pglease) the
// Manager's op; any other error, which none of them returns, becomes
// CodeInternal: every error of the Manager is a *pglease.Error.
func reop(op string, err error) error {
	var e *pglease.Error
	if errors.As(err, &e) {
		return pgerr.New(e.Code, op, e.Msg, e.Err)
	}
	return pgerr.New(pglease.CodeInternal, op, "unexpected error", err)
}

// LockAdvisory takes the session-level advisory lock key, waiting as long
// as ctx allows, and returns it. When ctx ends first the error is
// CodeAborted: the server-side wait is cancelled, a grant that raced the
// cancel is released, and the other advisory locks of this Manager stay
// held. Waiting for another session is not FIFO (see
// advisory.Session.Lock).
//
// Locks are not re-entrant: callers of one Manager exclude each other
// like any two holders, as for leases. LockAdvisory of a key held (or
// being taken) through this Manager waits for that caller's Release, or
// for the lock's loss, in FIFO order with the other callers of this
// Manager waiting for it, without I/O; when ctx ends during that wait
// the error is CodeAborted and says the key was held by this process.
// The key is handed on only once the holder's unlock has been answered
// (or its session has ended), so the shared session never stacks a key.
//
// All advisory locks of a Manager share one advisory.Session (a dedicated
// connection hijacked from the pool, with a probe), opened on first use;
// after that session is lost, the next call opens a new one. These fail
// with no I/O: a nil context and an invalid (zero) key with
// CodeInvalidArgument; an ended context with CodeAborted; a closed
// Manager with CodeClosed.
//
// Advisory keys and lease keys are separate namespaces: an advisory lock
// never conflicts with a lease lock of the same name.
//
// Of the options, only WithHoldLimit applies (anything else is
// InvalidArgument): at the limit the lock's Context ends with a cause
// matching pglease.ErrHoldLimitExceeded, and the lock stays held until
// Release.
//
// LockAdvisory first makes one pg_try_advisory_lock attempt and waits
// (pg_advisory_lock) only when that finds the key held, so an
// uncontended call costs one statement and a contended one shows up as
// contended in telemetry. See "Telemetry of advisory locks" below
// (TryLockAdvisory).
func (m *Manager) LockAdvisory(ctx context.Context, key advisory.Key, opts ...AcquireOption) (*AdvisoryLock, error) {
	return m.lockAdvisory(ctx, "manager.LockAdvisory", key, true, opts)
}

// TryLockAdvisory makes one attempt to take key without waiting: ok is
// false (and err nil) when another session holds it, or when a caller of
// this Manager holds it or is taking it (without I/O: locks are not
// re-entrant). Errors as LockAdvisory; ctx bounds the attempt (and the
// opening of the session).
//
// # Telemetry of advisory locks
//
// Both calls record, through the Manager's Recorder (Config.Telemetry),
// what package telemetry documents with pglease.lock.kind=advisory, the
// key identified by the hash of its String form ("int64:42", "pair:1,2")
// like a lease key (the raw id only with obs.Config.RawKeys):
//
//   - a pglease.acquire span, child of the span in ctx, started after the
//     no-I/O argument checks (nil ctx, ended ctx, zero key: no span). It
//     ends as granted (no pglease.fence: advisory locks have none),
//     locked (TryLockAdvisory found the key held, by another session or
//     through this Manager), aborted, closed, or error.
//     pglease.acquire.attempts counts the round trips below;
//     pglease.acquire.contended is true when one of them found the key
//     held, or when a LockAdvisory waited for a caller of this Manager
//     (a pglease.queued event with pglease.acquire.contended=true).
//   - one client span per call to the advisory.Session, child of the
//     acquire span, with a pglease.attempt event on the acquire span
//     linking to it: pglease.advisory_try_lock (one
//     pg_try_advisory_lock; batch.ok 1 when granted, 0 when held), then,
//     for a contended LockAdvisory, pglease.advisory_lock, whose duration
//     is the server-side wait. That wait is several statements on the
//     session's connection (a pg_advisory_lock per wait slice, and a
//     pg_locks check after an interrupted slice) that the Manager cannot
//     see one by one: the span covers them all. Opening the session
//     (advisory.Open) has no span of its own; it is part of the acquire.
//     An attempt that fails because the session was lost is an "error"
//     attempt, and the next one runs on a new session.
//   - pglease.lock.held{kind=advisory} up by one on the grant, and down by
//     one when the lock ends: Release (a pglease.release span, child of
//     Release's ctx, with its pglease.advisory_unlock round trip as child),
//     Manager.Close (a pglease.release span per lock, root spans, and one
//     pglease.advisory_unlock round trip for the session's
//     pg_advisory_unlock_all, batch size = the locks released), or loss
//     of the session (a pglease.lost span under the acquire span with
//     pglease.loss.cause=session_ended, counted in pglease.lock.lost; it
//     is recorded when the session notices, within its probe window, and
//     links to no round trip, since the session's probe has no span).
//     Release of a lock lost before records no release span.
func (m *Manager) TryLockAdvisory(ctx context.Context, key advisory.Key, opts ...AcquireOption) (lock *AdvisoryLock, ok bool, err error) {
	l, err := m.lockAdvisory(ctx, "manager.TryLockAdvisory", key, false, opts)
	return l, l != nil, err
}

// advisoryOpts reads the options of an advisory lock: only WithHoldLimit
// applies (advisory locks have no TTL, and wait as long as ctx allows).
func advisoryOpts(op string, opts []AcquireOption) (holdLimit time.Duration, err error) {
	var o acquireOpts
	for _, f := range opts {
		if f == nil {
			return 0, invalid(op, "nil option")
		}
		if err := f(&o); err != nil {
			var e *pglease.Error
			if errors.As(err, &e) {
				return 0, pgerr.New(e.Code, op, e.Msg, nil)
			}
			return 0, reop(op, err)
		}
	}
	if o.ttl != 0 || o.timeout != 0 || o.manual || o.shared || o.delay != 0 {
		return 0, invalid(op, "only WithHoldLimit applies to advisory locks (no TTL; the context bounds the wait)")
	}
	return o.holdLimit, nil
}

// maxAdvisorySessions bounds how many sessions one call opens when the
// session it used turns out to have been lost.
const maxAdvisorySessions = 3

func (m *Manager) lockAdvisory(ctx context.Context, op string, key advisory.Key, blocking bool, opts []AcquireOption) (*AdvisoryLock, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if key == (advisory.Key{}) {
		return nil, invalid(op, "invalid advisory key (build it with advisory.Int64, advisory.Pair or a derivation)")
	}
	holdLimit, err := advisoryOpts(op, opts)
	if err != nil {
		return nil, err
	}
	ctx, acq := m.rec.StartAcquire(ctx, m.rec.Key(key.String()), obs.AcquireInfo{
		Kind: obs.KindAdvisory, Try: !blocking,
	})
	l, err := m.takeAdvisory(ctx, op, key, blocking, holdLimit, acq)
	switch {
	case l != nil: // install recorded the grant
	case err == nil:
		acq.NotAcquired()
	default:
		acq.Failed(err)
	}
	return l, err
}

// takeAdvisory is lockAdvisory after the argument checks; acq is the
// call's acquisition (its grant is recorded by install).
func (m *Manager) takeAdvisory(ctx context.Context, op string, key advisory.Key, blocking bool, holdLimit time.Duration, acq *obs.Acquisition) (*AdvisoryLock, error) {
	a := &m.adv
	w, err := a.reserve(op, key, m.isClosing(), blocking)
	switch {
	case err == errHeldHere:
		return nil, nil // TryLock: held through this Manager
	case err != nil:
		return nil, err
	case w != nil:
		acq.Queued(obs.QueueInfo{HeldLocally: true, Coalesced: w.pos > 0, Position: w.pos})
		if err := a.await(ctx, op, key, w); err != nil {
			return nil, err
		}
	}
	granted := false
	defer func() {
		if !granted {
			a.unreserve(key)
		}
	}()
	for tries := 1; ; tries++ {
		s, err := m.advisorySession(ctx, op)
		if err != nil {
			return nil, err
		}
		il, err := m.advisoryRoundTrip(ctx, s, key, false, acq)
		if err == nil && il == nil && blocking {
			il, err = m.advisoryRoundTrip(ctx, s, key, true, acq)
		}
		if err != nil {
			if m.isClosing() || a.isClosed() {
				return nil, closedErr(op)
			}
			if s.Err() != nil && ctx.Err() == nil && tries < maxAdvisorySessions {
				// The session was lost before or during the attempt; no
				// lock is held on it. Try again on a new one.
				a.drop(s)
				continue
			}
			return nil, reop(op, err)
		}
		if il == nil {
			return nil, nil // TryLock: held by another session
		}
		l := &AdvisoryLock{m: m, key: key, inner: il, acq: acq}
		l.ctx, l.cancel = context.WithCancelCause(context.Background())
		if holdLimit > 0 {
			l.limitCause = pgerr.New(pglease.CodeHoldLimitExceeded, "manager.AdvisoryLock",
				"the lock reached its hold limit ("+holdLimit.String()+"); stop and release it (it is still held)", nil)
			l.limitTimer = time.AfterFunc(holdLimit, func() { l.cancel(l.limitCause) })
		}
		if !a.install(l) {
			// Close began after the grant; its Session.Close releases it.
			if l.limitTimer != nil {
				l.limitTimer.Stop()
			}
			l.cancel(closedCause)
			return nil, closedErr(op)
		}
		granted = true
		// l's context follows il's: the session reports a loss by
		// cancelling il's context with a LockLost cause. The loss is
		// recorded before l's context ends, so whoever watches l.Done()
		// finds it in telemetry. il's context always ends (Release, loss,
		// or the session's Close), so this never outlives the session;
		// after Release or Close, l's context has ended already and keeps
		// its own cause.
		context.AfterFunc(il.Context(), func() {
			if l.limitTimer != nil {
				l.limitTimer.Stop()
			}
			cause := context.Cause(il.Context())
			if errors.Is(cause, pglease.ErrLockLost) {
				acq.Lost(obs.LossSessionEnded, trace.SpanContext{})
				a.forget(l) // the server freed it with the session: hand it on
			}
			l.cancel(cause)
		})
		return l, nil
	}
}

// advisoryRoundTrip makes one call to the session, TryLock or (blocking)
// Lock, as a pglease.advisory_try_lock or pglease.advisory_lock client
// span under acq's span, and records it as an attempt of acq. A nil lock
// with a nil error is a TryLock that found the key held.
func (m *Manager) advisoryRoundTrip(ctx context.Context, s *advisory.Session, key advisory.Key, blocking bool, acq *obs.Acquisition) (*advisory.Lock, error) {
	op := obs.OpAdvisoryTryLock
	if blocking {
		op = obs.OpAdvisoryLock
	}
	dctx, db := m.rec.StartDB(ctx, op, 1, acq.SpanContext())
	var il *advisory.Lock
	var err error
	if blocking {
		il, err = s.Lock(dctx, key)
	} else {
		il, _, err = s.TryLock(dctx, key)
	}
	ok, outcome := 1, obs.AttemptGranted
	switch {
	case err != nil:
		ok, outcome = 0, obs.AttemptFailed
	case il == nil:
		ok, outcome = 0, obs.AttemptContended
	}
	db.End(ok, err)
	acq.Attempt(db.SpanContext(), outcome, 0)
	return il, err
}

func (a *advisoryState) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// reserve marks key as being taken, unless a caller of this Manager holds
// it or is taking it: then a blocking caller gets a place in the key's
// queue (wait for it with await) and a TryLock errHeldHere. No I/O.
func (a *advisoryState) reserve(op string, key advisory.Key, closing, blocking bool) (*advWaiter, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if closing || a.closed {
		return nil, closedErr(op)
	}
	if a.heldLocked(key) {
		if !blocking {
			return nil, errHeldHere
		}
		w := &advWaiter{ready: make(chan struct{}), pos: len(a.queues[key])}
		if a.queues == nil {
			a.queues = map[advisory.Key][]*advWaiter{}
		}
		a.queues[key] = append(a.queues[key], w)
		return w, nil
	}
	if a.keys == nil {
		a.keys = map[advisory.Key]*AdvisoryLock{}
	}
	a.keys[key] = nil
	return nil, nil
}

// heldLocked reports whether a caller of this Manager holds key or is
// taking it (or it is reserved for a waiter). A lock lost with its
// session no longer holds its key, even before its Release: it is handed
// on here if the loss's own hand-on has not run yet. a.mu is held.
func (a *advisoryState) heldLocked(key advisory.Key) bool {
	l, ok := a.keys[key]
	if ok && l != nil && l.inner.Context().Err() != nil {
		a.freeLocked(key)
		_, ok = a.keys[key]
	}
	return ok
}

// freeLocked frees key: it is handed to the first waiter in its queue
// (reserved for it), or forgotten when nobody waits. a.mu is held.
func (a *advisoryState) freeLocked(key advisory.Key) {
	q := a.queues[key]
	if len(q) == 0 {
		delete(a.keys, key)
		return
	}
	w := q[0]
	q[0] = nil
	if len(q) == 1 {
		delete(a.queues, key)
	} else {
		a.queues[key] = q[1:]
	}
	a.keys[key] = nil
	w.granted = true
	close(w.ready)
}

// await waits until key is handed to w (nil: it is reserved for the
// caller now, as by reserve), ctx ends, or Close begins.
func (a *advisoryState) await(ctx context.Context, op string, key advisory.Key, w *advWaiter) error {
	select {
	case <-w.ready:
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case w.granted:
		return nil // the caller's deferred unreserve hands it on if it fails
	case a.closed:
		return closedErr(op)
	}
	q := a.queues[key]
	if i := slices.Index(q, w); i >= 0 {
		q = slices.Delete(q, i, i+1)
		if len(q) == 0 {
			delete(a.queues, key)
		} else {
			a.queues[key] = q
		}
	}
	return pgerr.New(pglease.CodeAborted, op, "context ended while waiting for the advisory lock: "+heldHereMsg, ctx.Err())
}

func (a *advisoryState) unreserve(key advisory.Key) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.keys[key]; ok && l == nil {
		a.freeLocked(key)
	}
}

// install records a granted lock, and its grant in telemetry; false
// once Close has begun. The grant is recorded under mu, before the lock
// is visible to beginClose, so that Granted precedes any release or loss
// of the lock (the order obs.Acquisition requires), and a lock
// refused here is recorded as closed, not granted.
func (a *advisoryState) install(l *AdvisoryLock) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	l.acq.Granted(0) // advisory locks have no fence
	a.keys[l.key] = l
	return true
}

// forget removes l's entry, if the entry is still l, handing its key to
// the first caller of this Manager waiting for it. Called once the key is
// no longer held on the session: after l's unlock was answered, or when
// l was lost with its session.
func (a *advisoryState) forget(l *AdvisoryLock) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keys[l.key] == l {
		a.freeLocked(l.key)
	}
}

// drop retires s if it is still the current session, and closes it (it
// has ended already, so this only reaps it).
func (a *advisoryState) drop(s *advisory.Session) {
	a.mu.Lock()
	if a.sess == s {
		a.sess = nil
		for k, l := range a.keys {
			if l != nil && l.inner.Context().Err() != nil {
				a.freeLocked(k) // lost with the session
			}
		}
	}
	a.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = s.Close(cctx)
	cancel()
}

// advisorySession returns the open session, opening one if there is none
// or the current one was lost. Concurrent callers share one Open.
func (m *Manager) advisorySession(ctx context.Context, op string) (*advisory.Session, error) {
	a := &m.adv
	for {
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return nil, closedErr(op)
		}
		if s := a.sess; s != nil {
			if s.Err() == nil {
				a.mu.Unlock()
				return s, nil
			}
			a.mu.Unlock()
			a.drop(s)
			continue
		}
		if ch := a.opening; ch != nil {
			a.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, pgerr.New(pglease.CodeAborted, op, "context ended while the advisory session was being opened", ctx.Err())
			}
		}
		ch := make(chan struct{})
		a.opening = ch
		opts := a.opts
		a.mu.Unlock()

		s, err := m.openAdvisory(ctx, op, opts)
		a.mu.Lock()
		a.opening = nil
		if err == nil {
			a.sess = s // even if closed: Close waits for ch, then closes it
		}
		closed := a.closed
		a.mu.Unlock()
		close(ch)
		switch {
		case closed:
			return nil, closedErr(op)
		case err != nil:
			return nil, err
		}
		return s, nil
	}
}

// openAdvisory opens a session bounded by ctx, StatementTimeout and the
// Manager's shutdown (workCtx).
func (m *Manager) openAdvisory(ctx context.Context, op string, opts *advisory.Options) (*advisory.Session, error) {
	octx, cancel := context.WithTimeout(ctx, m.cfg.StatementTimeout)
	defer cancel()
	defer context.AfterFunc(m.workCtx, cancel)()
	s, err := advisory.Open(octx, m.pool, opts)
	if err != nil {
		if m.workCtx.Err() != nil {
			return nil, closedErr(op)
		}
		return nil, reop(op, err)
	}
	return s, nil
}

// beginClose refuses new advisory work and starts closing the session:
// every held AdvisoryLock's Context is cancelled with ErrClosed, then the
// session is closed (pg_advisory_unlock_all and closing the connection,
// bounded by timeout). Called once, by run, after workCtx is cancelled;
// wait blocks until it has finished. The Manager's Recorder records a
// release for each lock whose end Close decided (see startUnlock), with
// the session's close as their one pglease.advisory_unlock round trip.
func (a *advisoryState) beginClose(timeout time.Duration) {
	a.mu.Lock()
	a.closed = true
	stopped := make(chan struct{})
	a.stopped = stopped
	opening := a.opening
	for k, q := range a.queues {
		for _, w := range q {
			close(w.ready) // not granted: await answers ErrClosed
		}
		delete(a.queues, k)
	}
	a.mu.Unlock()
	go func() {
		defer close(stopped)
		if opening != nil {
			<-opening // the Open is cancelled with workCtx
		}
		a.mu.Lock()
		s := a.sess
		a.sess = nil
		var held []*AdvisoryLock
		for _, l := range a.keys {
			if l != nil {
				held = append(held, l)
			}
		}
		a.mu.Unlock()
		var rels []obs.Release
		var relSC trace.SpanContext
		var rec *obs.Recorder // every lock's, the Manager's
		for _, l := range held {
			rec = l.m.rec
			if ic := l.inner.Context(); ic.Err() != nil {
				l.cancel(context.Cause(ic)) // lost, and Lost recorded or about to be
			}
			held := l.heldPastLimit() && l.pastLimitEnd.CompareAndSwap(false, true)
			l.cancel(closedCause)
			if l.limitTimer != nil {
				l.limitTimer.Stop()
			}
			if context.Cause(l.ctx) == closedCause || held { // not released or lost before
				rctx, rel := l.acq.StartRelease(context.Background())
				rels = append(rels, rel)
				relSC = trace.SpanContextFromContext(rctx)
			}
		}
		if s != nil {
			var db obs.DBSpan
			if len(rels) > 0 {
				parent := trace.SpanContext{} // a round trip serving several releases is a root span
				if len(rels) == 1 {
					parent = relSC
				}
				_, db = rec.StartDB(context.Background(), obs.OpAdvisoryUnlock, len(rels), parent)
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := s.Close(ctx)
			cancel()
			db.End(len(rels), err)
			for _, rel := range rels {
				rel.Served(db.SpanContext())
			}
		}
		for _, rel := range rels {
			rel.End(nil)
		}
		a.unlocks.Wait()
	}()
}

// wait blocks until the close started by beginClose has finished.
func (a *advisoryState) wait() {
	a.mu.Lock()
	stopped := a.stopped
	a.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}
