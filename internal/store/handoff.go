package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// HandOffRequest is one item of HandOff: release Old, the caller's lock on
// Key, and acquire Key for TTL with a new lockId, in one statement.
type HandOffRequest struct {
	// Old is the lockId being released (the current holder's).
	Old string
	// Key, TTL, LockID and LockDelay are the new grant's, as in
	// AcquireRequest.
	Key       string
	TTL       time.Duration
	LockID    string
	LockDelay time.Duration
}

// Format never prints the key or lockIds.
func (r HandOffRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.HandOffRequest{Old:[redacted] Key:%s TTL:%v LockID:[redacted]}", pglease.HashKey(r.Key), r.TTL)
}

// HandOffResult answers one HandOff item.
type HandOffResult struct {
	// Released reports that Old was still held (live, on the server clock)
	// and is now gone; false means it had already been lost.
	Released bool
	// AcquireResult is the new grant: OK with a new fence when the key was
	// handed over (or was free); OK false when someone else holds it (Old
	// was lost and the key taken meanwhile, or shared holds or a delay
	// keep it), with RetryAfter and Holder as for an acquire; Err on a
	// fence overflow, in which case a released key is left free.
	AcquireResult
}

// HandOff releases each item's Old lockId and grants its key to the item's
// new lockId, in one statement and one transaction (one round trip; the
// grant commits durably like an acquire): a local handoff from one holder
// to the next without a release round trip in between. Old's row is taken
// over in place when Old still holds the key (live on the server clock);
// otherwise the key is acquired under the usual rule. The new grant's
// fence is above Old's, as for any grant. No release notification is
// sent, as the key is taken again at once. Invalid input anywhere fails
// the whole call before I/O.
func (s *Store) HandOff(ctx context.Context, reqs []HandOffRequest) ([]HandOffResult, error) {
	const op = "pg.HandOff"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	if len(reqs) == 0 {
		return []HandOffResult{}, nil
	}
	acq := make([]AcquireRequest, len(reqs))
	olds := make([]string, len(reqs))
	for i, r := range reqs {
		if err := keys.ValidateLockID(r.Old); err != nil {
			return nil, WithOp(op, err)
		}
		if r.LockID == r.Old {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "the new lockId must differ from the old one", nil)
		}
		acq[i] = AcquireRequest{Key: r.Key, TTL: r.TTL, LockID: r.LockID, LockDelay: r.LockDelay}
		olds[i] = r.Old
	}
	p, err := prepareAcquire(op, acq)
	if err != nil {
		return nil, err
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	out := make([]HandOffResult, len(reqs))
	got := make([]bool, len(reqs))
	sql, args := s.handOffSQL, []any{olds, p.keys, p.fenceKeys, p.ids, p.ttls, p.delays, s.holderArg(), s.channelArg()}
	if len(reqs) == 1 {
		// One item (a hot key's section): the same handoff in a lighter
		// call, plain arguments and one row.
		sql, args = s.handOff1SQL, []any{olds[0], p.keys[0], p.fenceKeys[0], p.ids[0], p.ttls[0], p.delays[0], s.holderArg(), s.channelArg()}
	}
	err = s.run(ctx, op, true, sql, args, func(rows pgx.Rows) error {
		var released bool
		var g grantRow
		if err := rows.Scan(&g.idx, &released, &g.status, &g.fence, &g.acq, &g.exp, &g.now, &g.at, &g.holder, &g.shared); err != nil {
			return err
		}
		i := int(g.idx) - 1
		if i < 0 || i >= len(out) || got[i] || g.status == 4 {
			return errors.New("pg: bad result from handoff function")
		}
		got[i] = true
		out[i].Released = released
		var err error
		out[i].AcquireResult, err = g.result(op, p.ids[i])
		return err
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "handoff function returned too few rows", nil)
		}
	}
	res := make([]AcquireResult, len(out))
	for i := range out {
		res[i] = out[i].AcquireResult
	}
	s.warnFences(p.keys, res)
	return out, nil
}
