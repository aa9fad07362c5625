package advisory

import (
	"context"
	"errors"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Lock is one session-level advisory lock, held by a Session (exclusive:
// Lock, TryLock, LockAll; shared: LockShared, TryLockShared) or through a
// Client (Lock, TryLock; also what the Manager's LockAdvisory and
// TryLockAdvisory return): a pglease.Handle with no fencing token and no
// TTL. Its Context is cancelled when the lock ends, and Err (or
// context.Cause) tells why: an error matching pglease.ErrReleased after
// Release, pglease.ErrLockLost when the session's connection died or the
// server no longer held the lock, and pglease.ErrClosed when the Session,
// the Client or the Manager was closed. With a hold limit
// (Options.HoldLimit, manager.WithHoldLimit) it is also cancelled, with a
// cause matching pglease.ErrHoldLimitExceeded, when the limit passes
// while the lock is still held (it stays held until Release). A Lock is
// safe for concurrent use. Every method is safe on a nil *Lock (what
// TryLock returns with ok=false): Release and Err return an error
// matching pglease.ErrInvalidArgument, Context and Done an ended context,
// Key the zero Key.
type Lock struct {
	s      *Session    // immutable; nil for a Client's lock
	via    *clientHold // immutable; non-nil for a Client's lock (client.go)
	key    Key         // immutable
	shared bool        // immutable: taken with LockShared or TryLockShared
	ctx    context.Context
	cancel context.CancelCauseFunc
	ended  bool        // guarded by s.mu
	limit  *time.Timer // guarded by s.mu; the hold limit's timer, nil without one
}

var _ pglease.Handle = (*Lock)(nil)

// releasedCause is the cause of a Lock's Context after Release.
var releasedCause = pgerr.New(pglease.CodeReleased, "advisory.Lock.Release", "lock released", nil)

// errNilLock is what the methods of a nil *Lock answer.
var errNilLock = invalid("advisory.Lock", "nil Lock (TryLock returns a nil Lock when ok is false)")

var nilLockCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errNilLock)
	return ctx
}()

// Key returns the lock's key (the zero Key for a nil Lock).
func (l *Lock) Key() Key {
	if l == nil {
		return Key{}
	}
	return l.key
}

// Context returns a context that ends when the lock ends; see Lock for
// the causes (context.Cause, Err).
func (l *Lock) Context() context.Context {
	if l == nil || l.ctx == nil {
		return nilLockCtx
	}
	return l.ctx
}

// Done is Context().Done().
func (l *Lock) Done() <-chan struct{} { return l.Context().Done() }

// Err returns nil while the lock is held, and then why it ended (see
// Lock): always a *pglease.Error.
func (l *Lock) Err() error {
	if l == nil || l.ctx == nil {
		return errNilLock
	}
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Release releases the lock (pg_advisory_unlock, or
// pg_advisory_unlock_shared for a shared lock) and returns once the
// server answered. It returns nil when the server released it, and also
// when the lock had already been released or the Session closed (Close
// released it). It returns an error matching pglease.ErrLockLost when the
// lock had been lost before, and also when the server says it did not
// hold the lock (the unlock returned false): the session's view
// of the server is then wrong, so the session ends as lost and every
// lock it held reports LockLost. The lock's Context is cancelled with a
// cause matching pglease.ErrReleased once the server released it.
//
// Release waits for its turn on the session's connection as long as ctx
// allows; once sent, the statement is not cancelled by ctx (it is bounded
// by ProbeTimeout). If ctx has ended or ends before the connection is
// free, Release returns CodeAborted and the unlock goes on in the
// background, so a deferred Release never leaves the key held.
//
// A Client's lock answers the same, except that its Release returns
// CodeAborted whenever ctx ends before the unlock is answered (the unlock
// goes on in the background); its key goes to the Client's next caller
// waiting for it once the unlock is answered. Past its hold limit a lock
// is still held, and Release releases it.
func (l *Lock) Release(ctx context.Context) error {
	const op = "advisory.Lock.Release"
	if l == nil || (l.s == nil && l.via == nil) {
		return errNilLock
	}
	if ctx == nil {
		return invalid(op, "nil context")
	}
	if l.via != nil {
		return l.via.release(ctx, l)
	}
	s := l.s
	if !s.live(l) {
		return l.endedAnswer(ctx, op)
	}
	if err := ctx.Err(); err != nil {
		go func() { _ = l.release(context.Background(), op) }()
		return pgerr.New(pglease.CodeAborted, op, "context ended; the lock is being released in the background", err)
	}
	return l.release(ctx, op)
}

// release waits for the connection (as long as ctx allows, then goes on
// in the background) and unlocks.
func (l *Lock) release(ctx context.Context, op string) error {
	s := l.s
	if err := s.own(ctx, op); err != nil {
		if pglease.CodeOf(err) == pglease.CodeClosed {
			return l.endedAnswer(context.Background(), op) // closed or lost meanwhile
		}
		go func() { _ = l.release(context.Background(), op) }()
		return pgerr.New(pglease.CodeAborted, op, "context ended before the connection was free; the lock is being released in the background", err)
	}
	defer func() { <-s.sem }()
	if !s.live(l) {
		return l.endedAnswer(ctx, op)
	}
	released, err := s.unlockRaw(op, l.key, l.shared)
	if err != nil {
		return err
	}
	if !released {
		s.fail(errors.New("pg_advisory_unlock (or _shared) returned false: the server no longer held a lock this session took"))
		return l.endedAnswer(ctx, op)
	}
	s.mu.Lock()
	l.endLocked()
	delete(s.locks, l)
	if h := s.held[l.key]; h.n > 1 {
		s.held[l.key] = holding{n: h.n - 1, shared: h.shared}
	} else {
		delete(s.held, l.key)
	}
	s.mu.Unlock()
	l.cancel(releasedCause)
	return nil
}

// endedAnswer is Release's answer for a lock that is no longer live:
// nil, unless it was lost. The session marks a lock ended before it
// cancels its context, so this waits (bounded by ctx) for the cause.
func (l *Lock) endedAnswer(ctx context.Context, op string) error {
	select {
	case <-l.ctx.Done():
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended", ctx.Err())
	}
	if c := context.Cause(l.ctx); errors.Is(c, pglease.ErrLockLost) {
		return pgerr.New(pglease.CodeLockLost, op, "the lock had been lost before it was released", c)
	}
	return nil
}
