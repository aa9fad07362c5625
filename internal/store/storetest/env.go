package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// env is a test's harness plus the helpers the cases share.
type env struct {
	*Harness
	t *testing.T
}

// Durations the cases use: long enough that a loaded machine never lets a
// lease meant to be live expire between two calls, short enough that an
// expiry the test waits for passes soon.
const (
	long  = time.Minute           // a lease that stays live for the whole test
	short = 50 * time.Millisecond // a lease the test lets expire
	delay = 30 * time.Second      // a lock delay that stays in force for the whole test
)

func (e *env) ctx() context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e.t.Cleanup(cancel)
	return c
}

// acquire takes key exclusively on s (one item of AcquireMany).
func (e *env) acquire(s Store, key string, ttl time.Duration) store.AcquireResult {
	e.t.Helper()
	return e.acquireReq(s, store.AcquireRequest{Key: key, TTL: ttl, LockID: keys.NewLockID()})
}

func (e *env) acquireReq(s Store, req store.AcquireRequest) store.AcquireResult {
	e.t.Helper()
	res, err := s.AcquireMany(e.ctx(), []store.AcquireRequest{req})
	if err != nil {
		e.t.Fatalf("AcquireMany: %v", err)
	}
	if len(res) != 1 {
		e.t.Fatalf("AcquireMany: %d results for 1 item", len(res))
	}
	if res[0].Err != nil {
		e.t.Fatalf("AcquireMany item: %v", res[0].Err)
	}
	return res[0]
}

// mustAcquire takes key and fails the test when it is refused.
func (e *env) mustAcquire(s Store, key string, ttl time.Duration) store.AcquireResult {
	e.t.Helper()
	r := e.acquire(s, key, ttl)
	if !r.OK {
		e.t.Fatalf("acquire of a free key refused: %+v", r)
	}
	return r
}

// shared takes a shared hold (limit 0: a reader; n: a permit of n).
func (e *env) shared(s Store, key string, ttl time.Duration, limit int) store.AcquireResult {
	e.t.Helper()
	res, err := s.AcquireSharedMany(e.ctx(), []store.SharedRequest{{Key: key, TTL: ttl, LockID: keys.NewLockID(), Limit: limit}})
	if err != nil {
		e.t.Fatalf("AcquireSharedMany: %v", err)
	}
	if len(res) != 1 || res[0].Err != nil {
		e.t.Fatalf("AcquireSharedMany: %+v", res)
	}
	return res[0]
}

func (e *env) mustShared(s Store, key string, ttl time.Duration, limit int) store.AcquireResult {
	e.t.Helper()
	r := e.shared(s, key, ttl, limit)
	if !r.OK {
		e.t.Fatalf("shared hold (limit %d) refused: %+v", limit, r)
	}
	return r
}

func (e *env) release(s Store, key string, ids ...string) []bool {
	e.t.Helper()
	reqs := make([]store.ReleaseRequest, len(ids))
	for i, id := range ids {
		reqs[i] = store.ReleaseRequest{LockID: id, Key: key}
	}
	res, err := s.ReleaseWaited(e.ctx(), reqs)
	if err != nil {
		e.t.Fatalf("ReleaseWaited: %v", err)
	}
	if len(res) != len(ids) {
		e.t.Fatalf("ReleaseWaited: %d results for %d items", len(res), len(ids))
	}
	return res
}

func (e *env) extend(s Store, id string, ttl time.Duration) store.ExtendResult {
	e.t.Helper()
	res, err := s.ExtendMany(e.ctx(), []store.ExtendRequest{{LockID: id, TTL: ttl}})
	if err != nil {
		e.t.Fatalf("ExtendMany: %v", err)
	}
	if len(res) != 1 {
		e.t.Fatalf("ExtendMany: %d results for 1 item", len(res))
	}
	return res[0]
}

func (e *env) snapshot(s Store, key string) store.KeyState {
	e.t.Helper()
	res, err := e.snapshotMany(s, []string{key})
	if err != nil {
		e.t.Fatalf("Snapshot: %v", err)
	}
	return res[0]
}

// snapshotMany reads ks with Snapshot, again while a key is busy. The
// test does nothing in flight on its keys, but a key's advisory lock is
// hashtext of its name in every lock table of the database (SyncGuard's
// rule), and the tests run in parallel, each on tables of its own with
// the same key names: another test's change of its "k" makes this one's
// "k" busy for a moment. Busy for 10 s is a failure.
func (e *env) snapshotMany(s Store, ks []string) ([]store.KeyState, error) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := s.Snapshot(e.ctx(), ks)
		if err != nil {
			return res, err
		}
		if len(res) != len(ks) {
			e.t.Fatalf("Snapshot: %d results for %d keys", len(res), len(ks))
		}
		busy := false
		for _, r := range res {
			busy = busy || r.Busy
		}
		if !busy {
			return res, nil
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Snapshot: a key busy for 10 s with nothing in flight: %+v", res)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *env) revoke(s Store, req store.RevokeRequest) store.RevokeResult {
	e.t.Helper()
	res, err := s.Revoke(e.ctx(), []store.RevokeRequest{req})
	if err != nil {
		e.t.Fatalf("Revoke: %v", err)
	}
	if len(res) != 1 {
		e.t.Fatalf("Revoke: %d results for 1 item", len(res))
	}
	return res[0]
}

// expire lets a lease of ttl granted before the call expire for
// acquirers too: ttl plus the time tolerance, and a margin for the
// millisecond rounding.
func (e *env) expire(ttl time.Duration) {
	e.t.Helper()
	e.Advance(e.t, ttl+keys.TimeTolerance+10*time.Millisecond)
}

// refused checks that r is a refusal.
func (e *env) refused(what string, r store.AcquireResult) {
	e.t.Helper()
	if r.OK || r.Err != nil {
		e.t.Fatalf("%s: want refused, got %+v", what, r)
	}
}

// invalid checks that err is InvalidArgument.
func (e *env) invalid(what string, err error) {
	e.t.Helper()
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		e.t.Fatalf("%s: want InvalidArgument, got %v", what, err)
	}
}

// within checks that d is in [lo, hi].
func (e *env) within(what string, d, lo, hi time.Duration) {
	e.t.Helper()
	if d < lo || d > hi {
		e.t.Fatalf("%s = %v, want within [%v, %v]", what, d, lo, hi)
	}
}

// between checks lo <= x <= hi for times (whole milliseconds).
func (e *env) between(what string, x, lo, hi time.Time) {
	e.t.Helper()
	if x.Before(lo.Truncate(time.Millisecond)) || x.After(hi) {
		e.t.Fatalf("%s = %v, want within [%v, %v]", what, x.UnixMilli(), lo.UnixMilli(), hi.UnixMilli())
	}
}
