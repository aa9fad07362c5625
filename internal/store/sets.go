package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// AcquireSets tries once to take each set of keys exclusively, all or
// nothing per set, for a batch of sets in one statement (one round
// trip): results[i][j] answers sets[i][j]. A set is granted whole (every
// item OK, each with its own lockId and fence: ordinary leases, released
// and extended one by one) or not at all (no item OK, nothing written for
// it). In a refused set, an item whose key is held is answered like a
// "locked" AcquireMany item (ExpiresAt, RetryAfter, Holder,
// SharedHolders); an item whose key was free has none of them; the set
// can be taken at the latest RetryAfter of its items, unless their
// holders extend. An item at the fence limit has Err (CodeInternal) and
// keeps its set from being granted.
//
// Every key of the batch is checked first, under its advisory lock and
// row lock, in the acquire's fixed global key order (so concurrent sets
// and batches never deadlock), before anything is written; a key in
// several sets of one batch can go only to the first of them. A set's
// grant is one transaction with the others' (a batch commits or fails as
// a whole). A key given twice in one set, an empty set, or any other
// invalid input fails the whole call before I/O; at most MaxBatch items
// in all.
func (s *Store) AcquireSets(ctx context.Context, sets [][]AcquireRequest) ([][]AcquireResult, error) {
	const op = "pg.AcquireSets"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	total := 0
	for _, set := range sets {
		total += len(set)
		if len(set) == 0 {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "an empty set", nil)
		}
	}
	if total > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	if total == 0 {
		return [][]AcquireResult{}, nil
	}
	flat := make([]AcquireRequest, 0, total)
	setOf := make([]int32, 0, total)
	for i, set := range sets {
		seen := make(map[string]struct{}, len(set))
		for _, r := range set {
			k, err := keys.NormalizeKey(r.Key)
			if err != nil {
				return nil, WithOp(op, err)
			}
			if _, dup := seen[k]; dup {
				return nil, pgerr.New(pglease.CodeInvalidArgument, op, "a key given twice in one set", nil)
			}
			seen[k] = struct{}{}
			flat = append(flat, r)
			setOf = append(setOf, int32(i+1))
		}
	}
	p, err := prepareAcquire(op, flat)
	if err != nil {
		return nil, err
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	res := make([]AcquireResult, total)
	got := make([]bool, total)
	sql, args := p.withYield(s.setsSQL, []any{setOf, p.keys, p.fenceKeys, p.ids, p.ttls, p.delays, s.holderArg(), s.channelArg()})
	err = s.run(ctx, op, true, sql, args, func(rows pgx.Rows) error {
		g, err := scanGrant(rows)
		if err != nil {
			return err
		}
		i := int(g.idx) - 1
		if i < 0 || i >= total || got[i] {
			return errors.New("pg: bad result index from set acquire function")
		}
		got[i] = true
		res[i], err = g.result(op, p.ids[i])
		res[i].Queued = p.yielded(i, g)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "set acquire function returned too few rows", nil)
		}
	}
	out := make([][]AcquireResult, len(sets))
	j := 0
	for i, set := range sets {
		out[i] = res[j : j+len(set) : j+len(set)]
		j += len(set)
	}
	s.warnFences(p.keys, res)
	return out, nil
}
