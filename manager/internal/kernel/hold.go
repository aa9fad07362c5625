package kernel

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/pgerr"
)

// Hold is the kernel's side of a held lock (a Manager's Lock wraps it):
// its identity, its Context and its lease, written by run.
type Hold struct {
	M          *Kernel                 // immutable
	Key        string                  // immutable: NFC key; never printed
	ID         string                  // immutable: the lockId; never printed
	Fence      pglease.Fence           // immutable
	TTL        time.Duration           // immutable
	AcquiredMs int64                   // immutable: server time of the grant, Unix ms (smaller than a time.Time: one per held lock)
	Start      time.Time               // immutable: local (monotonic) start of the granting attempt
	Ctx        context.Context         // immutable; cancelled with a cause
	cancel     context.CancelCauseFunc // called by run and by the loss timer

	Lease *leaseState // immutable pointer; see leaseState
	// rq is the *releaseRequest of ReleaseRequested, made on first use
	// (by the caller or by run, whichever comes first: revoke.go); read
	// and set with sync/atomic's pointer functions only. (Not an
	// atomic.Pointer, which the printing methods' value receivers would
	// copy; the Lock's size class has room for it.)
	rq     unsafe.Pointer
	Shared bool // immutable: a shared hold (Shared, WithLimit)

	h *holding // owned by run
}

// leaseState is a Lock's current lease, written by run after the grant
// and after each successful extend, read by anyone. (A pointer, so the
// Lock's value-receiver printing methods copy no atomics.)
type leaseState struct {
	ExpiresAt atomic.Int64 // server expires_at, Unix milliseconds
	TrustedNs atomic.Int64 // trust deadline as nanoseconds after Lock.start
}

// setLease records the lease's state after the grant or a successful
// extend: the server's expiry and the local trust deadline. Called by run.
func (l *Hold) setLease(lease heartbeat.Lease, expiresAt time.Time) {
	l.Lease.ExpiresAt.Store(expiresAt.UnixMilli())
	l.Lease.TrustedNs.Store(int64(lease.TrustedUntil().Sub(l.Start)))
}

// releasedCause is the cause of a Lock's Context after Release.
var releasedCause = pgerr.New(pglease.CodeReleased, "manager.Release", "lock released", nil)

// releasedAnswer is what Release returns for a lock that is no longer
// held in this process.
func releasedAnswer(l *Hold) error {
	switch c := context.Cause(l.Ctx); {
	case errors.Is(c, pglease.ErrLockLost):
		return pgerr.New(pglease.CodeLockLost, "manager.Release", "the lock had been lost before it was released", c)
	case errors.Is(c, pglease.ErrRevoked):
		return pgerr.New(pglease.CodeRevoked, "manager.Release", "the lock had been revoked before it was released", c)
	}
	return nil
}

// EndedExtend is Extend's answer for a lock that ended with cause: an
// error with the cause's code, wrapping it.
func EndedExtend(cause error) error {
	code := pglease.CodeOf(cause)
	if code == 0 {
		code = pglease.CodeInternal
	}
	if code == pglease.CodeHoldLimitExceeded {
		return pgerr.New(code, "manager.Extend", "the lock reached its hold limit: it is not extended any more", cause)
	}
	return pgerr.New(code, "manager.Extend", "the lock is no longer held", cause)
}

// extendUnknown is Extend's answer when the round trip failed: the
// outcome is unknown, the lease keeps its previous expiry.
func extendUnknown(err error) error {
	code := pglease.CodeOf(err)
	if code == 0 {
		code = pglease.CodeInternal
	}
	return pgerr.New(code, "manager.Extend", "extend outcome unknown; the lease keeps its previous expiry and trust window", err)
}

// Err is Lock.Err of a Lock that is not nil: nil while held, then the
// cause of its end (reading the clock itself: see checkTrust).
func (l *Hold) Err() error {
	if l.Ctx.Err() == nil {
		l.checkTrust(l.M.Now())
		if l.Ctx.Err() == nil {
			return nil
		}
	}
	return context.Cause(l.Ctx)
}
