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
	// Every live holder of a key has the same Limit: an item whose Limit
	// differs from theirs fails with CodeInvalidArgument, nothing
	// written.
	Limit int
}

// Format never prints the key or lockId.
func (r SharedRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.SharedRequest{Key:%s TTL:%v LockID:[redacted] Limit:%d}", pglease.HashKey(r.Key), r.TTL, r.Limit)
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
//     exclusive acquire waits for the shared holds to drain (writer
//     preference: an exclusive attempt refused by shared holds marks the
//     key for 2 s, refreshed by each such attempt; its RetryAfter is
//     at most 1 s so that a waiting writer keeps its mark, and a writer
//     that gives up or dies holds readers off for at most 2 s after its
//     last attempt);
//   - a permit (Limit n) is refused when n live permits exist
//     (RetryAfter: until the earliest of them expires), and fails with
//     Err CodeInvalidArgument when the live holders' limit is another
//     ("limit 5 disagrees with the 3 the key's holders use"; readers are
//     limit 0); with no live holder, the item's limit applies;
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
		acq[i] = AcquireRequest{Key: r.Key, TTL: r.TTL, LockID: r.LockID}
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
	err = s.run(ctx, op, true, s.sharedSQL, []any{p.keys, p.fenceKeys, p.ids, p.ttls, limits, s.holderArg(), s.channelArg()}, func(rows pgx.Rows) error {
		var lim *int32
		g, err := scanGrant(rows, &lim)
		if err != nil {
			return err
		}
		i := int(g.idx) - 1
		if i < 0 || i >= len(out) || got[i] {
			return errors.New("pg: bad result index from shared acquire function")
		}
		got[i] = true
		if g.status == 3 {
			if lim == nil {
				return errors.New("pg: limit mismatch without a limit from shared acquire function")
			}
			out[i].Err = pgerr.New(pglease.CodeInvalidArgument, op, limitMismatch(reqs[i].Limit, int(*lim)), nil)
			return nil
		}
		if g.status == 4 {
			return errors.New("pg: unknown status from shared acquire function")
		}
		out[i], err = g.result(op, p.ids[i])
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

// limitMismatch says how a shared request's limit (want) disagrees with
// the key's live holders' (have); 0 is a reader.
func limitMismatch(want, have int) string {
	switch {
	case want == 0:
		return fmt.Sprintf("a reader (no limit) disagrees with the limit %d the key's holders use", have)
	case have == 0:
		return fmt.Sprintf("limit %d disagrees with the key's holders, which are readers (no limit)", want)
	}
	return fmt.Sprintf("limit %d disagrees with the %d the key's holders use", want, have)
}
