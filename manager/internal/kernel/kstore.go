package kernel

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// Store is what the Manager asks of its store: exactly the calls
// the loop, its DB workers and the Manager's own calls make, with
// *store.Store's signatures. The Manager holds its store through it, so
// that another implementation (an in-memory model held to the real store
// by one conformance suite) can stand in for PostgreSQL in a test.
type Store interface {
	// Acquire attempts: exclusive, shared holds, all-or-nothing sets, and
	// the release-and-grant of a local handoff.
	AcquireMany(ctx context.Context, reqs []store.AcquireRequest) ([]store.AcquireResult, error)
	AcquireSharedMany(ctx context.Context, reqs []store.SharedRequest) ([]store.AcquireResult, error)
	AcquireSets(ctx context.Context, sets [][]store.AcquireRequest) ([][]store.AcquireResult, error)
	HandOff(ctx context.Context, reqs []store.HandOffRequest) ([]store.HandOffResult, error)
	// The fair queue (Config.FairQueue, fair.go): acquire or enqueue,
	// refresh the tickets, release and serve the head, leave.
	QueueWait(ctx context.Context, reqs []store.WaitRequest, qchannel string, life time.Duration) ([]store.WaitResult, error)
	QueueRefresh(ctx context.Context, lockIDs []string, life time.Duration) ([]store.TicketState, error)
	QueueRelease(ctx context.Context, reqs []store.ReleaseRequest, grant bool, self string) ([]store.QueueReleaseResult, error)
	QueueLeave(ctx context.Context, lockIDs []string) ([]store.LeaveResult, error)
	// Held leases: extends and releases.
	ExtendMany(ctx context.Context, reqs []store.ExtendRequest) ([]store.ExtendResult, error)
	ReleaseWaited(ctx context.Context, reqs []store.ReleaseRequest) ([]bool, error)
	// Revocation, release requests and inspection.
	Revoke(ctx context.Context, reqs []store.RevokeRequest) ([]store.RevokeResult, error)
	RequestRelease(ctx context.Context, keys []string, holds []string) error
	Snapshot(ctx context.Context, keys []string) ([]store.KeyState, error)
	LookupByKey(ctx context.Context, key string) (*store.LockInfo, error)
	Guard(ctx context.Context, tx store.DB, lockID string) (store.GuardResult, error)
	// Identity and schema check.
	Holder() string
	MarkChecked()
}

var _ Store = (*store.Store)(nil)
