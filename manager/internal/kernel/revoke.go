package kernel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager/internal/notifier"
)

// Revocation and release requests.
//
// Revoke deletes a key's live holds on the server (its exclusive lease, or
// its readers or permits; all, or the ones named), whoever holds them, in
// one durable statement (store.Revoke) that also notifies
// "r:" + HashKey(key) + ":" + HashKey(lockId) on the notify channel for
// each. Every
// Manager's listener receives it; the holder's loop finds the lock of that
// key whose lockId has that hash (handleRevoked) and ends it at once:
// its Context with a cause matching pglease.ErrRevoked, no more extends,
// no release (the row is gone), not kept as a lost lease's row is. A
// revoke made by this Manager also tells its own loop directly, so a
// holder here learns even without a listener. A holder whose listener
// missed the notification (reconnecting) learns at its next extend, which
// finds no row and reads the revoke's record of the lockId (the holders
// table's revoked_lock_hash, kept until the key's next revoke), so the
// lock ends as revoked all the same (handleExtendDone); a row gone
// otherwise (expired and taken over, deleted by hand) is ErrLockLost. A revoke notification that
// comes before the grant it revokes was answered here (the grant's answer
// and the notification race) is remembered for a while (revokedEarly),
// and the grant ends as revoked as soon as it is made.
//
// RequestRelease only notifies "q:" + HashKey(key) (+ ":" + a hold): the
// holders' loops close ReleaseRequested of their locks of that key (or of
// the hold named; this Manager's loop is told directly too); the holder
// decides.

// revokedEarlyFor is how long a revoke notification that matched no lock
// held here is remembered, for a grant of the key still in flight, and
// maxRevokedEarly how many are.
const (
	revokedEarlyFor = 10 * time.Second
	maxRevokedEarly = 1024
)

// revokedCause is the cause of a revoked lock's Context.
func revokedCause() error {
	return pgerr.New(pglease.CodeRevoked, "manager.Lock", "the lease was revoked (deleted on the server by a revoke)", nil)
}

// Revoke is Manager.Revoke.
func (m *Kernel) Revoke(ctx context.Context, key string, holds ...string) (revoked int, notBefore time.Time, err error) {
	const op = "manager.Revoke"
	nk, err := m.CheckKeyCall(op, ctx, key)
	if err != nil {
		return 0, time.Time{}, err
	}
	reqs, err := holdRequests(op, nk, holds)
	if err != nil {
		return 0, time.Time{}, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	ctx, db := m.Rec.StartDB(ctx, obs.OpRevoke, len(reqs), trace.SpanContextFromContext(ctx))
	res, err := m.Store.Revoke(ctx, reqs)
	if err != nil {
		db.End(0, err)
		return 0, time.Time{}, callErr(op, err)
	}
	var hashes []string
	for _, r := range res {
		revoked += r.Revoked
		hashes = append(hashes, r.LockIDHashes...)
		if r.DelayUntil.After(notBefore) {
			notBefore = r.DelayUntil
		}
	}
	db.End(revoked, nil)
	// A holder may be here: tell the loop now (the notification comes
	// too, and finds nothing left to do).
	kh := pglease.HashKey(nk)
	for _, h := range hashes {
		n := notifier.Of(store.Notification{Kind: store.NotifyRevoke, KeyHash: kh, LockIDHash: h})
		select {
		case m.notifyCh <- n:
		case <-m.Done:
		case <-ctx.Done(): // the notification will do
		}
	}
	return revoked, notBefore, nil
}

// holdRequests is the revoke items of key: one for every hold, or one
// per hold named (checked).
func holdRequests(op, key string, holds []string) ([]store.RevokeRequest, error) {
	if len(holds) == 0 {
		return []store.RevokeRequest{{Key: key}}, nil
	}
	if len(holds) > store.MaxBatch {
		return nil, Invalid(op, "too many holds named in one call")
	}
	reqs := make([]store.RevokeRequest, len(holds))
	for i, h := range holds {
		if !store.ValidHold(h) {
			return nil, Invalid(op, "a hold is named by its grant id (Lock.GrantID: 64 lowercase hex digits) or its lockId's hash (pglease.HashKey: 24)")
		}
		reqs[i] = store.RevokeRequest{Key: key, Hold: h}
	}
	return reqs, nil
}

// RequestRelease is Manager.RequestRelease.
func (m *Kernel) RequestRelease(ctx context.Context, key string, holds ...string) error {
	const op = "manager.RequestRelease"
	nk, err := m.CheckKeyCall(op, ctx, key)
	if err != nil {
		return err
	}
	reqs, err := holdRequests(op, nk, holds)
	if err != nil {
		return err
	}
	if m.cfg.DisableNotify {
		return Invalid(op, "notifications are off (Config.DisableNotify): no holder would hear the request")
	}
	ks, hs := make([]string, len(reqs)), make([]string, len(reqs))
	for i, r := range reqs {
		ks[i], hs[i] = r.Key, r.Hold
	}
	ctx, cancel := context.WithTimeoutCause(ctx, m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	ctx, db := m.Rec.StartDB(ctx, obs.OpRequestRelease, len(reqs), trace.SpanContextFromContext(ctx))
	err = m.Store.RequestRelease(ctx, ks, hs)
	db.End(len(reqs), err)
	if err != nil {
		return callErr(op, err)
	}
	// A holder here hears it at once, listener or not.
	for _, h := range hs {
		n := notifier.Of(store.Notification{Kind: store.NotifyReleaseRequest, KeyHash: pglease.HashKey(nk), Hold: h})
		select {
		case m.notifyCh <- n:
		case <-m.Done:
		case <-ctx.Done(): // the notification will do
		}
	}
	return nil
}

// CheckKeyCall validates a call on key: ctx, the key (returned in NFC)
// and that the Manager is open.
func (m *Kernel) CheckKeyCall(op string, ctx context.Context, key string) (string, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return "", err
	}
	nk, err := keys.NormalizeKey(key)
	if err != nil {
		var e *pglease.Error
		if errors.As(err, &e) {
			return "", pgerr.New(e.Code, op, e.Msg, nil)
		}
		return "", Reop(op, err)
	}
	if m.IsClosing() {
		return "", ClosedErr(op)
	}
	return nk, nil
}

// callErr labels a store error with the Manager's operation, keeping its
// code and the store's error as the cause.
func callErr(op string, err error) error {
	var e *pglease.Error
	if !errors.As(err, &e) {
		return pgerr.New(pglease.CodeInternal, op, "unexpected error", err)
	}
	return pgerr.New(e.Code, op, e.Msg, err)
}

// handleRevoked ends the lock held here (exclusive or shared) whose key
// and lockId have the notification's hashes (the revoked grant), if any; otherwise
// it remembers the notification for a grant still in flight. A revoke is
// rare, and every Manager on the channel hears every one: the held locks
// (and keys) are searched rather than indexed by hash, which would cost
// every held lock memory.
func (st *LoopState) handleRevoked(n store.Notification) {
	for h := range st.held {
		if h.ks.hash == n.KeyHash && pglease.HashKey(h.lock.ID) == n.LockIDHash {
			st.revoke(h)
			return
		}
	}
	// Remembered only for a key this process is busy with (an attempt
	// in flight may bring the revoked grant): the other processes' revokes
	// cost nothing more.
	busy := false
	for _, ks := range st.keys {
		if ks.hash == n.KeyHash {
			busy = true
			break
		}
	}
	if !busy {
		return
	}
	if st.revokedEarly == nil {
		st.revokedEarly = make(map[string]time.Time)
	}
	now := st.m.Now()
	if len(st.revokedEarly) >= maxRevokedEarly {
		for k, until := range st.revokedEarly {
			if now.After(until) || len(st.revokedEarly) >= maxRevokedEarly {
				delete(st.revokedEarly, k)
			}
		}
	}
	st.revokedEarly[n.LockIDHash] = now.Add(revokedEarlyFor)
	st.sig().RevokeKept.signal(n.LockIDHash)
}

// checkRevokedEarly ends h, just granted, if a revoke of its grant was
// heard before (handleRevoked): the notification overtook the grant's
// answer. Free while no revoke is remembered.
func (st *LoopState) checkRevokedEarly(h *holding) {
	if len(st.revokedEarly) == 0 {
		return
	}
	hash := pglease.HashKey(h.lock.ID)
	until, ok := st.revokedEarly[hash]
	if !ok {
		return
	}
	delete(st.revokedEarly, hash)
	if st.m.Now().Before(until) {
		st.revoke(h)
	}
}

// revoke ends h as revoked: its Context ends with ErrRevoked, it is no
// longer extended, and its row, deleted by the revoke, is neither
// released nor kept. Waiters here try the key at once (the server makes
// them wait out a lock delay, and says until when).
func (st *LoopState) revoke(h *holding) {
	ks := h.ks
	st.dropHolding(h, revokedCause())
	h.acq.Lost(obs.LossRevoked, trace.SpanContext{})
	st.sig().revoked.signal(ks.Key)
	st.forceKick(ks)
	st.kickSets(ks) // set waiters that want the key (sets.go)
	st.gc(ks)
}

// handleReleaseRequest closes ReleaseRequested of every lock of the key
// with the notification's hash held here (or of the one hold it names).
func (st *LoopState) handleReleaseRequest(n store.Notification) {
	for h := range st.held {
		if h.ks.hash == n.KeyHash && store.HoldMatches(n.Hold, h.lock.ID) {
			h.lock.requestSignal().Close()
			st.sig().releaseRequested.signal(h.ks.Key)
		}
	}
}

// releaseRequest is a Lock's ReleaseRequested channel, made on first use
// (most locks never need one).
type releaseRequest struct {
	ch   chan struct{}
	once sync.Once
}

func (r *releaseRequest) Close() { r.once.Do(func() { close(r.ch) }) }

// requestSignal returns l's releaseRequest, making it if needed. Safe
// from any goroutine.
func (l *Hold) requestSignal() *releaseRequest {
	if r := (*releaseRequest)(atomic.LoadPointer(&l.rq)); r != nil {
		return r
	}
	r := &releaseRequest{ch: make(chan struct{})}
	if atomic.CompareAndSwapPointer(&l.rq, nil, unsafe.Pointer(r)) {
		return r
	}
	return (*releaseRequest)(atomic.LoadPointer(&l.rq))
}

// ReleaseRequested is Lock.ReleaseRequested.
func (l *Hold) ReleaseRequested() <-chan struct{} {
	if l == nil || l.M == nil {
		return nil
	}
	return l.requestSignal().ch
}
