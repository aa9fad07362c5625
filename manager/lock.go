package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
)

// ErrReleased is the cause of a Lock's Context after Release.
var ErrReleased = errors.New("pglease: lock released")

// Lock is a held lease lock. Its lockId, a bearer secret, never leaves
// the handle: String, GoString, Format, LogValue and MarshalJSON print
// only the fence and "[redacted]". A Lock is safe for concurrent use.
type Lock struct {
	m          *Manager                // immutable
	key        string                  // immutable: NFC key; never printed
	id         string                  // immutable: the lockId; never printed
	fence      pglease.Fence           // immutable
	ttl        time.Duration           // immutable
	acquiredAt time.Time               // immutable: server time of the grant
	ctx        context.Context         // immutable; cancelled with a cause
	cancel     context.CancelCauseFunc // called by run and by the loss timer

	h *holding // owned by run
}

// Key returns the lock's key, NFC-normalized.
func (l *Lock) Key() string { return l.key }

// Fence returns the lock's fencing token: strictly greater than the fence
// of every earlier grant of the same key. Guard writes to the protected
// resource with it (accept a write only if its fence is ≥ the highest
// fence the resource has seen).
func (l *Lock) Fence() pglease.Fence { return l.fence }

// TTL returns the lease TTL.
func (l *Lock) TTL() time.Duration { return l.ttl }

// AcquiredAt returns the server time of the grant (millisecond precision).
func (l *Lock) AcquiredAt() time.Time { return l.acquiredAt }

// Context returns a context that is cancelled when the lock stops being
// held. context.Cause then tells why: an error matching
// pglease.ErrLockLost (extends failed past the trust window, or the
// server no longer had the lock), pglease.ErrClosed (the Manager was
// closed), or ErrReleased.
func (l *Lock) Context() context.Context { return l.ctx }

// Done is Context().Done().
func (l *Lock) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lock is held, and then the cause of its end
// (see Context).
func (l *Lock) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Release releases the lock in PostgreSQL (batched with other releases)
// and returns once the server answered. It returns nil if the lock was
// held until now (or until Close released it), an error matching
// pglease.ErrLockLost if it had been lost before, and another error if
// the outcome is unknown (the lock is then no longer extended and expires
// by itself). The lock's Context is cancelled with cause ErrReleased at
// once. Releasing twice is a no-op. If ctx has ended or ends first,
// Release returns CodeAborted while the release goes on in the background
// (even with an already-ended ctx, so a deferred Release never leaves the
// lock auto-extended).
func (l *Lock) Release(ctx context.Context) error {
	const op = "manager.Release"
	if ctx == nil {
		return invalid(op, "nil context")
	}
	m := l.m
	// The loop starts the pglease.release span under the caller's span
	// when it actually releases (not for a lock already released).
	req := &releaseReq{lock: l, reply: make(chan error, 1), parent: trace.SpanContextFromContext(ctx)}
	if err := ctx.Err(); err != nil {
		// Still stop the heartbeat and release in the background: a lock
		// left auto-extended because a deferred Release got an ended
		// context would otherwise be held until Close.
		select {
		case m.releaseCh <- req: // the loop takes it at once; its reply is dropped
		case <-m.done:
		}
		return pglease.NewError(pglease.CodeAborted, op, "context ended; the lock is being released in the background", err)
	}
	select {
	case m.releaseCh <- req:
	case <-ctx.Done():
		return pglease.NewError(pglease.CodeAborted, op, "context ended before the release was sent", ctx.Err())
	case <-m.done:
		return releasedAnswer(l) // Close released it
	}
	select {
	case err := <-req.reply:
		return err
	case <-ctx.Done():
		return pglease.NewError(pglease.CodeAborted, op, "context ended before the release was confirmed", ctx.Err())
	}
}

// releasedAnswer is what Release returns for a lock that is no longer
// held in this process.
func releasedAnswer(l *Lock) error {
	if c := context.Cause(l.ctx); errors.Is(c, pglease.ErrLockLost) {
		return pglease.NewError(pglease.CodeLockLost, "manager.Release", "the lock had been lost before it was released", c)
	}
	return nil
}

// The printing methods have value receivers, so a dereferenced Lock is
// redacted too.

// String returns "pglease.Lock{fence:…, lockId:[redacted]}".
func (l Lock) String() string {
	return fmt.Sprintf("pglease.Lock{fence:%s, lockId:[redacted]}", l.fence)
}

// GoString is String: the lockId never appears in %#v.
func (l Lock) GoString() string { return l.String() }

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
	return slog.GroupValue(slog.String("fence", l.fence.String()), slog.String("lockId", "[redacted]"))
}

// MarshalJSON encodes {"fence":"…","lockId":"[redacted]"}.
func (l Lock) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Fence  string `json:"fence"`
		LockID string `json:"lockId"`
	}{l.fence.String(), "[redacted]"})
}

var (
	_ fmt.Stringer   = Lock{}
	_ fmt.GoStringer = Lock{}
	_ fmt.Formatter  = Lock{}
	_ slog.LogValuer = Lock{}
	_ json.Marshaler = Lock{}
)
