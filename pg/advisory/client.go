package advisory

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/advhook"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
)

// Client takes session-level advisory locks from a pool through one
// Session that it opens on first use and replaces when it is lost, so
// that a program need not manage sessions: the locks it hands out are the
// same *Lock a Session hands out, with the same loss signal. The Manager's
// LockAdvisory and TryLockAdvisory use one Client per Manager.
//
// Locks are not re-entrant: callers of one Client exclude each other like
// two sessions do. Lock of a key held (or being taken) through this
// Client waits, without I/O, for that caller's Release or for the lock's
// loss, in FIFO order with the Client's other callers waiting for that
// key; TryLock answers ok=false. A key is handed on only once its
// holder's unlock has been answered (or its session has ended), so the
// shared session never stacks a key.
//
// When the session is lost (connection cut, pg_terminate_backend, server
// restart) the server has already freed its locks: every held Lock's
// Context ends with a cause matching pglease.ErrLockLost once the
// session's probe notices (within ProbeInterval + ProbeTimeout, 2 s by
// default; see "Loss notice"), and the next call opens a new session.
// Close ends the held locks with a cause matching pglease.ErrClosed and
// fails waiting calls with ErrClosed.
//
// A Client made by NewClient records no telemetry, like a Session; the
// Manager's records spans and metrics through its Config.Telemetry (see
// manager.Manager.TryLockAdvisory). A Client is safe for concurrent use.
// The pool is not closed by the Client.
type Client struct {
	pool      *pgxpool.Pool  // immutable
	opts      Options        // immutable: the sessions' options, HoldLimit 0
	holdLimit time.Duration  // immutable: Options.HoldLimit, applied per lock by take
	cfg       advhook.Config // immutable, defaults filled
	opening   singleflight.Group
	stop      context.Context    // immutable; cancelled when Close begins: an Open in flight gives up
	stopOpen  context.CancelFunc // immutable

	mu      sync.Mutex
	closed  bool                    // Close began: no new session, no new lock
	sess    *Session                // the current session; nil before first use and after loss
	keys    map[Key]*Lock           // held keys; a nil value is a key being taken
	queues  map[Key][]*clientWaiter // Lock callers waiting for a key in keys, FIFO
	stopped chan struct{}           // made by beginClose, closed when the close has finished
	opens   sync.WaitGroup          // Opens in flight; Add only under mu while !closed
	unlocks sync.WaitGroup          // unlock statements in flight (Release); Add only under mu while !closed
}

// clientWaiter is a Lock caller waiting for a key held (or being taken)
// by another caller of the same Client. ready is closed when the key is
// handed to it (granted: the key is reserved for it, as by reserve) or
// when Close begins (not granted).
type clientWaiter struct {
	ready   chan struct{}
	granted bool // guarded by Client.mu
	pos     int  // immutable: callers ahead of it when it came (telemetry)
}

// clientHold is what a Lock handed out by a Client has besides its key
// and context: the Session's own Lock under it, and the Client's part of
// its end (hand-on of the key, hold limit, telemetry).
type clientHold struct {
	c     *Client          // immutable
	inner *Lock            // immutable; the session's lock
	acq   *obs.Acquisition // immutable; the acquire that granted it

	// limitCause is the cause the hold limit cancels the Lock's context
	// with (nil without a limit): while that is its cause and inner is
	// live, the lock is still held. pastLimitEnd decides, for such a
	// lock, who records its end (Release or Close), as cancelling the
	// context first does otherwise.
	limitCause   error // immutable
	limitTimer   *time.Timer
	pastLimitEnd atomic.Bool

	releaseOnce sync.Once
}

// errHeldHere tells acquire that a TryLock found its key held or being
// taken through this Client: ok=false, like a key held by another
// session. Never returned to callers.
var errHeldHere = errors.New("advisory key held through this Client")

// maxSessions bounds how many sessions one call opens when the session
// it used turns out to have been lost.
const maxSessions = 3

// defaultOpenTimeout bounds the opening of a Client's session when
// nothing else does (the Manager uses its StatementTimeout, also 5 s by
// default).
const defaultOpenTimeout = 5 * time.Second

func init() {
	advhook.Register(advhook.Funcs[*Client, Key, *Lock, *Options]{
		New: newClient,
		Acquire: func(ctx context.Context, c *Client, k Key, call advhook.Call) (*Lock, error) {
			return c.acquire(ctx, call.Op, k, call.Blocking, call.HoldLimit)
		},
		BeginClose: func(c *Client, timeout time.Duration) func() {
			c.beginClose(context.Background(), timeout)
			return c.wait
		},
		SessionPID: func(c *Client) int32 {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.sess == nil {
				return 0
			}
			return c.sess.BackendPID()
		},
		Waiters: func(c *Client, k Key) int {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.queues[k])
		},
	})
}

// NewClient returns a Client that opens its session from pool with opts
// (nil: the defaults) on its first Lock or TryLock. It does no I/O; bad
// options are InvalidArgument, as at Open. Options.HoldLimit applies to
// each lock from the grant, as on a Session. Options.Reentrant is
// InvalidArgument: a Client's locks are not re-entrant (see Client).
// Opening the session is bounded by 5 s and by Close, whatever the
// callers' contexts; each caller waits for it as long as its own context
// allows.
func NewClient(pool *pgxpool.Pool, opts *Options) (*Client, error) {
	return newClient(pool, opts, advhook.Config{})
}

func newClient(pool *pgxpool.Pool, opts *Options, cfg advhook.Config) (*Client, error) {
	const op = "advisory.NewClient"
	if pool == nil {
		return nil, invalid(op, "nil pool")
	}
	if opts != nil && opts.Reentrant {
		return nil, invalid(op, "Options.Reentrant does not apply to a Client: its locks are not re-entrant")
	}
	o, err := opts.resolve(op)
	if err != nil {
		return nil, err
	}
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = defaultOpenTimeout
	}
	if cfg.ClosedCause == nil {
		cfg.ClosedCause = pgerr.New(pglease.CodeClosed, "advisory.Client.Close", "client closed", nil)
	}
	if cfg.ClosedMsg == "" {
		cfg.ClosedMsg = "client closed"
	}
	if cfg.HeldHereMsg == "" {
		cfg.HeldHereMsg = "the key was held through this Client (another of its callers; locks are not re-entrant)"
	}
	c := &Client{pool: pool, opts: o, holdLimit: o.HoldLimit, cfg: cfg}
	// The Client applies the hold limit to its own handle (take): the
	// session's lock under it must not end at the limit, or the Client
	// would hand a still-held key to its next caller.
	c.opts.HoldLimit = 0
	c.stop, c.stopOpen = context.WithCancel(context.Background())
	return c, nil
}

// Lock takes k, waiting as long as ctx allows, and returns it. When ctx
// ends first the error is CodeAborted: the server-side wait is cancelled,
// a grant that raced the cancel is released, and the Client's other locks
// stay held. Waiting for another session is not FIFO (see Session.Lock);
// waiting for another caller of this Client is (see Client).
//
// These fail with no I/O: a nil context and an invalid (zero) key with
// CodeInvalidArgument, an ended context with CodeAborted, a closed Client
// with CodeClosed.
//
// Lock first makes one pg_try_advisory_lock attempt and waits
// (pg_advisory_lock) only when that finds the key held, so an
// uncontended call costs one statement.
func (c *Client) Lock(ctx context.Context, k Key) (*Lock, error) {
	return c.acquire(ctx, "advisory.Client.Lock", k, true, c.limit())
}

// TryLock makes one attempt to take k without waiting: ok is false (and
// err nil) when another session holds it, or when a caller of this Client
// holds it or is taking it (without I/O). Errors as Lock; ctx bounds the
// attempt and the caller's wait for the session to open.
func (c *Client) TryLock(ctx context.Context, k Key) (l *Lock, ok bool, err error) {
	l, err = c.acquire(ctx, "advisory.Client.TryLock", k, false, c.limit())
	return l, l != nil, err
}

// limit is the hold limit of the Client's own calls (0 on a nil Client,
// which acquire refuses).
func (c *Client) limit() time.Duration {
	if c == nil {
		return 0
	}
	return c.holdLimit
}

func (c *Client) closedErr(op string) error {
	return pgerr.New(pglease.CodeClosed, op, c.cfg.ClosedMsg, nil)
}

func (c *Client) isClosing() bool {
	if c.cfg.Closing == nil {
		return false
	}
	select {
	case <-c.cfg.Closing:
		return true
	default:
		return false
	}
}

// reop gives a *pglease.Error (from this package, pg or pglease) the
// caller's op; any other error, which none of them returns, becomes
// CodeInternal: every error of a Client is a *pglease.Error.
func reop(op string, err error) error {
	var e *pglease.Error
	if errors.As(err, &e) {
		return pgerr.New(e.Code, op, e.Msg, e.Err)
	}
	return pgerr.New(pglease.CodeInternal, op, "unexpected error", err)
}

// acquire checks its arguments, records the acquire span and takes k.
// A nil lock with a nil error is a TryLock that found k held.
func (c *Client) acquire(ctx context.Context, op string, k Key, blocking bool, holdLimit time.Duration) (*Lock, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if c == nil || c.pool == nil {
		return nil, invalid(op, "nil or zero Client (use NewClient)")
	}
	if !k.valid() {
		return nil, invalid(op, "invalid advisory key (build it with advisory.Int64, advisory.Pair or a derivation)")
	}
	rec := c.cfg.Recorder
	ctx, acq := rec.StartAcquire(ctx, rec.Key(k.String()), obs.AcquireInfo{
		Kind: obs.KindAdvisory, Try: !blocking,
	})
	l, err := c.take(ctx, op, k, blocking, holdLimit, acq)
	switch {
	case l != nil: // install recorded the grant
	case err == nil:
		acq.NotAcquired()
	default:
		acq.Failed(err)
	}
	return l, err
}

// take is acquire after the argument checks; acq is the call's
// acquisition (its grant is recorded by install).
func (c *Client) take(ctx context.Context, op string, k Key, blocking bool, holdLimit time.Duration, acq *obs.Acquisition) (*Lock, error) {
	w, err := c.reserve(op, k, blocking)
	switch {
	case err == errHeldHere:
		return nil, nil // TryLock: held through this Client
	case err != nil:
		return nil, err
	case w != nil:
		acq.Queued(obs.QueueInfo{HeldLocally: true, Coalesced: w.pos > 0, Position: w.pos})
		if err := c.await(ctx, op, k, w); err != nil {
			return nil, err
		}
	}
	granted := false
	defer func() {
		if !granted {
			c.unreserve(k)
		}
	}()
	for tries := 1; ; tries++ {
		s, err := c.session(ctx, op)
		if err != nil {
			return nil, err
		}
		il, err := c.roundTrip(ctx, s, k, false, acq)
		if err == nil && il == nil && blocking {
			il, err = c.roundTrip(ctx, s, k, true, acq)
		}
		if err != nil {
			if c.isClosing() || c.isClosed() {
				return nil, c.closedErr(op)
			}
			if s.Err() != nil && ctx.Err() == nil && tries < maxSessions {
				// The session was lost before or during the attempt; no
				// lock is held on it. Try again on a new one.
				c.drop(s)
				continue
			}
			return nil, reop(op, err)
		}
		if il == nil {
			return nil, nil // TryLock: held by another session
		}
		l, err := c.hand(op, k, il, holdLimit, acq)
		granted = err == nil
		return l, err
	}
}

// hand wraps the session's lock il in the Client's handle, arms its hold
// limit, installs it (recording the grant) and makes its context follow
// il's. Once Close has begun, il is left to Close's Session.Close and
// the answer is Closed.
func (c *Client) hand(op string, k Key, il *Lock, holdLimit time.Duration, acq *obs.Acquisition) (*Lock, error) {
	h := &clientHold{c: c, inner: il, acq: acq}
	l := &Lock{key: k, via: h}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	if holdLimit > 0 {
		h.limitCause = pgerr.New(pglease.CodeHoldLimitExceeded, "advisory.Lock",
			"the lock reached its hold limit ("+holdLimit.String()+"); stop and release it (it is still held)", nil)
		h.limitTimer = time.AfterFunc(holdLimit, func() { l.cancel(h.limitCause) })
	}
	if !c.install(l) {
		// Close began after the grant; its Session.Close releases it.
		if h.limitTimer != nil {
			h.limitTimer.Stop()
		}
		l.cancel(c.cfg.ClosedCause)
		return nil, c.closedErr(op)
	}
	// l's context follows il's: the session reports a loss by cancelling
	// il's context with a LockLost cause. The loss is recorded before l's
	// context ends, so whoever watches l.Done() finds it in telemetry.
	// il's context always ends (Release, loss, or the session's Close),
	// so this never outlives the session; after Release or Close, l's
	// context has ended already and keeps its own cause.
	context.AfterFunc(il.Context(), func() {
		if h.limitTimer != nil {
			h.limitTimer.Stop()
		}
		cause := context.Cause(il.Context())
		if errors.Is(cause, pglease.ErrLockLost) {
			acq.Lost(obs.LossSessionEnded, trace.SpanContext{})
			c.forget(l) // the server freed it with the session: hand it on
		}
		l.cancel(cause)
	})
	return l, nil
}

// roundTrip makes one call to the session, TryLock or (blocking) Lock,
// as a pglease.advisory_try_lock or pglease.advisory_lock client span
// under acq's span, and records it as an attempt of acq. A nil lock with
// a nil error is a TryLock that found the key held.
func (c *Client) roundTrip(ctx context.Context, s *Session, k Key, blocking bool, acq *obs.Acquisition) (*Lock, error) {
	op := obs.OpAdvisoryTryLock
	if blocking {
		op = obs.OpAdvisoryLock
	}
	dctx, db := c.cfg.Recorder.StartDB(ctx, op, 1, acq.SpanContext())
	var il *Lock
	var err error
	if blocking {
		il, err = s.Lock(dctx, k)
	} else {
		il, _, err = s.TryLock(dctx, k)
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

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// reserve marks k as being taken, unless a caller of this Client holds it
// or is taking it: then a blocking caller gets a place in the key's queue
// (wait for it with await) and a TryLock errHeldHere. No I/O.
func (c *Client) reserve(op string, k Key, blocking bool) (*clientWaiter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.isClosing() {
		return nil, c.closedErr(op)
	}
	if c.heldLocked(k) {
		if !blocking {
			return nil, errHeldHere
		}
		w := &clientWaiter{ready: make(chan struct{}), pos: len(c.queues[k])}
		if c.queues == nil {
			c.queues = map[Key][]*clientWaiter{}
		}
		c.queues[k] = append(c.queues[k], w)
		return w, nil
	}
	if c.keys == nil {
		c.keys = map[Key]*Lock{}
	}
	c.keys[k] = nil
	return nil, nil
}

// heldLocked reports whether a caller of this Client holds k or is taking
// it (or it is reserved for a waiter). A lock lost with its session no
// longer holds its key, even before its Release: it is handed on here if
// the loss's own hand-on has not run yet. c.mu is held.
func (c *Client) heldLocked(k Key) bool {
	l, ok := c.keys[k]
	if ok && l != nil && l.via.inner.Context().Err() != nil {
		c.freeLocked(k)
		_, ok = c.keys[k]
	}
	return ok
}

// freeLocked frees k: it is handed to the first waiter in its queue
// (reserved for it), or forgotten when nobody waits. c.mu is held.
func (c *Client) freeLocked(k Key) {
	q := c.queues[k]
	if len(q) == 0 {
		delete(c.keys, k)
		return
	}
	w := q[0]
	q[0] = nil
	if len(q) == 1 {
		delete(c.queues, k)
	} else {
		c.queues[k] = q[1:]
	}
	c.keys[k] = nil
	w.granted = true
	close(w.ready)
}

// await waits until k is handed to w (nil: it is reserved for the caller
// now, as by reserve), ctx ends, or Close begins.
func (c *Client) await(ctx context.Context, op string, k Key, w *clientWaiter) error {
	select {
	case <-w.ready:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case w.granted:
		return nil // the caller's deferred unreserve hands it on if it fails
	case c.closed:
		return c.closedErr(op)
	}
	q := c.queues[k]
	if i := slices.Index(q, w); i >= 0 {
		q = slices.Delete(q, i, i+1)
		if len(q) == 0 {
			delete(c.queues, k)
		} else {
			c.queues[k] = q
		}
	}
	return pgerr.New(pglease.CodeAborted, op, "context ended while waiting for the advisory lock: "+c.cfg.HeldHereMsg, ctx.Err())
}

func (c *Client) unreserve(k Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.keys[k]; ok && l == nil {
		c.freeLocked(k)
	}
}

// install records a granted lock, and its grant in telemetry; false once
// Close has begun. The grant is recorded under mu, before the lock is
// visible to beginClose, so that Granted precedes any release or loss of
// the lock (the order obs.Acquisition requires), and a lock refused here
// is recorded as closed, not granted.
func (c *Client) install(l *Lock) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	l.via.acq.Granted(0) // advisory locks have no fence
	c.keys[l.key] = l
	return true
}

// forget removes l's entry, if the entry is still l, handing its key to
// the first caller of this Client waiting for it. Called once the key is
// no longer held on the session: after l's unlock was answered, or when
// l was lost with its session.
func (c *Client) forget(l *Lock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys[l.key] == l {
		c.freeLocked(l.key)
	}
}

// drop retires s if it is still the current session, and closes it (it
// has ended already, so this only reaps it).
func (c *Client) drop(s *Session) {
	c.mu.Lock()
	if c.sess == s {
		c.sess = nil
		for k, l := range c.keys {
			if l != nil && l.via.inner.Context().Err() != nil {
				c.freeLocked(k) // lost with the session
			}
		}
	}
	c.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = s.Close(cctx)
	cancel()
}

// session returns the open session, opening one if there is none or the
// current one was lost. Concurrent callers share one Open (singleflight),
// which runs detached from their contexts, bounded by the open timeout
// and by Close; each caller waits for it as long as its ctx allows.
func (c *Client) session(ctx context.Context, op string) (*Session, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, c.closedErr(op)
		}
		if s := c.sess; s != nil {
			if s.Err() == nil {
				c.mu.Unlock()
				return s, nil
			}
			c.mu.Unlock()
			c.drop(s)
			continue
		}
		c.mu.Unlock()
		ch := c.opening.DoChan("", func() (any, error) { return nil, c.open(ctx) })
		select {
		case r := <-ch:
			if r.Err != nil {
				return nil, reop(op, r.Err)
			}
			// Installed as c.sess (or Close began): look again.
		case <-ctx.Done():
			return nil, pgerr.New(pglease.CodeAborted, op, "context ended while the advisory session was being opened", ctx.Err())
		}
	}
}

// open opens a session and makes it the current one. It runs under ctx's
// values but not its cancellation (callers share it), bounded by the open
// timeout and by Close.
func (c *Client) open(ctx context.Context) error {
	const op = "advisory.Client"
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.closedErr(op)
	}
	c.opens.Add(1)
	c.mu.Unlock()
	defer c.opens.Done()
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.OpenTimeout)
	defer cancel()
	defer context.AfterFunc(c.stop, cancel)()
	s, err := Open(octx, c.pool, &c.opts)
	if err != nil {
		if c.stop.Err() != nil {
			return c.closedErr(op)
		}
		return err
	}
	c.mu.Lock()
	c.sess = s // even if closed: Close waits for the open, then closes it
	c.mu.Unlock()
	return nil
}

// release is Lock.Release for a Client's lock: it cancels the lock's
// context and starts the unlock statement (tracked, so Close waits for
// it). See Lock.Release for the answers.
func (h *clientHold) release(ctx context.Context, l *Lock) error {
	const op = "advisory.Lock.Release"
	var res chan error
	h.releaseOnce.Do(func() { res = h.startUnlock(ctx, l, op) })
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

// heldPastLimit reports whether l's Context ended at its hold limit while
// the lock is still held.
func (h *clientHold) heldPastLimit(l *Lock) bool {
	return h.limitCause != nil && context.Cause(l.ctx) == h.limitCause && h.inner.Context().Err() == nil
}

// startUnlock cancels l's context and starts the unlock statement. The
// answer arrives on the returned channel (capacity 1).
//
// Telemetry: whoever cancels l.ctx first owns the end of the lock's
// telemetry. If Release does (cause ErrReleased), it records the
// pglease.release span, a child of ctx linked to the lock's acquire span,
// with the pglease.advisory_unlock round trip as its child (or, when
// Close has begun and releases the lock with the session, a release span
// with no round trip of its own). A lock that was lost (Lost, recorded
// when the session ended) or closed (beginClose) gets no release span
// here.
func (h *clientHold) startUnlock(ctx context.Context, l *Lock, op string) chan error {
	c := h.c
	res := make(chan error, 1)
	if ic := h.inner.Context(); ic.Err() != nil {
		l.cancel(context.Cause(ic)) // ended; the AfterFunc of take may not have run yet
	}
	l.cancel(releasedCause) // the first cause wins: a lost or closed lock keeps its own
	if cause := context.Cause(l.ctx); cause != releasedCause {
		// Past its hold limit the lock is still held: release it, unless
		// Close has already taken it over.
		if !h.heldPastLimit(l) || !h.pastLimitEnd.CompareAndSwap(false, true) {
			if cause == h.limitCause {
				cause = context.Cause(h.inner.Context()) // lost or closed after the limit
			}
			c.forget(l)
			res <- endedAnswer(op, cause)
			return res
		}
	}
	if h.limitTimer != nil {
		h.limitTimer.Stop()
	}
	rctx, rel := h.acq.StartRelease(ctx)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		rel.End(nil) // Close releases it with the session
		res <- nil
		return res
	}
	c.unlocks.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.unlocks.Done()
		// Not the caller's context: a deferred Release with an ended
		// context must still release. The wait for the connection ends
		// when the session ends; the statement is bounded by the
		// session's ProbeTimeout.
		dctx, db := c.cfg.Recorder.StartDB(context.WithoutCancel(rctx), obs.OpAdvisoryUnlock, 1, trace.SpanContext{})
		err := h.inner.Release(dctx)
		released := 0
		if err == nil && errors.Is(context.Cause(h.inner.Context()), pglease.ErrReleased) {
			released = 1 // not when the session's Close released it
		}
		db.End(released, err)
		rel.Served(db.SpanContext())
		if err != nil {
			err = reop(op, err)
		}
		c.forget(l)
		rel.End(err)
		res <- err
	}()
	return res
}

// endedAnswer is what Release returns for a Client's lock that had ended
// before it.
func endedAnswer(op string, cause error) error {
	if errors.Is(cause, pglease.ErrLockLost) {
		return pgerr.New(pglease.CodeLockLost, op, "the advisory lock had been lost before it was released", cause)
	}
	return nil // closed: Close released it
}

// Close ends the Client: calls waiting for a key held through it fail
// with ErrClosed, an opening session gives up, every held Lock's Context
// ends with a cause matching pglease.ErrClosed, and the session is closed
// (Session.Close: pg_advisory_unlock_all, then the connection; ctx bounds
// it as there). Later calls fail with ErrClosed. Close returns when all
// of that, and every unlock in flight, has finished. It is idempotent; it
// returns an error only for a nil ctx.
func (c *Client) Close(ctx context.Context) error {
	const op = "advisory.Client.Close"
	if ctx == nil {
		return invalid(op, "nil context")
	}
	if c == nil || c.pool == nil {
		return invalid(op, "nil or zero Client (use NewClient)")
	}
	c.beginClose(ctx, 0)
	c.wait()
	return nil
}

// beginClose refuses new work and starts closing the session (see
// Close), bounded by ctx and, if positive, timeout; a second call does
// nothing. wait blocks until it has finished. The Recorder records a
// release for each lock whose end Close decided (see startUnlock), with
// the session's close as their one pglease.advisory_unlock round trip.
func (c *Client) beginClose(ctx context.Context, timeout time.Duration) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	stopped := make(chan struct{})
	c.stopped = stopped
	for k, q := range c.queues {
		for _, w := range q {
			close(w.ready) // not granted: await answers ErrClosed
		}
		delete(c.queues, k)
	}
	c.mu.Unlock()
	c.stopOpen() // an Open in flight gives up
	go func() {
		defer close(stopped)
		c.opens.Wait()
		c.mu.Lock()
		s := c.sess
		c.sess = nil
		var held []*Lock
		for _, l := range c.keys {
			if l != nil {
				held = append(held, l)
			}
		}
		c.mu.Unlock()
		rels, relSC := c.endHeld(held)
		if s != nil {
			var db obs.DBSpan
			if len(rels) > 0 {
				parent := trace.SpanContext{} // a round trip serving several releases is a root span
				if len(rels) == 1 {
					parent = relSC
				}
				_, db = c.cfg.Recorder.StartDB(context.Background(), obs.OpAdvisoryUnlock, len(rels), parent)
			}
			cctx, cancel := ctx, context.CancelFunc(func() {})
			if timeout > 0 {
				cctx, cancel = context.WithTimeout(ctx, timeout)
			}
			err := s.Close(cctx)
			cancel()
			db.End(len(rels), err)
			for _, rel := range rels {
				rel.Served(db.SpanContext())
			}
		}
		for _, rel := range rels {
			rel.End(nil)
		}
		c.unlocks.Wait()
	}()
}

// endHeld ends the held locks' contexts with the closed cause, and
// starts a release (telemetry) for each whose end Close decided: not
// released or lost before, or past its hold limit and not taken over by
// its Release. relSC is the span context of the last of them.
func (c *Client) endHeld(held []*Lock) (rels []obs.Release, relSC trace.SpanContext) {
	for _, l := range held {
		h := l.via
		if ic := h.inner.Context(); ic.Err() != nil {
			l.cancel(context.Cause(ic)) // lost, and Lost recorded or about to be
		}
		pastLimit := h.heldPastLimit(l) && h.pastLimitEnd.CompareAndSwap(false, true)
		l.cancel(c.cfg.ClosedCause)
		if h.limitTimer != nil {
			h.limitTimer.Stop()
		}
		if context.Cause(l.ctx) == c.cfg.ClosedCause || pastLimit {
			rctx, rel := h.acq.StartRelease(context.Background())
			rels = append(rels, rel)
			relSC = trace.SpanContextFromContext(rctx)
		}
	}
	return rels, relSC
}

// wait blocks until the close started by beginClose has finished.
func (c *Client) wait() {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}
