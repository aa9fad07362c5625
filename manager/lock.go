package manager

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/pg"
)

// errNilLock is what the methods of a nil *Lock answer: the nil a
// TryAcquire returns with ok=false holds nothing.
var errNilLock = kernel.Invalid("manager.Lock", "nil Lock (TryAcquire returns a nil Lock when ok is false)")

// nilLockCtx is the Context of a nil *Lock: ended, with cause errNilLock.
var nilLockCtx = endedContext(errNilLock)

func endedContext(cause error) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return ctx
}

// Lock is a held lease lock: a pglease.Handle with a fencing token and a
// lease. Its lockId, a bearer secret, never leaves the handle: String,
// Format (every verb, %#v included) and LogValue print only the fence and
// "[redacted]", and encoding/json sees no exported field ({}). A Lock is safe for concurrent use. Every method is safe on
// a nil *Lock (what TryAcquire returns with ok=false): Release, Extend and
// Err return an error matching pglease.ErrInvalidArgument, Context and
// Done an ended context, the others zero values.
type Lock struct {
	hd *kernel.Hold // immutable
}

var _ pglease.Handle = (*Lock)(nil)

// Key returns the lock's key, NFC-normalized ("" for a nil Lock).
func (l *Lock) Key() string {
	if l == nil || l.hd == nil {
		return ""
	}
	return l.hd.Key
}

// Fence returns the lock's fencing token: for an exclusive lease or a
// permit (WithLimit), strictly greater than the fence of every earlier
// exclusive grant or permit of the same key; for a reader (Shared), the
// fence of the state it reads under (the key's last such grant's, which
// readers may share). Guard writes to the protected resource with it
// (accept a write only if its fence is ≥ the highest fence the resource
// has seen). 0 for a nil Lock.
func (l *Lock) Fence() pglease.Fence {
	if l == nil || l.hd == nil {
		return 0
	}
	return l.hd.Fence
}

// GrantID returns pg.GrantID of the lock's lockId: an identity of this
// grant that, unlike the lockId, grants nothing and may be stored or
// logged. Give it with Fence to a pg.FenceGuard made WithGrantColumn (as
// the value of its grant column's pg.Set), which then tells a retry of
// this grant from another grant that got the same fence.
func (l *Lock) GrantID() string {
	if l == nil || l.hd == nil {
		return ""
	}
	return pg.GrantID(l.hd.ID)
}

// TTL returns the lease TTL the lock was acquired with (WithTTL or
// Config.TTL): every extend, automatic or by Extend, renews the lease for
// this long. For the time left, see Remaining and ExpiresAt.
func (l *Lock) TTL() time.Duration {
	if l == nil || l.hd == nil {
		return 0
	}
	return l.hd.TTL
}

// AcquiredAt returns the server time of the grant (millisecond precision):
// the acquired_at_ms of the lease's row, on the same clock as ExpiresAt, so
// that a holder can log or compare its grant with what operators see in
// the table (`pglease status`) without mixing in its own clock.
func (l *Lock) AcquiredAt() time.Time {
	if l == nil || l.hd == nil {
		return time.Time{}
	}
	return time.UnixMilli(l.hd.AcquiredMs)
}

// ExpiresAt returns the lease's current expiry on the server's clock
// (expires_at, millisecond precision), as set by the grant or the last
// successful extend. It is a server time: compare it with other server
// times, not with this process's clock (use Remaining for that). After
// the lock ended it keeps its last value.
func (l *Lock) ExpiresAt() time.Time {
	if l == nil || l.hd == nil || l.hd.Lease == nil {
		return time.Time{}
	}
	return time.UnixMilli(l.hd.Lease.ExpiresAt.Load())
}

// Remaining returns how much longer this process trusts the lease, on its
// own clock (heartbeat.Now: the monotonic clock plus the time the machine
// was suspended): until start + TTL − margin of the last successful
// acquire or extend (see "The trust window" in the package
// documentation). When it reaches zero without an extend, the lock's
// Context is cancelled with a cause matching pglease.ErrLockLost. It is 0
// once the lock has ended, for whatever cause. redislock calls this TTL.
func (l *Lock) Remaining() time.Duration {
	if l == nil || l.hd == nil || l.hd.Ctx == nil || l.hd.Lease == nil || l.hd.Ctx.Err() != nil {
		return 0
	}
	return max(0, l.hd.Start.Add(time.Duration(l.hd.Lease.TrustedNs.Load())).Sub(l.hd.M.Now()))
}

// Context returns a context that is cancelled when the lock stops being
// held. context.Cause then tells why (see Err).
func (l *Lock) Context() context.Context {
	if l == nil || l.hd == nil || l.hd.Ctx == nil {
		return nilLockCtx
	}
	return l.hd.Ctx
}

// Done is Context().Done().
func (l *Lock) Done() <-chan struct{} { return l.Context().Done() }

// Err returns nil while the lock is held, and then the cause of its end,
// a *pglease.Error matching one of: pglease.ErrReleased (Release),
// pglease.ErrLockLost (extends failed past the trust window, or the server
// no longer had the lock), pglease.ErrRevoked (the lease was revoked:
// Manager.Revoke), pglease.ErrClosed (the Manager was closed), or the
// hold-limit error (WithHoldLimit).
//
// Err reads the clock itself: once the trust window has passed it returns
// ErrLockLost (and ends the Context) even if the loss timer has not fired
// yet, as happens for a moment after the process was stopped (SIGSTOP, a
// VM pause) for longer than the window, and for a while after the machine
// was suspended (Go's timers do not count the suspended time; the trust
// window does: see "After a pause" in the package documentation). Ask Err, not only
// Done, right before an action that needs the lock; see "After a pause"
// in the package documentation.
func (l *Lock) Err() error {
	if l == nil || l.hd == nil || l.hd.Ctx == nil {
		return errNilLock
	}
	return l.hd.Err()
}

// Release releases the lock in PostgreSQL (batched with other releases)
// and returns once the server answered. It returns nil if the lock was
// held until now (or until Close released it), an error matching
// pglease.ErrLockLost if it had been lost before (pglease.ErrRevoked if it
// had been revoked: nothing is sent then), and another error if
// the outcome is unknown (the lock is then no longer extended; the
// Manager sends the release again, with backoff, until the server answers
// or the lease has surely expired, so the key is free soon after the
// database answers again). The lock's Context is cancelled with a cause matching
// pglease.ErrReleased at once. Releasing twice is a no-op. If ctx has
// ended or ends first, Release returns CodeAborted while the release goes
// on in the background (even with an already-ended ctx, so a deferred
// Release never leaves the lock auto-extended).
func (l *Lock) Release(ctx context.Context) error {
	const op = "manager.Release"
	if l == nil || l.hd == nil || l.hd.M == nil {
		return errNilLock
	}
	if ctx == nil {
		return kernel.Invalid(op, "nil context")
	}
	// The loop starts the pglease.release span under the caller's span
	// when it actually releases (not for a lock already released).
	req := &kernel.ReleaseReq{Lock: l.hd, Reply: make(chan error, 1), Parent: trace.SpanContextFromContext(ctx)}
	return l.hd.M.SubmitRelease(op, ctx, req)
}

// Extend renews the lease now, for the lock's TTL, and returns once the
// server answered: on success the server's expiry becomes server now +
// TTL (ExpiresAt) and the trust window moves forward (Remaining). It is
// how a lock taken WithoutAutoExtend is kept longer than its first TTL;
// on an auto-extended lock it forces the next heartbeat now.
//
// The extend goes through the Manager's loop: it joins the heartbeat's
// next batched statement (one round trip for all extends due together)
// and the same rules apply. A lock the server no longer has, or whose
// trust window passed before the answer came, is lost: its Context is
// cancelled with a cause matching pglease.ErrLockLost and Extend returns
// that error. A lock that already ended returns an error with its cause's
// code (ErrReleased, ErrLockLost, ErrClosed). When the outcome is unknown
// (connection lost, timeout), Extend returns that error and the lease
// keeps its previous expiry and trust window; calling Extend again is
// safe. If ctx ends first, Extend returns CodeAborted and the extend
// still completes (its result applies to the lock).
func (l *Lock) Extend(ctx context.Context) error {
	const op = "manager.Extend"
	if l == nil || l.hd == nil || l.hd.M == nil {
		return errNilLock
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if c := l.Err(); c != nil {
		return kernel.EndedExtend(c)
	}
	return l.hd.M.SubmitExtend(op, ctx, &kernel.ExtendReq{Lock: l.hd, Reply: make(chan error, 1)})
}

// The printing methods have value receivers, so a dereferenced Lock is
// redacted too.

// String returns "pglease.Lock{fence:…, lockId:[redacted]}".
func (l Lock) String() string {
	return fmt.Sprintf("pglease.Lock{fence:%s, lockId:[redacted]}", l.Fence())
}

// Format prints String for every verb and flag (%v, %+v, %#v, %s, %q …).
func (l Lock) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		fmt.Fprintf(f, "%q", l.String())
		return
	}
	fmt.Fprint(f, l.String())
}

// LogValue logs the fence and a redacted lockId.
func (l Lock) LogValue() slog.Value {
	return slog.GroupValue(slog.String("fence", l.Fence().String()), slog.String("lockId", "[redacted]"))
}

var (
	_ fmt.Stringer   = Lock{}
	_ fmt.Formatter  = Lock{}
	_ slog.LogValuer = Lock{}
)

// ReleaseRequested returns a channel that is closed when someone asks
// for the lock (Manager.RequestRelease of its key, from any process)
// while it is held. Nothing else happens: the holder decides whether and
// when to release. It stays open if no request comes, and after the lock
// ended; a request that came before the lock was granted is not seen. nil
// for a nil Lock.
func (l *Lock) ReleaseRequested() <-chan struct{} {
	if l == nil || l.hd == nil {
		return nil
	}
	return l.hd.ReleaseRequested()
}
