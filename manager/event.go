package manager

import (
	"context"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease"
)

// Event is one change of a watched key's exclusive lease (Watch), or its
// state when the watch starts. Kind says what happened; Fence is the
// fence of the grant it is about (0 when the key is free and its last
// grant is unknown); Holder is the holder identity the grant's Manager
// recorded (its Config.Holder, by default "program[pid]@host"; "" when
// unknown: a SyncGuard holder, or a grant that ended before it could be
// read); ExpiresAt is the lease's expiry on the server's clock, as last
// read (zero when unknown).
type Event struct {
	Kind      EventKind
	Fence     pglease.Fence
	Holder    string
	ExpiresAt time.Time
}

// EventKind says what an Event reports. As a string, it prints as its
// name.
type EventKind string

// The kinds of Event. The first event of a watch, and the first after
// the Manager's listening connection was replaced, is the key's state as
// read then: EventGranted while a lease is live, EventExpired for a lease
// that expired without a release, EventReleased when there is none.
const (
	// EventGranted: the key was granted (Fence, Holder, ExpiresAt of the
	// new lease), or is held when the watch starts.
	EventGranted EventKind = "granted"
	// EventReleased: the lease of Fence was released (or the key is free
	// when the watch starts).
	EventReleased EventKind = "released"
	// EventExpired: the lease of Fence expired without a release: the
	// key can be taken over. Reported when found (about a second after
	// ExpiresAt, on one read), or when the next grant comes first.
	EventExpired EventKind = "expired"
	// EventRevoked: the lease of Fence was revoked (Revoke).
	EventRevoked EventKind = "revoked"
	// EventResync: the Manager's listening connection was replaced, so
	// notifications were lost, and the key changed meanwhile in a way
	// the read after it cannot tell: the lease of Fence, which was live
	// at the last event, ended (released, revoked or expired), or, when
	// the key is free, Fence is its last grant, ended. When the key has
	// a lease again, its EventGranted (or EventExpired) follows.
	EventResync EventKind = "resync"
)

// Watch reports the changes of key's exclusive lease as they commit,
// from any process, without polling: the returned channel first gets the
// key's state, then an Event for each change (EventGranted with the new
// grant's fence, holder and expiry, then EventReleased, EventRevoked or
// EventExpired with its fence). Fences only grow: an event never takes
// the key back to an older grant. After the Manager's listening
// connection was replaced (notifications sent meanwhile are lost), the
// key is read again and the channel gets what changed since the last
// event, and nothing when nothing did: a lease found expired
// (EventExpired), a lease that ended unseen (EventResync), a new lease
// (EventGranted); so the final state is never missed and no change is
// told twice.
//
// The channel is closed when ctx ends or the Manager closes (or stops
// listening for good: see Config.ListenConnString). It is never blocked
// on: it buffers 16 events, and a reader further behind loses the oldest
// ones, never the latest. Shared holds (Shared, WithLimit) are not
// reported, nor are changes made by SyncGuard processes sharing the
// tables (they notify nothing), except as found by the reads (a lease
// found expired, or replaced).
//
// Watch needs notifications: with Config.DisableNotify it is
// CodeInvalidArgument, like a bad key or a nil ctx, before any I/O.
// Watches of one key by several callers of a Manager share one
// registration and one read per change.
func (m *Manager) Watch(ctx context.Context, key string) (<-chan Event, error) {
	ch := make(chan Event, kernel.WatchBuffer)
	if err := m.k.Watch(ctx, key, eventOut(ch)); err != nil {
		return nil, err
	}
	return ch, nil
}

// eventOut is a watcher's channel as the kernel's EventSink: it converts
// each event, and never blocks (full, the oldest event makes room).
type eventOut chan Event

func (c eventOut) Send(ev kernel.Event) {
	e := Event{Kind: EventKind(ev.Kind), Fence: ev.Fence, Holder: ev.Holder, ExpiresAt: ev.ExpiresAt}
	select {
	case c <- e:
		return
	default:
	}
	select {
	case <-c:
	default:
	}
	select {
	case c <- e:
	default:
	}
}

func (c eventOut) Close() { close(c) }
