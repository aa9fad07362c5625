package manager

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pglease/pglease"
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
	stopped chan struct{}                  // made by beginClose, closed when the close has finished
	unlocks sync.WaitGroup                 // Unlock statements in flight; Add only under mu while !closed
}

// AdvisoryLock is a session-level PostgreSQL advisory lock held through a
// Manager (LockAdvisory, TryLockAdvisory). It has no fencing token and no
// TTL: the server holds it until Unlock, until the Manager is closed, or
// until the session's connection dies. See the package documentation,
// section "Advisory locks". An AdvisoryLock is safe for concurrent use.
type AdvisoryLock struct {
	m      *Manager                // immutable
	key    advisory.Key            // immutable
	inner  *advisory.Lock          // immutable
	ctx    context.Context         // immutable; a child of inner's context
	cancel context.CancelCauseFunc // called by Unlock and by Close

	unlockOnce sync.Once
}

// Key returns the lock's advisory key.
func (l *AdvisoryLock) Key() advisory.Key { return l.key }

// Context returns a context that is cancelled when the lock stops being
// held. context.Cause then tells why: an error matching
// pglease.ErrLockLost (the session's connection died, was terminated, or
// the server no longer had the lock; reported within the session's probe
// window, see package advisory), pglease.ErrClosed (the Manager was
// closed), or ErrReleased (Unlock).
func (l *AdvisoryLock) Context() context.Context { return l.ctx }

// Done is Context().Done().
func (l *AdvisoryLock) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lock is held, and then the cause of its end
// (see Context).
func (l *AdvisoryLock) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Unlock releases the lock in PostgreSQL and returns once the server
// answered. It returns nil if the lock was held until now (or until
// Close released it), an error matching pglease.ErrLockLost if it had
// been lost before, and another error if the unlock failed (the session
// then usually ends, which frees the lock on the server). The lock's
// Context is cancelled with cause ErrReleased at once. Unlocking twice is
// a no-op. If ctx has ended or ends first, Unlock returns CodeAborted
// while the unlock goes on in the background (even with an already-ended
// ctx, so a deferred Unlock never leaves the key held).
func (l *AdvisoryLock) Unlock(ctx context.Context) error {
	const op = "manager.AdvisoryLock.Unlock"
	if ctx == nil {
		return invalid(op, "nil context")
	}
	if l == nil || l.m == nil || l.inner == nil {
		return invalid(op, "nil or zero AdvisoryLock")
	}
	var res chan error
	l.unlockOnce.Do(func() { res = l.startUnlock(op) })
	if res == nil {
		return nil // a second Unlock
	}
	if err := ctx.Err(); err != nil {
		return pglease.NewError(pglease.CodeAborted, op, "context ended; the lock is being released in the background", err)
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return pglease.NewError(pglease.CodeAborted, op, "context ended before the unlock was confirmed", ctx.Err())
	}
}

// startUnlock cancels the lock's context and starts the unlock statement
// (tracked, so Close waits for it). The answer arrives on the returned
// channel (capacity 1).
func (l *AdvisoryLock) startUnlock(op string) chan error {
	res := make(chan error, 1)
	l.cancel(ErrReleased) // the first cause wins: a lost or closed lock keeps its own
	if c := context.Cause(l.ctx); c != ErrReleased {
		l.m.adv.forget(l)
		res <- endedAnswer(op, c)
		return res
	}
	a := &l.m.adv
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		res <- nil // Close releases it
		return res
	}
	a.unlocks.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.unlocks.Done()
		// Not the caller's context: a deferred Unlock with an ended
		// context must still release. The wait for the connection ends
		// when the session ends; the statement is bounded by the
		// session's ProbeTimeout.
		ok, err := l.inner.Unlock(context.Background())
		switch {
		case err != nil:
			err = reop(op, err)
		case !ok:
			err = endedAnswer(op, context.Cause(l.inner.Context()))
		}
		a.forget(l)
		res <- err
	}()
	return res
}

// endedAnswer is what Unlock returns for a lock that had ended before it.
func endedAnswer(op string, cause error) error {
	if errors.Is(cause, pglease.ErrLockLost) {
		return pglease.NewError(pglease.CodeLockLost, op, "the advisory lock had been lost before it was unlocked", cause)
	}
	return nil // closed: Close released it
}

// reop gives a *pglease.Error from package advisory the Manager's op.
func reop(op string, err error) error {
	var e *pglease.Error
	if errors.As(err, &e) {
		return pglease.NewError(e.Code, op, e.Msg, e.Err)
	}
	return err
}

// LockAdvisory takes the session-level advisory lock key, waiting as long
// as ctx allows, and returns it. When ctx ends first the error is
// CodeAborted: the server-side wait is cancelled, a grant that raced the
// cancel is released, and the other advisory locks of this Manager stay
// held. Waiting is not FIFO (see advisory.Session.Lock).
//
// All advisory locks of a Manager share one advisory.Session (a dedicated
// connection hijacked from the pool, with a probe), opened on first use;
// after that session is lost, the next call opens a new one. These fail
// with no I/O: a nil context, an invalid (zero) key, and a key already
// held or being taken through this Manager (advisory locks are not
// re-entrant and do not queue) with CodeInvalidArgument; an ended context
// with CodeAborted; a closed Manager with CodeClosed.
//
// Advisory keys and lease keys are separate namespaces: an advisory lock
// never conflicts with a lease lock of the same name.
func (m *Manager) LockAdvisory(ctx context.Context, key advisory.Key) (*AdvisoryLock, error) {
	return m.lockAdvisory(ctx, "manager.LockAdvisory", key, true)
}

// TryLockAdvisory makes one attempt to take key without waiting: ok is
// false (and err nil) when another session holds it. Errors as
// LockAdvisory; ctx bounds the attempt (and the opening of the session).
func (m *Manager) TryLockAdvisory(ctx context.Context, key advisory.Key) (lock *AdvisoryLock, ok bool, err error) {
	l, err := m.lockAdvisory(ctx, "manager.TryLockAdvisory", key, false)
	return l, l != nil, err
}

// maxAdvisorySessions bounds how many sessions one call opens when the
// session it used turns out to have been lost.
const maxAdvisorySessions = 3

func (m *Manager) lockAdvisory(ctx context.Context, op string, key advisory.Key, blocking bool) (*AdvisoryLock, error) {
	if err := pglease.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if !key.Valid() {
		return nil, invalid(op, "invalid advisory key (build it with advisory.Int64, advisory.Pair or a derivation)")
	}
	a := &m.adv
	if err := a.reserve(op, key, m.isClosing()); err != nil {
		return nil, err
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
		var il *advisory.Lock
		if blocking {
			il, err = s.Lock(ctx, key)
		} else {
			il, _, err = s.TryLock(ctx, key)
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
		l := &AdvisoryLock{m: m, key: key, inner: il}
		l.ctx, l.cancel = context.WithCancelCause(il.Context())
		if !a.install(l) {
			// Close began after the grant; its Session.Close releases it.
			l.cancel(closedCause)
			return nil, closedErr(op)
		}
		granted = true
		return l, nil
	}
}

func (a *advisoryState) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// reserve marks key as being taken, refusing a key held or being taken
// through this Manager. No I/O.
func (a *advisoryState) reserve(op string, key advisory.Key, closing bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if closing || a.closed {
		return closedErr(op)
	}
	if l, ok := a.keys[key]; ok && (l == nil || l.inner.Context().Err() == nil) {
		return invalid(op, "advisory key already held or being taken through this Manager (advisory locks are not re-entrant)")
	}
	if a.keys == nil {
		a.keys = map[advisory.Key]*AdvisoryLock{}
	}
	a.keys[key] = nil
	return nil
}

func (a *advisoryState) unreserve(key advisory.Key) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.keys[key]; ok && l == nil {
		delete(a.keys, key)
	}
}

// install records a granted lock; false once Close has begun.
func (a *advisoryState) install(l *AdvisoryLock) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.keys[l.key] = l
	return true
}

// forget removes l's entry, if the entry is still l.
func (a *advisoryState) forget(l *AdvisoryLock) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keys[l.key] == l {
		delete(a.keys, l.key)
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
				delete(a.keys, k) // lost with the session
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
				return nil, pglease.NewError(pglease.CodeAborted, op, "context ended while the advisory session was being opened", ctx.Err())
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
// wait blocks until it has finished.
func (a *advisoryState) beginClose(timeout time.Duration) {
	a.mu.Lock()
	a.closed = true
	stopped := make(chan struct{})
	a.stopped = stopped
	opening := a.opening
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
		for _, l := range held {
			l.cancel(closedCause)
		}
		if s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			_ = s.Close(ctx)
			cancel()
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
