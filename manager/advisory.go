package manager

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/advhook"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/pg/advisory"
)

// advFuncs are package advisory's functions for the Manager's Client
// (internal/advhook): registered in advisory's init, which runs before
// this package's variables are set.
var advFuncs = advhook.Get[*advisory.Client, advisory.Key, *advisory.Lock, *advisory.Options]()

// advisoryState is the Manager's share of session-level advisory locks:
// one advisory.Client, made on first use, that holds them on one session
// it opens from the Manager's pool and replaces after a loss. It is not
// part of the actor: the Client serialises its own work. The zero value
// is ready to use.
type advisoryState struct {
	opts *advisory.Options // read when the Client is made; nil = advisory defaults (set by tests only)

	mu     sync.Mutex
	closed bool             // Close began: no Client is made any more
	c      *advisory.Client // nil before first use
	done   func()           // waits for the Client's close; nil if there was no Client
}

// LockAdvisory takes the session-level advisory lock key, waiting as long
// as ctx allows, and returns it as an *advisory.Lock, the handle
// advisory.Session and advisory.Client return. When ctx ends first the
// error is CodeAborted: the server-side wait is cancelled, a grant that
// raced the cancel is released, and the other advisory locks of this
// Manager stay held. Waiting for another session is not FIFO (see
// advisory.Session.Lock).
//
// All advisory locks of a Manager are held through one advisory.Client,
// on one advisory.Session (a dedicated connection hijacked from the
// Manager's pool, with a probe) that it opens on first use, and again on
// the next call after that session is lost. Concurrent callers share one
// opening, bounded by Config.StatementTimeout and by Close but not by
// their contexts: a caller whose ctx ends first returns CodeAborted, and
// the opening goes on for the next. When the session is lost (connection
// cut, pg_terminate_backend, server restart) the server has already
// freed its locks: every held lock's Context ends with a cause
// matching pglease.ErrLockLost once the probe notices (within about
// ProbeInterval + ProbeTimeout, 2 s by default). No fence covers that
// window: see package advisory for when to prefer a lease or a
// transaction lock.
//
// Locks are not re-entrant: callers of one Manager exclude each other
// like any two holders, as for leases. LockAdvisory of a key held (or
// being taken) through this Manager waits for that caller's Release, or
// for the lock's loss, in FIFO order with the other callers of this
// Manager waiting for it, without I/O; when ctx ends during that wait the
// error is CodeAborted and says the key was held by this process. The key
// is handed on only once the holder's unlock has been answered (or its
// session has ended), so the shared session never stacks a key.
//
// These fail with no I/O: a nil context and an invalid (zero) key with
// CodeInvalidArgument; an ended context with CodeAborted; a closed
// Manager with CodeClosed. Close cancels the held advisory locks with a
// cause matching ErrClosed, fails waiting calls with ErrClosed and closes
// the session (pg_advisory_unlock_all, then the connection), bounded by
// Config.CloseTimeout, before Done is closed.
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
func (m *Manager) LockAdvisory(ctx context.Context, key advisory.Key, opts ...AcquireOption) (*advisory.Lock, error) {
	return m.lockAdvisory(ctx, "manager.LockAdvisory", key, true, opts)
}

// TryLockAdvisory makes one attempt to take key without waiting: ok is
// false (and err nil) when another session holds it, or when a caller of
// this Manager holds it or is taking it (without I/O: locks are not
// re-entrant). Errors as LockAdvisory; ctx bounds the attempt and the
// caller's wait for the session to open.
//
// # Telemetry of advisory locks
//
// Both calls record, through the Manager's Recorder (Config.Telemetry),
// what package telemetry documents with pglease.lock.kind=advisory, the
// key identified by the hash of its String form ("int64:42", "pair:1,2")
// like a lease key (the raw id only with telemetry.Config.RawKeys):
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
func (m *Manager) TryLockAdvisory(ctx context.Context, key advisory.Key, opts ...AcquireOption) (lock *advisory.Lock, ok bool, err error) {
	l, err := m.lockAdvisory(ctx, "manager.TryLockAdvisory", key, false, opts)
	return l, l != nil, err
}

// advisoryOpts reads the options of an advisory lock: only WithHoldLimit
// applies (advisory locks have no TTL, and wait as long as ctx allows).
func advisoryOpts(op string, opts []AcquireOption) (holdLimit time.Duration, err error) {
	var o acquireOpts
	for _, f := range opts {
		if f == nil {
			return 0, kernel.Invalid(op, "nil option")
		}
		if err := f(&o); err != nil {
			var e *pglease.Error
			if errors.As(err, &e) {
				return 0, pgerr.New(e.Code, op, e.Msg, nil)
			}
			return 0, kernel.Reop(op, err)
		}
	}
	if o.ttl != 0 || o.timeout != 0 || o.manual || o.shared || o.delay != 0 {
		return 0, kernel.Invalid(op, "only WithHoldLimit applies to advisory locks (no TTL; the context bounds the wait)")
	}
	return o.holdLimit, nil
}

func (m *Manager) lockAdvisory(ctx context.Context, op string, key advisory.Key, blocking bool, opts []AcquireOption) (*advisory.Lock, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if key == (advisory.Key{}) {
		return nil, kernel.Invalid(op, "invalid advisory key (build it with advisory.Int64, advisory.Pair or a derivation)")
	}
	holdLimit, err := advisoryOpts(op, opts)
	if err != nil {
		return nil, err
	}
	c, err := m.advisoryClient(op)
	if err != nil {
		// Closed: the acquire span records it, as the Client's own
		// refusal does.
		_, acq := m.k.Rec.StartAcquire(ctx, m.k.Rec.Key(key.String()), obs.AcquireInfo{Kind: obs.KindAdvisory, Try: !blocking})
		acq.Failed(err)
		return nil, err
	}
	return advFuncs.Acquire(ctx, c, key, advhook.Call{Op: op, Blocking: blocking, HoldLimit: holdLimit})
}

// advisoryClient returns the Manager's advisory.Client, making it on
// first use (no I/O).
func (m *Manager) advisoryClient(op string) (*advisory.Client, error) {
	a := &m.adv
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || m.k.IsClosing() {
		return nil, kernel.ClosedErr(op)
	}
	if a.c == nil {
		c, err := advFuncs.New(m.k.Pool, a.opts, advhook.Config{
			Recorder:    m.k.Rec,
			OpenTimeout: m.cfg.StatementTimeout,
			Closing:     m.k.Closing,
			ClosedCause: kernel.ClosedCause,
			ClosedMsg:   "manager closed",
			HeldHereMsg: heldHereMsg,
		})
		if err != nil {
			return nil, kernel.Reop(op, err) // only a test's bad advisory options
		}
		a.c = c
	}
	return a.c, nil
}

// beginClose starts closing the Manager's advisory.Client, if it has one:
// waiting calls fail with ErrClosed, every held advisory lock's Context
// is cancelled with ErrClosed, then the session is closed
// (pg_advisory_unlock_all and closing the connection, bounded by
// timeout). Called once, by run, after workCtx is cancelled; wait blocks
// until it has finished. The Manager's Recorder records a release for
// each lock whose end Close decided, with the session's close as their
// one pglease.advisory_unlock round trip.
func (a *advisoryState) beginClose(timeout time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.c != nil && a.done == nil {
		a.done = advFuncs.BeginClose(a.c, timeout)
	}
}

// wait blocks until the close started by beginClose has finished.
func (a *advisoryState) wait() {
	a.mu.Lock()
	done := a.done
	a.mu.Unlock()
	if done != nil {
		done()
	}
}
