// Package model is an in-memory model of the lease store: the method set
// of *store.Store that the Manager's kernel calls, with the semantics of
// the SQL functions of pg/migrate/templates (schema version 4), on a
// clock the caller injects. It exists so that a simulator can drive the
// kernel one event at a time (under testing/synctest, say) without a
// database, and it is held to the real store by one conformance suite
// (package storetest), run against both: where they differ, the real
// store is right.
//
// What it models: exclusive leases (the lock table's rows, expired rows
// included, with their holder identity and lock delay), shared holds
// (readers and permits), the per-key fence counter, the writer-waiting
// mark (writer preference), revoke delays and the last revoked lockId of
// each key, all on the server's clock (the injected one), in whole
// milliseconds, with the 1 s time tolerance of the real store.
//
// Notifications: the payloads the real store sends on its notify channel
// for these calls are handed to Config.Notify, once per call
// (PostgreSQL delivers a transaction's identical payloads once): wake-ups
// of keys someone waits for (Config.Waited), revokes ("r:"), release
// requests ("q:") and watch events of watched keys (Config.Watched). A
// simulator decides when, and whether, each reaches the kernel. Per key
// they come in the real store's order; the keys of one call come in the
// order of its items (the real store's is its global key order).
//
// What it does not model: concurrency between statements (each call runs
// alone, under one mutex, as if serialized; the real store's row and
// advisory locks and its bounded waits never show, and Snapshot is never
// Busy), the schema check (MarkChecked does nothing) and Guard's row lock
// (Guard checks the lease; the transaction it is given is not used).
package model

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// tolMs is the time tolerance: a row is live for acquirers while
// expires_at + tolMs is after the clock.
const tolMs = keys.TimeToleranceMs

// Config configures a model Store.
type Config struct {
	// Clock is the server's clock. Required: a simulator passes its
	// virtual clock (time.Now under testing/synctest is one).
	Clock func() time.Time
	// Holder is the holder identity the Store records ("" =
	// store.DefaultHolder()).
	Holder string
	// NotifyChannel stands for store.Config.NotifyChannel: RequestRelease
	// needs one, as the real store's does, and without one nothing is
	// notified.
	NotifyChannel string
	// Notify, if set, is called with each payload the real store would
	// send on NotifyChannel (see the package doc), after the call's
	// changes and before it returns, outside the model's lock.
	Notify func(payload string)
	// Waited reports whether some session waits for key (holds its waiter
	// lock, store.RegisterWaiters): a release, a revoke and the first
	// shared attempt a writer refuses wake the key only then. nil: nobody
	// waits. Waited and Watched are called with the model's lock held:
	// they must not call the Store.
	Waited func(key string) bool
	// Watched reports whether some session watches key (holds its watch
	// lock, store.RegisterWatchers): grants, releases and revokes of the
	// key are then told to Notify as watch events ("w:", see
	// store.ParseNotification), with or without NotifyChannel (the real
	// store sends them on the default channel then). nil: nobody watches.
	Watched func(key string) bool
}

// excl is a key's exclusive row (the lock table's), with the holder
// row's identity and lock delay, which the real store ties to the
// grant's lockId.
type excl struct {
	lockID        string
	acq, exp      int64
	fence         int64
	holder        string
	hasHolder     bool
	delay         int64 // the grant's lock delay in ms (0: none)
	holderMatches bool  // the holder row names this grant (a grant with a holder or a delay writes it)
}

// hold is a shared hold (a row of the {lock}_shared table).
type hold struct {
	lockID   string
	key      string
	lim      int
	acq, exp int64
	fence    int64
	holder   string
}

// keyState is everything the tables hold about one key.
type keyState struct {
	ex      *excl
	shared  map[string]*hold // by lockId
	counter int64            // the fence counter (0: no counter row)
	// The holder row's per-key columns.
	waitSet     bool  // excl_wait_until_ms IS NOT NULL
	waitUntil   int64 // excl_wait_until_ms (0: a lapsed mark)
	delayUntil  int64 // delay_until_ms (0: NULL)
	revokedHash string
}

// data is the state Stores made by WithHolder share.
type data struct {
	mu    sync.Mutex
	keys  map[string]*keyState
	byID  map[string]string // the key of each exclusive row's and shared hold's lockId
	clock func() time.Time
}

// Store is the model store. It is safe for concurrent use: each call runs
// alone.
type Store struct {
	d       *data
	holder  string
	channel string
	notify  func(string)
	waited  func(string) bool
	watched func(string) bool
}

// New returns an empty model store.
func New(cfg Config) (*Store, error) {
	const op = "pg.New"
	if cfg.Clock == nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "model: nil Clock", nil)
	}
	h := cfg.Holder
	if h == "" {
		h = store.DefaultHolder()
	} else if len(h) > store.MaxHolderBytes {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "Holder must be 1-256 bytes of UTF-8", nil)
	}
	return &Store{d: &data{keys: map[string]*keyState{}, byID: map[string]string{}, clock: cfg.Clock}, holder: h,
		channel: cfg.NotifyChannel, notify: cfg.Notify, waited: cfg.Waited, watched: cfg.Watched}, nil
}

// WithHolder returns a Store on the same data that records holder as its
// identity: another process of the fleet.
func (s *Store) WithHolder(holder string) *Store {
	return &Store{d: s.d, holder: holder, channel: s.channel, notify: s.notify, waited: s.waited, watched: s.watched}
}

// SetFenceCounter sets key's fence counter to f, as an operator could
// (or a key's long life): for tests and simulators of the fence limit.
func (s *Store) SetFenceCounter(key string, f pglease.Fence) {
	k, err := keys.NormalizeKey(key)
	if err != nil {
		panic("model: SetFenceCounter: " + err.Error())
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.key(k).counter = int64(f)
}

// Holder returns the holder identity the Store records.
func (s *Store) Holder() string { return s.holder }

// MarkChecked does nothing: the model has no schema to check.
func (s *Store) MarkChecked() {}

func (d *data) nowMs() int64 { return d.clock().UnixMilli() }

func (d *data) key(k string) *keyState {
	ks := d.keys[k]
	if ks == nil {
		ks = &keyState{shared: map[string]*hold{}}
		d.keys[k] = ks
	}
	return ks
}

// check is {fn_check}: whether key can be granted now (limit -1 for an
// exclusive grant, 0 a reader, n > 0 a permit of n), writing the
// writer-waiting mark as the function does and deleting expired shared
// holds. It answers a grantable key with ok and a refused one with the
// refusal (its OK false).
type checked struct {
	wake   bool // the first shared attempt refused by a writer or a delay: wake the key's waiters
	ok     bool
	row    bool // the key has an exclusive row (a grant takes it over)
	exp    *int64
	retry  *int64
	holder *string
	shared int
}

func (d *data) check(k string, limit int, now int64) checked {
	ks := d.key(k)
	var c checked
	c.row = ks.ex != nil
	held := false
	if e := ks.ex; e != nil {
		delay := int64(0)
		if e.holderMatches {
			delay = e.delay
		}
		if e.exp+max(tolMs, delay) > now {
			held = true
			exp, at := e.exp, e.exp+max(tolMs, delay)
			c.exp, c.retry = &exp, &at
			if e.holderMatches && e.hasHolder {
				h := e.holder
				c.holder = &h
			}
		}
	}
	if !held && ks.delayUntil > now {
		held = true
		at := ks.delayUntil
		c.retry = &at
	}
	if held {
		if limit < 0 && ks.waitSet && ks.waitUntil < now+1800 {
			ks.waitUntil = now + 2000
		} else if limit >= 0 && !ks.waitSet {
			ks.waitSet, ks.waitUntil = true, 0
			c.wake = true
		}
		return c
	}
	if limit >= 0 && ks.waitSet && ks.waitUntil > now {
		at := ks.waitUntil
		c.retry = &at
		return c
	}
	var n, lmin, lmax int
	var vmin, vmax int64
	var sholder string
	first := true
	for id, h := range ks.shared {
		if h.exp+tolMs <= now {
			delete(ks.shared, id)
			delete(d.byID, id)
			continue
		}
		n++
		if first || h.exp < vmin {
			vmin = h.exp
		}
		if first || h.exp > vmax || (h.exp == vmax && h.holder > sholder) {
			vmax, sholder = h.exp, h.holder
		}
		if first || h.lim < lmin {
			lmin = h.lim
		}
		if first || h.lim > lmax {
			lmax = h.lim
		}
		first = false
	}
	if n == 0 {
		c.ok = true
		return c
	}
	c.shared = n
	refuse := func(exp, at int64) checked {
		c.exp, c.retry, c.holder = &exp, &at, &sholder
		return c
	}
	switch {
	case limit < 0:
		if !ks.waitSet || ks.waitUntil < now+1800 {
			ks.waitSet, ks.waitUntil = true, now+2000
		}
		return refuse(vmax, min(vmax+tolMs, now+tolMs))
	case limit == 0 && lmax > 0:
		return refuse(vmax, vmax+tolMs)
	case limit > 0 && n >= min(limit, lmin):
		if lmin == 0 {
			return refuse(vmax, vmax+tolMs)
		}
		return refuse(vmin, vmin+tolMs)
	}
	c.ok = true
	c.shared = 0
	return c
}

// refused converts a refusal into the AcquireResult the real store
// returns (store.lockedResult's rules).
func (c checked) refused(now int64) store.AcquireResult {
	var r store.AcquireResult
	if c.exp != nil {
		r.ExpiresAt = time.UnixMilli(*c.exp)
		if *c.exp+tolMs <= now {
			r.Delayed = true
		}
	}
	if c.retry != nil {
		r.RetryAfter = max(time.Duration(*c.retry-now)*time.Millisecond, 0)
	}
	if c.holder != nil {
		r.Holder = *c.holder
	}
	r.SharedHolders = c.shared
	return r
}

// grant is {fn_grant}: key to lockID exclusively at now; ok false at the
// fence limit (nothing written).
func (d *data) grant(k, lockID string, ttl, delay int64, holder string, now int64, row bool) (store.AcquireResult, bool) {
	ks := d.key(k)
	if ks.counter >= int64(keys.FenceMax) {
		return store.AcquireResult{}, false
	}
	ks.counter++
	d.setExcl(k, &excl{lockID: lockID, acq: now, exp: now + ttl, fence: ks.counter, holder: holder, hasHolder: true, delay: delay, holderMatches: true})
	if !row && ks.waitSet && ks.waitUntil > 0 {
		ks.waitUntil = 0
	}
	return store.AcquireResult{OK: true, LockID: lockID, Fence: pglease.Fence(ks.counter),
		AcquiredAt: time.UnixMilli(now), ExpiresAt: time.UnixMilli(now + ttl)}, true
}

// setExcl sets (e nil: deletes) key k's exclusive row.
func (d *data) setExcl(k string, e *excl) {
	ks := d.key(k)
	if ks.ex != nil {
		delete(d.byID, ks.ex.lockID)
	}
	ks.ex = e
	if e != nil {
		d.byID[e.lockID] = k
	}
}

// dropShared deletes a shared hold.
func (d *data) dropShared(h *hold) {
	delete(d.keys[h.key].shared, h.lockID)
	delete(d.byID, h.lockID)
}

func overflow(op string) store.AcquireResult {
	return store.AcquireResult{Err: pgerr.New(pglease.CodeInternal, op,
		"fence counter overflow: the key's fence would exceed 900000000000000; no lock granted", nil)}
}

// item is a validated acquire item.
type item struct {
	key, id    string
	ttl, delay int64
}

// prepare validates acquire items as the real store does (before I/O).
func prepare(op string, reqs []store.AcquireRequest) ([]item, error) {
	out := make([]item, len(reqs))
	seen := make(map[string]struct{}, len(reqs))
	for i, r := range reqs {
		k, err := keys.NormalizeKey(r.Key)
		if err != nil {
			return nil, store.WithOp(op, err)
		}
		if err := keys.ValidateTTL(r.TTL); err != nil {
			return nil, store.WithOp(op, err)
		}
		if err := checkDelay(op, "LockDelay", r.LockDelay); err != nil {
			return nil, err
		}
		id := r.LockID
		if id == "" {
			id = keys.NewLockID()
		} else if err := keys.ValidateLockID(id); err != nil {
			return nil, store.WithOp(op, err)
		}
		if _, dup := seen[id]; dup {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "duplicate lockId in one batch", nil)
		}
		seen[id] = struct{}{}
		out[i] = item{key: k, id: id, ttl: r.TTL.Milliseconds(), delay: r.LockDelay.Milliseconds()}
	}
	return out, nil
}

func checkDelay(op, what string, d time.Duration) error {
	switch {
	case d < 0:
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" must not be negative", nil)
	case d%time.Millisecond != 0:
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" must be a whole number of milliseconds", nil)
	case d > keys.MaxTTL():
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" too large: above MaxTTL", nil)
	}
	return nil
}

func tooLarge(op string) error {
	return pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
}

// AcquireMany is store.Store.AcquireMany.
func (s *Store) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) ([]store.AcquireResult, error) {
	const op = "pg.AcquireMany"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > store.MaxBatch {
		return nil, tooLarge(op)
	}
	if len(reqs) == 0 {
		return []store.AcquireResult{}, nil
	}
	items, err := prepare(op, reqs)
	if err != nil {
		return nil, err
	}
	n := &notes{s: s}
	defer n.send()
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	out := make([]store.AcquireResult, len(items))
	for i, it := range items {
		c := d.check(it.key, -1, now)
		if !c.ok {
			out[i] = c.refused(now)
			continue
		}
		r, ok := d.grant(it.key, it.id, it.ttl, it.delay, s.holder, now, c.row)
		if !ok {
			r = overflow(op)
		} else {
			n.watch(it.key, store.WatchGranted, int64(r.Fence))
		}
		out[i] = r
	}
	return out, nil
}

// AcquireSharedMany is store.Store.AcquireSharedMany.
func (s *Store) AcquireSharedMany(ctx context.Context, reqs []store.SharedRequest) ([]store.AcquireResult, error) {
	const op = "pg.AcquireSharedMany"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > store.MaxBatch {
		return nil, tooLarge(op)
	}
	if len(reqs) == 0 {
		return []store.AcquireResult{}, nil
	}
	acq := make([]store.AcquireRequest, len(reqs))
	for i, r := range reqs {
		if r.Limit < 0 || r.Limit > math.MaxInt32 {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "Limit must be 0 (a reader) or a positive int32 (a permit)", nil)
		}
		acq[i] = store.AcquireRequest{Key: r.Key, TTL: r.TTL, LockID: r.LockID}
	}
	items, err := prepare(op, acq)
	if err != nil {
		return nil, err
	}
	n := &notes{s: s}
	defer n.send()
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	out := make([]store.AcquireResult, len(items))
	for i, it := range items {
		lim := reqs[i].Limit
		c := d.check(it.key, lim, now)
		if c.wake {
			n.wake(it.key, true)
		}
		if !c.ok {
			out[i] = c.refused(now)
			continue
		}
		ks := d.key(it.key)
		fence := ks.counter
		if lim > 0 {
			if ks.counter >= int64(keys.FenceMax) {
				out[i] = overflow(op)
				continue
			}
			ks.counter++
			fence = ks.counter
		}
		ks.shared[it.id] = &hold{lockID: it.id, key: it.key, lim: lim, acq: now, exp: now + it.ttl, fence: fence, holder: s.holder}
		d.byID[it.id] = it.key
		n.watch(it.key, store.WatchSharedGranted, fence)
		out[i] = store.AcquireResult{OK: true, LockID: it.id, Fence: pglease.Fence(fence),
			AcquiredAt: time.UnixMilli(now), ExpiresAt: time.UnixMilli(now + it.ttl)}
	}
	return out, nil
}

// AcquireSets is store.Store.AcquireSets.
func (s *Store) AcquireSets(ctx context.Context, sets [][]store.AcquireRequest) ([][]store.AcquireResult, error) {
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
	if total > store.MaxBatch {
		return nil, tooLarge(op)
	}
	if total == 0 {
		return [][]store.AcquireResult{}, nil
	}
	flat := make([]store.AcquireRequest, 0, total)
	setOf := make([]int, 0, total)
	for i, set := range sets {
		seen := make(map[string]struct{}, len(set))
		for _, r := range set {
			k, err := keys.NormalizeKey(r.Key)
			if err != nil {
				return nil, store.WithOp(op, err)
			}
			if _, dup := seen[k]; dup {
				return nil, pgerr.New(pglease.CodeInvalidArgument, op, "a key given twice in one set", nil)
			}
			seen[k] = struct{}{}
			flat = append(flat, r)
			setOf = append(setOf, i)
		}
	}
	items, err := prepare(op, flat)
	if err != nil {
		return nil, err
	}
	n := &notes{s: s}
	defer n.send()
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	// Phase 1: check every item; a key in several sets goes to the first.
	setOK := make([]bool, len(sets))
	for i := range setOK {
		setOK[i] = true
	}
	const (
		stGrant = iota
		stHeld
		stOverflow
	)
	status := make([]int, total)
	checks := make([]checked, total)
	firstSet := map[string]int{}
	for i, it := range items {
		c := d.check(it.key, -1, now)
		checks[i] = c
		first, seen := firstSet[it.key]
		if !seen || first == setOf[i] {
			firstSet[it.key] = setOf[i]
		}
		switch {
		case c.ok && seen && first != setOf[i]:
			status[i] = stHeld
			checks[i] = checked{}
		case c.ok && d.key(it.key).counter >= int64(keys.FenceMax):
			status[i] = stOverflow
		case c.ok:
			status[i] = stGrant
		default:
			status[i] = stHeld
		}
		if status[i] != stGrant {
			setOK[setOf[i]] = false
		}
	}
	res := make([]store.AcquireResult, total)
	for i, it := range items {
		if !setOK[setOf[i]] {
			switch status[i] {
			case stHeld:
				res[i] = checks[i].refused(now)
			case stOverflow:
				res[i] = overflow(op)
			}
			continue
		}
		r, ok := d.grant(it.key, it.id, it.ttl, it.delay, s.holder, now, checks[i].row)
		if !ok {
			panic("model: fence counter changed under its row lock")
		}
		n.watch(it.key, store.WatchGranted, int64(r.Fence))
		res[i] = r
	}
	out := make([][]store.AcquireResult, len(sets))
	j := 0
	for i, set := range sets {
		out[i] = res[j : j+len(set) : j+len(set)]
		j += len(set)
	}
	return out, nil
}

// ExtendMany is store.Store.ExtendMany.
func (s *Store) ExtendMany(ctx context.Context, reqs []store.ExtendRequest) ([]store.ExtendResult, error) {
	const op = "pg.ExtendMany"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > store.MaxExtendBatch {
		return nil, tooLarge(op)
	}
	for _, r := range reqs {
		if err := keys.ValidateLockID(r.LockID); err != nil {
			return nil, store.WithOp(op, err)
		}
		if err := keys.ValidateTTL(r.TTL); err != nil {
			return nil, store.WithOp(op, err)
		}
	}
	if len(reqs) == 0 {
		return []store.ExtendResult{}, nil
	}
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	out := make([]store.ExtendResult, len(reqs))
	for i, r := range reqs {
		ttl := r.TTL.Milliseconds()
		if e, _ := d.findExcl(r.LockID); e != nil && e.exp > now {
			e.exp = now + ttl
			out[i] = store.ExtendResult{OK: true, ExpiresAt: time.UnixMilli(e.exp)}
			continue
		}
		if h := d.findShared(r.LockID); h != nil && h.exp > now {
			h.exp = now + ttl
			out[i] = store.ExtendResult{OK: true, ExpiresAt: time.UnixMilli(h.exp)}
			continue
		}
		hash := pglease.HashKey(r.LockID)
		for _, ks := range d.keys {
			if ks.revokedHash == hash {
				out[i].Revoked = true
				break
			}
		}
	}
	return out, nil
}

func (d *data) findExcl(lockID string) (*excl, string) {
	k, ok := d.byID[lockID]
	if ks := d.keys[k]; ok && ks.ex != nil && ks.ex.lockID == lockID {
		return ks.ex, k
	}
	return nil, ""
}

func (d *data) findShared(lockID string) *hold {
	if k, ok := d.byID[lockID]; ok {
		return d.keys[k].shared[lockID]
	}
	return nil
}

// notes collects a call's notifications, sent by send.
type notes struct {
	s   *Store
	out []string
}

// wake notes a wake-up of key: always, or (waited) when someone waits
// for it.
func (n *notes) wake(key string, waited bool) {
	if !waited || (n.s.waited != nil && n.s.waited(key)) {
		n.add(pglease.HashKey(key))
	}
}

// watch notes a watch event of key (ev, see store.WatchEvent) with fence.
func (n *notes) watch(key string, ev store.WatchEvent, fence int64) {
	if n.s.watched != nil && n.s.notify != nil && n.s.watched(key) {
		n.out = append(n.out, fmt.Sprintf("w:%s:%c:%015d", pglease.HashKey(key), ev, fence))
	}
}

func (n *notes) add(payload string) {
	if n.s.channel != "" && n.s.notify != nil {
		n.out = append(n.out, payload)
	}
}

// send hands the payloads to Config.Notify, each once, in order (call it
// after the model's lock is released).
func (n *notes) send() {
	seen := make(map[string]bool, len(n.out))
	for _, p := range n.out {
		if !seen[p] {
			seen[p] = true
			n.s.notify(p)
		}
	}
}

// ReleaseWaited is store.Store.ReleaseWaited: a lease is released while
// its expiry is after the clock (no release inside the tolerance).
func (s *Store) ReleaseWaited(ctx context.Context, reqs []store.ReleaseRequest) ([]bool, error) {
	const op = "pg.ReleaseWaited"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > store.MaxBatch {
		return nil, tooLarge(op)
	}
	for _, r := range reqs {
		if err := keys.ValidateLockID(r.LockID); err != nil {
			return nil, store.WithOp(op, err)
		}
		if _, err := keys.NormalizeKey(r.Key); err != nil {
			return nil, store.WithOp(op, err)
		}
	}
	if len(reqs) == 0 {
		return []bool{}, nil
	}
	n := &notes{s: s}
	defer n.send()
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	out := make([]bool, len(reqs))
	for i, r := range reqs {
		if e, k := d.findExcl(r.LockID); e != nil && e.exp > now {
			d.setExcl(k, nil)
			n.wake(k, true)
			n.watch(k, store.WatchReleased, e.fence)
			out[i] = true
			continue
		}
		if h := d.findShared(r.LockID); h != nil && h.exp > now {
			d.dropShared(h)
			n.wake(h.key, true)
			n.watch(h.key, store.WatchSharedReleased, h.fence)
			out[i] = true
		}
	}
	return out, nil
}

// HandOff is store.Store.HandOff.
func (s *Store) HandOff(ctx context.Context, reqs []store.HandOffRequest) ([]store.HandOffResult, error) {
	const op = "pg.HandOff"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > store.MaxBatch {
		return nil, tooLarge(op)
	}
	if len(reqs) == 0 {
		return []store.HandOffResult{}, nil
	}
	acq := make([]store.AcquireRequest, len(reqs))
	for i, r := range reqs {
		if err := keys.ValidateLockID(r.Old); err != nil {
			return nil, store.WithOp(op, err)
		}
		if r.LockID == r.Old {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "the new lockId must differ from the old one", nil)
		}
		acq[i] = store.AcquireRequest{Key: r.Key, TTL: r.TTL, LockID: r.LockID, LockDelay: r.LockDelay}
	}
	items, err := prepare(op, acq)
	if err != nil {
		return nil, err
	}
	n := &notes{s: s}
	defer n.send()
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	out := make([]store.HandOffResult, len(items))
	for i, it := range items {
		ks := d.key(it.key)
		e := ks.ex
		live := e != nil && e.lockID == reqs[i].Old && e.exp > now
		if live && ks.counter < int64(keys.FenceMax) {
			// In place: the holder row is rewritten, the waiting mark kept;
			// watchers hear the old lease's release, then the grant.
			n.watch(it.key, store.WatchReleased, ks.counter)
			ks.counter++
			n.watch(it.key, store.WatchGranted, ks.counter)
			d.setExcl(it.key, &excl{lockID: it.id, acq: now, exp: now + it.ttl, fence: ks.counter, holder: s.holder, hasHolder: true, delay: it.delay, holderMatches: true})
			out[i] = store.HandOffResult{Released: true, AcquireResult: store.AcquireResult{OK: true, LockID: it.id,
				Fence: pglease.Fence(ks.counter), AcquiredAt: time.UnixMilli(now), ExpiresAt: time.UnixMilli(now + it.ttl)}}
			continue
		}
		if live {
			// At the fence limit: the old lease is released (and its key
			// woken, waited for or not), nothing granted.
			d.setExcl(it.key, nil)
			n.wake(it.key, false)
			n.watch(it.key, store.WatchReleased, e.fence)
			out[i] = store.HandOffResult{Released: true, AcquireResult: overflow(op)}
			continue
		}
		c := d.check(it.key, -1, now)
		if !c.ok {
			out[i] = store.HandOffResult{AcquireResult: c.refused(now)}
			continue
		}
		r, ok := d.grant(it.key, it.id, it.ttl, it.delay, s.holder, now, c.row)
		if !ok {
			r = overflow(op)
		} else {
			n.watch(it.key, store.WatchGranted, int64(r.Fence))
		}
		out[i] = store.HandOffResult{AcquireResult: r}
	}
	return out, nil
}

// grantID is pg.GrantID of lockID.
func grantID(lockID string) string {
	sum := sha256.Sum256([]byte("pglease grant v1\x00" + lockID))
	return hex.EncodeToString(sum[:])
}

func holdMatches(hold, lockID string) bool {
	return hold == "" || hold == pglease.HashKey(lockID) || hold == grantID(lockID)
}

// Revoke is store.Store.Revoke.
func (s *Store) Revoke(ctx context.Context, reqs []store.RevokeRequest) ([]store.RevokeResult, error) {
	const op = "pg.Revoke"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > store.MaxBatch {
		return nil, tooLarge(op)
	}
	ks := make([]string, len(reqs))
	for i, r := range reqs {
		k, err := keys.NormalizeKey(r.Key)
		if err != nil {
			return nil, store.WithOp(op, err)
		}
		if err := checkDelay(op, "Delay", r.Delay); err != nil {
			return nil, err
		}
		if r.Hold != "" && !store.ValidHold(r.Hold) {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op,
				"a hold is named by its lockId's hash (24 lowercase hex digits) or its grant id (64)", nil)
		}
		ks[i] = k
	}
	if len(reqs) == 0 {
		return []store.RevokeResult{}, nil
	}
	n := &notes{s: s}
	defer n.send()
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	out := make([]store.RevokeResult, len(reqs))
	for i, r := range reqs {
		st := d.key(ks[i])
		res := store.RevokeResult{LockIDHashes: []string{}, Fences: []pglease.Fence{}}
		until := st.delayUntil
		var ldelay int64
		if e := st.ex; e != nil && e.holderMatches {
			ldelay = e.delay
		}
		if e := st.ex; e != nil && e.exp+tolMs > now && holdMatches(r.Hold, e.lockID) {
			d.setExcl(ks[i], nil)
			n.add("r:" + pglease.HashKey(ks[i]) + ":" + pglease.HashKey(e.lockID))
			n.wake(ks[i], true)
			n.watch(ks[i], store.WatchRevoked, e.fence)
			res.Revoked, res.Exclusive = 1, true
			res.LockIDHashes = append(res.LockIDHashes, pglease.HashKey(e.lockID))
			res.Fences = append(res.Fences, pglease.Fence(e.fence))
			st.revokedHash = pglease.HashKey(e.lockID)
		} else if e != nil && e.exp+tolMs <= now && e.exp+max(tolMs, ldelay) > now {
			until = max(until, e.exp+ldelay)
		}
		ids := make([]string, 0, len(st.shared))
		for id, h := range st.shared {
			if h.exp+tolMs > now && holdMatches(r.Hold, id) {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		for _, id := range ids {
			h := st.shared[id]
			d.dropShared(h)
			n.add("r:" + pglease.HashKey(ks[i]) + ":" + pglease.HashKey(id))
			n.wake(ks[i], true)
			n.watch(ks[i], store.WatchSharedReleased, h.fence)
			res.Revoked++
			res.LockIDHashes = append(res.LockIDHashes, pglease.HashKey(id))
			res.Fences = append(res.Fences, pglease.Fence(h.fence))
		}
		if res.Revoked > 0 {
			delay := r.Delay.Milliseconds()
			if delay == 0 && res.Exclusive {
				delay = ldelay
			}
			if delay > 0 {
				until = max(until, now+delay)
				st.delayUntil = until
			}
		}
		if until > now {
			res.DelayUntil = time.UnixMilli(until)
		}
		out[i] = res
	}
	return out, nil
}

// RequestRelease is store.Store.RequestRelease: it validates as the real
// one does and notifies the requests ("q:").
func (s *Store) RequestRelease(ctx context.Context, ks []string, holds []string) error {
	const op = "pg.RequestRelease"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if s.channel == "" {
		return pgerr.New(pglease.CodeInvalidArgument, op, "no NotifyChannel: nobody would hear the request", nil)
	}
	if len(ks) > store.MaxBatch {
		return tooLarge(op)
	}
	if holds != nil && len(holds) != len(ks) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "one hold per key, or none", nil)
	}
	n := &notes{s: s}
	for i, k := range ks {
		nk, err := keys.NormalizeKey(k)
		if err != nil {
			return store.WithOp(op, err)
		}
		p := "q:" + pglease.HashKey(nk)
		if holds != nil && holds[i] != "" {
			if !store.ValidHold(holds[i]) {
				return pgerr.New(pglease.CodeInvalidArgument, op,
					"a hold is named by its lockId's hash (24 lowercase hex digits) or its grant id (64)", nil)
			}
			p += ":" + holds[i]
		}
		n.add(p)
	}
	n.send()
	return nil
}

// LookupByKey is store.Store.LookupByKey.
func (s *Store) LookupByKey(ctx context.Context, key string) (*store.LockInfo, error) {
	const op = "pg.LookupByKey"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	k, err := keys.NormalizeKey(key)
	if err != nil {
		return nil, store.WithOp(op, err)
	}
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	ks := d.keys[k]
	if ks == nil || ks.ex == nil || ks.ex.exp+tolMs <= now {
		return nil, nil
	}
	e := ks.ex
	info := &store.LockInfo{KeyHash: pglease.HashKey(k), LockIDHash: pglease.HashKey(e.lockID),
		AcquiredAt: time.UnixMilli(e.acq), ExpiresAt: time.UnixMilli(e.exp), Fence: pglease.Fence(e.fence)}
	if e.holderMatches && e.hasHolder {
		info.Holder = e.holder
	}
	return info, nil
}

// Snapshot is store.Store.Snapshot: never Busy.
func (s *Store) Snapshot(ctx context.Context, keyList []string) ([]store.KeyState, error) {
	const op = "pg.Snapshot"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(keyList) > store.MaxBatch {
		return nil, tooLarge(op)
	}
	nks := make([]string, len(keyList))
	for i, k := range keyList {
		nk, err := keys.NormalizeKey(k)
		if err != nil {
			return nil, store.WithOp(op, err)
		}
		nks[i] = nk
	}
	if len(keyList) == 0 {
		return []store.KeyState{}, nil
	}
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.nowMs()
	out := make([]store.KeyState, len(nks))
	for i, k := range nks {
		st := store.KeyState{Now: time.UnixMilli(now)}
		if ks := d.keys[k]; ks != nil {
			if e := ks.ex; e != nil {
				st.Held = e.exp+tolMs > now
				st.LockIDHash, st.Fence = pglease.HashKey(e.lockID), pglease.Fence(e.fence)
				st.AcquiredAt, st.ExpiresAt = time.UnixMilli(e.acq), time.UnixMilli(e.exp)
				if e.holderMatches {
					if e.hasHolder {
						st.Holder = e.holder
					}
					st.LockDelay = time.Duration(e.delay) * time.Millisecond
				}
			}
			var sexp int64
			for _, h := range ks.shared {
				if h.exp+tolMs <= now {
					continue
				}
				if st.Shared == 0 || h.lim < st.Limit {
					st.Limit = h.lim
				}
				st.Shared++
				sexp = max(sexp, h.exp)
			}
			if st.Shared > 0 {
				st.SharedExpiresAt = time.UnixMilli(sexp)
			}
			st.Counter = pglease.Fence(ks.counter)
			if ks.delayUntil > now {
				st.DelayUntil = time.UnixMilli(ks.delayUntil)
			}
			if ks.waitSet && ks.waitUntil > now {
				st.WriterWaitingUntil = time.UnixMilli(ks.waitUntil)
			}
		}
		out[i] = st
	}
	return out, nil
}

// Guard is store.Store.Guard without the row lock: the lease lockID holds
// must be live (its expiry after the clock) and exclusive; tx is only
// checked for nil.
func (s *Store) Guard(ctx context.Context, tx store.DB, lockID string) (store.GuardResult, error) {
	const op = "pg.Guard"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return store.GuardResult{}, err
	}
	if store.IsNilDB(tx) {
		return store.GuardResult{}, pgerr.New(pglease.CodeInvalidArgument, op, "nil transaction", nil)
	}
	if err := keys.ValidateLockID(lockID); err != nil {
		return store.GuardResult{}, store.WithOp(op, err)
	}
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, _ := d.findExcl(lockID); e != nil && e.exp > d.nowMs() {
		return store.GuardResult{Fence: pglease.Fence(e.fence), ExpiresAt: time.UnixMilli(e.exp)}, nil
	}
	return store.GuardResult{}, pgerr.New(pglease.CodeLockLost, op, "the lease is no longer held (released, expired, revoked or taken over)", nil)
}
