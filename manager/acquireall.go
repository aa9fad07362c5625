package manager

import (
	"context"
	"strconv"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
)

// AcquireAll waits for all of keys, exclusively, and returns their locks
// in the order of keys: all of them or none. Each attempt takes every key
// in one statement, or nothing (no key is ever held while the call waits
// for another, so sets with common keys never deadlock, in any order).
// Each returned Lock is an ordinary lease of its key (Acquire's): its own
// fence, heartbeat, loss signal and Release; release each (or let Close).
//
// It waits as Acquire does (the context, WithAcquireTimeout, the same
// errors), and is woken by the release of any of its keys, in this
// process or another. It never holds up callers waiting for one of its
// keys alone; in return it gets a turn: after 4 grants of its keys to
// other callers of this Manager while it waits, those callers wait until
// its next attempt has been answered, which goes out as soon as this
// Manager holds none of its keys (a turn lapses after a second if that
// does not happen: a long holder of one key does not block the others). Against other processes it has
// no priority: the database grants whoever comes first, and the set needs
// all its keys free at the same moment.
//
// keys must be 1 to 100 valid keys, none twice (after NFC normalization);
// WithTTL, WithAcquireTimeout, WithoutAutoExtend and WithHoldLimit apply
// to every lock; Shared and WithLimit do not apply (InvalidArgument).
// Bad input is InvalidArgument before any I/O.
func (m *Manager) AcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) ([]*Lock, error) {
	const op = "manager.AcquireAll"
	req, timeout, err := m.newSetReq(op, ctx, keys, false, opts)
	if err != nil {
		return nil, err
	}
	m.startSetAcquire(ctx, req)
	wctx, cancel := waitContext(ctx, timeout)
	defer cancel()
	r := m.k.Submit(op, wctx, req)
	switch {
	case r.Locks != nil:
		return wrapLocks(r.Locks), nil
	case r.Err != nil:
		err = userErr(op, r.Err)
	default:
		err = waitErr(op, ctx, wctx, r)
	}
	failSet(req, err)
	return nil, err
}

// TryAcquireAll makes one attempt to take all of keys, exclusively, in one
// statement: ok is false (and err nil) when any of them is held, by
// another process or by this Manager, or when callers of this Manager wait
// for one of them (they come first; with Config.FairQueue, callers of any
// process waiting in its queue). Otherwise it is AcquireAll without
// the wait (see TryAcquire for what a single attempt waits for).
func (m *Manager) TryAcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) (locks []*Lock, ok bool, err error) {
	const op = "manager.TryAcquireAll"
	req, _, err := m.newSetReq(op, ctx, keys, true, opts)
	if err != nil {
		return nil, false, err
	}
	m.startSetAcquire(ctx, req)
	r := m.k.Submit(op, ctx, req)
	switch {
	case r.Locks != nil:
		return wrapLocks(r.Locks), true, nil
	case r.Locked:
		for _, k := range req.Set.Keys {
			k.Acq.NotAcquired()
		}
		return nil, false, nil
	case r.Err != nil:
		err = userErr(op, r.Err)
	default:
		err = waitErr(op, ctx, ctx, r)
	}
	failSet(req, err)
	return nil, false, err
}

// newSetReq validates a set request before any I/O.
func (m *Manager) newSetReq(op string, ctx context.Context, keyList []string, try bool, opts []AcquireOption) (*kernel.AcquireReq, time.Duration, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, 0, err
	}
	switch {
	case len(keyList) == 0:
		return nil, 0, kernel.Invalid(op, "no keys")
	case len(keyList) > kernel.MaxSetKeys:
		return nil, 0, kernel.Invalid(op, strconv.Itoa(len(keyList))+" keys, more than the "+strconv.Itoa(kernel.MaxSetKeys)+" one set may have: "+
			"take one lock that stands for the whole group (a coarser key), or take smaller sets one after another in the same order in every process")
	}
	set := make([]kernel.SetKey, len(keyList))
	seen := make(map[string]int, len(keyList))
	for i, k := range keyList {
		nk, err := keys.NormalizeKey(k)
		if err != nil {
			return nil, 0, kernel.Reop(op, err)
		}
		if j, dup := seen[nk]; dup {
			return nil, 0, kernel.Invalid(op, "a key given twice: keys["+strconv.Itoa(j)+"] and keys["+strconv.Itoa(i)+"] are equal after NFC normalization; give each key once")
		}
		seen[nk] = i
		set[i] = kernel.SetKey{Key: nk, Hash: pglease.HashKey(nk)}
	}
	o, err := m.parseOpts(op, opts)
	if err != nil {
		return nil, 0, err
	}
	if o.shared {
		return nil, 0, kernel.Invalid(op, "Shared and WithLimit do not apply to sets: AcquireAll takes exclusive leases")
	}
	if err := checkTTL(op, o.ttl, m.cfg.LossMargin, !o.manual); err != nil {
		return nil, 0, err
	}
	if m.k.IsClosing() {
		return nil, 0, kernel.ClosedErr(op)
	}
	return &kernel.AcquireReq{
		Key:       set[0].Key,
		Hash:      set[0].Hash,
		TTL:       o.ttl,
		Manual:    o.manual,
		Try:       try,
		HoldLimit: o.holdLimit,
		Set:       &kernel.SetReq{Keys: set},
		Reply:     make(chan kernel.AcquireReply, 1),
		Final:     make(chan kernel.AcquireReply, 1),
	}, o.timeout, nil
}

// failSet ends each key's acquire telemetry of a failed set: one log
// record for the set, not one per key.
func failSet(req *kernel.AcquireReq, err error) {
	acqs := make([]*obs.Acquisition, len(req.Set.Keys))
	for i, k := range req.Set.Keys {
		acqs[i] = k.Acq
	}
	obs.FailedSet(acqs, err)
}

// startSetAcquire starts one pglease.acquire span per key of the set, each
// a child of the span in ctx.
func (m *Manager) startSetAcquire(ctx context.Context, req *kernel.AcquireReq) {
	for i := range req.Set.Keys {
		k := &req.Set.Keys[i]
		_, k.Acq = m.k.Rec.StartAcquire(ctx, m.k.Rec.KeyHashed(k.Key, k.Hash), obs.AcquireInfo{
			Kind: obs.KindLease, TTL: req.TTL, Try: req.Try,
		})
	}
	req.Acq = req.Set.Keys[0].Acq
}

// wrapLocks wraps the holds of a set's grant, in the order of its keys.
func wrapLocks(hs []*kernel.Hold) []*Lock {
	ls := make([]*Lock, len(hs))
	for i, h := range hs {
		ls[i] = &Lock{h}
	}
	return ls
}
