package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// SharedRequest is one item of AcquireSharedMany: a shared hold of Key.
type SharedRequest struct {
	// Key, TTL and LockID are as in AcquireRequest.
	Key    string
	TTL    time.Duration
	LockID string
	// Limit is 0 for a reader of a reader-writer lease (any number of
	// readers, never together with an exclusive holder), or n > 0 for a
	// permit of a counting semaphore of n (at most n permits at once).
	// Holders may disagree on n (a limit changed in a live fleet): a
	// permit is granted while the live permits are fewer than the
	// smallest limit among them and its own (see AcquireSharedMany).
	Limit int
	// Yield is as in AcquireRequest: the hold yields to its key's fair
	// queue (any live ticket refuses it).
	Yield bool
}

// Format never prints the key or lockId.
func (r SharedRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.SharedRequest{Key:%s TTL:%v LockID:[redacted] Limit:%d Yield:%v}", pglease.HashKey(r.Key), r.TTL, r.Limit, r.Yield)
}

// AcquireSharedMany tries once to take a shared hold of each item's key
// in one statement (one round trip); results[i] answers reqs[i] as
// AcquireMany's do. Shared holds live in the lock table's
// {lock}_shared table, next to the exclusive rows; Release, ReleaseMany,
// ReleaseWaited, Extend and ExtendMany take their lockIds like any other
// (and a release notifies waiters of the key as an exclusive release
// does). SyncGuard processes do not see them.
//
// Rules, on the server's clock, per key:
//   - a shared hold is refused (OK false) while a live exclusive lease
//     exists, during a lock delay or a revoke's delay, and while an
//     exclusive acquire waits (writer preference: an exclusive attempt
//     refused for any reason, by an exclusive holder, a delay or shared
//     holds, marks the key for 2 s after the attempt, refused by a holder
//     or a delay only a key that readers or permits contended for before:
//     the first of them refused on a key wakes its waiters, so that a
//     waiting writer marks it at its next attempt; a waiting writer
//     keeps its mark by trying again within 1 s, and one refused by
//     shared holds is told so, RetryAfter at most 1 s; a writer that
//     gives up or dies holds readers off for at most 2 s after its last
//     attempt; an exclusive grant lifts the mark, while a handoff
//     (HandOff) and a takeover of an expired lease keep another waiting
//     writer's: no release woke that writer to mark the key again);
//   - a reader is refused while permits are held, a permit while readers
//     are held (the two kinds of shared hold never hold a key together);
//   - a permit (Limit n) is refused while the live permits number at
//     least the smallest limit among them and n (RetryAfter: until the
//     earliest of them expires). So holders may disagree on the limit,
//     as during a rolling deploy that changes it: the key never has more
//     permits than the smallest limit of its live permits; a raised limit
//     applies once the permits taken with the old one are gone, a lowered
//     one as soon as the live permits are fewer than it (until then its
//     callers wait). A disagreement is contention, never an error: it
//     lives in the database, and the same call later succeeds;
//   - an exclusive acquire is refused while any live shared hold exists
//     (AcquireResult.SharedHolders counts them).
//
// Fences: a reader's is the key's fence counter at its grant, not
// incremented (the fence of the last exclusive grant or permit: the state
// it reads under; 0 when the key was never granted); a permit's is a
// fresh increment, so fences are strictly increasing across permits and
// exclusive grants. Items are processed in the acquire's fixed global key
// order; two items of one key in a batch are two holds. Invalid input
// anywhere fails the whole call before I/O.
func (s *Store) AcquireSharedMany(ctx context.Context, reqs []SharedRequest) ([]AcquireResult, error) {
	const op = "pg.AcquireSharedMany"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	if len(reqs) == 0 {
		return []AcquireResult{}, nil
	}
	acq := make([]AcquireRequest, len(reqs))
	limits := make([]int32, len(reqs))
	for i, r := range reqs {
		if r.Limit < 0 || r.Limit > math.MaxInt32 {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "Limit must be 0 (a reader) or a positive int32 (a permit)", nil)
		}
		acq[i] = AcquireRequest{Key: r.Key, TTL: r.TTL, LockID: r.LockID, Yield: r.Yield}
		limits[i] = int32(r.Limit)
	}
	p, err := prepareAcquire(op, acq)
	if err != nil {
		return nil, err
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	out := make([]AcquireResult, len(reqs))
	got := make([]bool, len(reqs))
	sql, args := p.withYield(s.sharedSQL, []any{p.keys, p.fenceKeys, p.ids, p.ttls, limits, s.holderArg(), s.channelArg()})
	err = s.run(ctx, op, true, sql, args, func(rows pgx.Rows) error {
		var lim *int32 // the smallest live limit that refused the item (unused)
		g, err := scanGrant(rows, &lim)
		if err != nil {
			return err
		}
		i := int(g.idx) - 1
		if i < 0 || i >= len(out) || got[i] {
			return errors.New("pg: bad result index from shared acquire function")
		}
		got[i] = true
		if g.status == 3 || g.status == 4 {
			return errors.New("pg: unknown status from shared acquire function")
		}
		out[i], err = g.result(op, p.ids[i])
		out[i].Queued = p.yielded(i, g)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "shared acquire function returned too few rows", nil)
		}
	}
	s.warnFences(p.keys, out)
	return out, nil
}
