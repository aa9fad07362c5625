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
	// Key, TTL and LockID are the new grant's, as in AcquireRequest.
	Key    string
	TTL    time.Duration
	LockID string
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
	// was lost and the key taken meanwhile); Err on a fence overflow, in
	// which case a released key is left free.
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
		acq[i] = AcquireRequest{Key: r.Key, TTL: r.TTL, LockID: r.LockID}
		olds[i] = r.Old
	}
	storageKeys, fenceKeys, ids, ttls, err := prepareAcquire(op, acq)
	if err != nil {
		return nil, err
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	var channel *string
	if s.cfg.NotifyChannel != "" {
		channel = &s.cfg.NotifyChannel
	}
	var holder *string // as in acquire
	if s.holder != "" {
		holder = &s.holder
	}
	out := make([]HandOffResult, len(reqs))
	got := make([]bool, len(reqs))
	err = s.run(ctx, op, true, s.handOffSQL, []any{olds, storageKeys, storageKeys, fenceKeys, ids, ttls, holder, channel}, func(rows pgx.Rows) error {
		var idx, status int32
		var released bool
		var fence, acqMs, exp *int64
		if err := rows.Scan(&idx, &released, &status, &fence, &acqMs, &exp); err != nil {
			return err
		}
		i := int(idx) - 1
		if i < 0 || i >= len(out) || got[i] {
			return errors.New("pg: bad result index from handoff function")
		}
		got[i] = true
		out[i].Released = released
		switch status {
		case 0:
			if fence == nil || acqMs == nil || exp == nil {
				return errors.New("pg: incomplete grant from handoff function")
			}
			out[i].AcquireResult = AcquireResult{OK: true, LockID: ids[i], Fence: pglease.Fence(*fence),
				AcquiredAt: time.UnixMilli(*acqMs), ExpiresAt: time.UnixMilli(*exp)}
		case 1:
		case 2:
			out[i].Err = pgerr.New(pglease.CodeInternal, op, "fence counter overflow: the key's fence would exceed 900000000000000; no lock granted", nil)
		default:
			return errors.New("pg: unknown status from handoff function")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "handoff function returned too few rows", nil)
		}
	}
	if s.cfg.OnFenceWarning != nil {
		for i, r := range out {
			if r.OK && r.Fence > keys.FenceWarn {
				s.cfg.OnFenceWarning(pglease.HashKey(storageKeys[i]), r.Fence)
			}
		}
	}
	return out, nil
}
