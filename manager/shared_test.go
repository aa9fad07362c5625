package manager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg/advisory"
)

// TestPrimitivesBadInputNoIO: bad input to the shared, set and Guard
// calls is InvalidArgument before any query.
func TestPrimitivesBadInputNoIO(t *testing.T) {
	t.Parallel()
	qc, qn := queryCounter("", "")
	b := setup(t, setupOpts{pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc }}})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "guard:bad")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	rd, err := b.m.Acquire(ctx, "guard:reader", Shared())
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Release(ctx)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	before := qn.Load()
	//nolint:staticcheck // nil context on purpose
	var nilCtx context.Context
	many := make([]string, 101)
	for i := range many {
		many[i] = "k" + string(rune('a'+i%26)) + strings.Repeat("x", i)
	}
	all := func(ctx context.Context, keys []string, opts ...AcquireOption) error {
		_, err := b.m.AcquireAll(ctx, keys, opts...)
		return err
	}
	cases := []struct {
		name string
		err  error
	}{
		{"WithLimit(0)", func() error { _, err := b.m.Acquire(ctx, "k", WithLimit(0)); return err }()},
		{"WithLimit(-1)", func() error { _, err := b.m.Acquire(ctx, "k", WithLimit(-1)); return err }()},
		{"Shared with WithLimit(0)", func() error { _, err := b.m.Acquire(ctx, "k", Shared(), WithLimit(0)); return err }()},
		{"try WithLimit(-1)", func() error { _, _, err := b.m.TryAcquire(ctx, "k", WithLimit(-1)); return err }()},
		{"Do WithLimit(0)", b.m.Do(ctx, "k", func(context.Context, *Lock) error { return nil }, WithLimit(0))},
		{"shared nil ctx", func() error { _, err := b.m.Acquire(nilCtx, "k", Shared()); return err }()},
		{"advisory Shared", func() error { _, err := b.m.LockAdvisory(ctx, advisory.Int64(1), Shared()); return err }()},
		{"AcquireAll nil ctx", all(nilCtx, []string{"a", "b"})},
		{"AcquireAll no keys", all(ctx, nil)},
		{"AcquireAll empty key", all(ctx, []string{"a", ""})},
		{"AcquireAll duplicate", all(ctx, []string{"a", "b", "a"})},
		{"AcquireAll duplicate after NFC", all(ctx, []string{"caf\u00e9", "cafe\u0301"})},
		{"AcquireAll 101 keys", all(ctx, many)},
		{"AcquireAll Shared", all(ctx, []string{"a", "b"}, Shared())},
		{"AcquireAll WithLimit", all(ctx, []string{"a", "b"}, WithLimit(2))},
		{"AcquireAll ttl 0", all(ctx, []string{"a", "b"}, WithTTL(0))},
		{"TryAcquireAll nil ctx", func() error { _, _, err := b.m.TryAcquireAll(nilCtx, []string{"a"}); return err }()},
		{"TryAcquireAll duplicate", func() error { _, _, err := b.m.TryAcquireAll(ctx, []string{"a", "a"}); return err }()},
		{"Guard nil ctx", lk.Guard(nilCtx, tx)},
		{"Guard nil tx", lk.Guard(ctx, nil)},
		{"Guard shared", rd.Guard(ctx, tx)},
		{"Guard nil lock", (*Lock)(nil).Guard(ctx, tx)},
	}
	for _, c := range cases {
		if !errors.Is(c.err, pglease.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want InvalidArgument", c.name, c.err)
		}
	}
	if n := qn.Load() - before; n != 0 {
		t.Errorf("%d queries for bad input", n)
	}
}

// TestLimitDisagreementWaits: a permit whose limit disagrees with the
// key's live holders', or a reader among permits, is contention, never an
// error, whether the holders are this process's callers (no query: the
// local holds tell) or another process's: a try answers "locked", an
// Acquire waits (here until its timeout). With the holders' limit lower,
// the caller's permits are held to it; with theirs higher, the caller's
// applies.
func TestLimitDisagreementWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	peer, _ := b.newPeer(t, Config{})
	var held []*Lock
	for range 3 {
		p, err := b.m.Acquire(ctx, "sem:mismatch", WithLimit(3))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	for _, c := range []struct {
		name string
		m    *Manager
		opt  AcquireOption
	}{
		{"local limit", b.m, WithLimit(5)},
		{"local reader", b.m, Shared()},
		{"remote limit", peer, WithLimit(5)},
		{"remote reader", peer, Shared()},
	} {
		_, err := c.m.Acquire(ctx, "sem:mismatch", c.opt, WithAcquireTimeout(300*time.Millisecond))
		if !errors.Is(err, pglease.ErrAcquisitionTimeout) || !pglease.Retryable(err) {
			t.Errorf("%s: %v, want AcquisitionTimeout (retryable)", c.name, err)
		}
		_, ok, err := c.m.TryAcquire(ctx, "sem:mismatch", c.opt)
		if ok || err != nil {
			t.Errorf("%s: try %v %v, want locked", c.name, ok, err)
		}
	}
	// Two permits of limit 3 left: a limit-5 caller of either process may
	// take one (2 < 3), not two.
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	p5, err := peer.Acquire(ctx, "sem:mismatch", WithLimit(5))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.m.TryAcquire(ctx, "sem:mismatch", WithLimit(5)); ok || err != nil {
		t.Fatalf("a 4th permit under a live limit of 3: %v %v, want locked", ok, err)
	}
	for _, lk := range append(held[1:], p5) {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// No holder left: another limit applies.
	p3, err := peer.Acquire(ctx, "sem:mismatch", WithLimit(5))
	if err != nil {
		t.Fatal(err)
	}
	if err := p3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantNoShared(t, b)
}

// TestSharedWaitersCoalesced: readers queued behind a local writer are
// tried together when it releases: one statement with one item each, all
// granted, all with the writer's fence (the state they read).
func TestSharedWaitersCoalesced(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	const key, readers = "rw:coalesce", 10
	w, err := b.m.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// The writer's own Acquire was queued too: its signal must not count
	// as a reader's.
	drain(&b.sig.Queued)
	got := make(chan *Lock, readers)
	for range readers {
		go func() {
			lk, err := b.m.Acquire(ctx, key, Shared())
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
	}
	for range readers {
		waitFor(t, &b.sig.Queued, func(k string) bool { return k == key })
	}
	drain(&b.sig.BatchSent)
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	bi := waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindShared })
	if bi.N != readers {
		t.Errorf("the readers' first attempt carried %d holds, want %d", bi.N, readers)
	}
	for range readers {
		lk := <-got
		if lk == nil {
			t.FailNow()
		}
		if lk.Fence() != w.Fence() {
			t.Errorf("reader fence %v, want the writer's %v", lk.Fence(), w.Fence())
		}
		defer lk.Release(ctx)
	}
	if n, err := countShared(ctx, b, key); err != nil || n != readers {
		t.Fatalf("%d shared rows (%v), want %d", n, err, readers)
	}
}

// countShared counts key's live shared holds.
func countShared(ctx context.Context, b *bundle, key string) (int, error) {
	n, _, err := liveCounts(ctx, b.admin, key)
	return n, err
}

// TestSharedReleaseNotHandedOver: a writer waits behind two local readers.
// The first reader's release must not hand the key to the writer (the
// store hands over exclusive leases only, and the other reader still holds
// it), and the second's lets the writer in at once: no reader's row is left
// to expire.
func TestSharedReleaseNotHandedOver(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	const key = "rw:handoff"
	ttl := WithTTL(time.Minute)
	r1, err := b.m.Acquire(ctx, key, Shared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.m.Acquire(ctx, key, Shared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	wl := make(chan *Lock, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, key, ttl)
		if err != nil {
			t.Error(err)
		}
		wl <- lk
	}()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == key }) // refused: readers hold it
	drain(&b.sig.BatchSent)
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wl:
		t.Fatal("the writer got the key while a reader held it")
	case <-time.After(200 * time.Millisecond):
	}
	t0 := time.Now()
	if err := r2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var w *Lock
	select {
	case w = <-wl:
	case <-time.After(10 * time.Second):
		t.Fatal("the writer did not get the key after the last reader's release")
	}
	t.Logf("writer granted %v after the last reader's release", time.Since(t0))
	for len(b.sig.BatchSent.Ch) > 0 {
		if bi := <-b.sig.BatchSent.Ch; bi.Kind == kernel.KindHandOff {
			t.Error("a shared release was handed over")
		}
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantNoShared(t, b)
}

// TestSharedLocksLikeLeases: a reader and a permit are extended by the
// heartbeat (their server expiry moves), Extend works on them, they are
// released by Release and by Close, and TryAcquire answers from what
// this process holds: a reader among readers goes to the server, an
// exclusive try or a permit of a full semaphore does not.
func TestSharedLocksLikeLeases(t *testing.T) {
	t.Parallel()
	// Only acquire statements are counted: the heartbeat's extends go on
	// meanwhile.
	qc, qn := queryCounter("pglease_acquire", "")
	b := setup(t, setupOpts{pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc }}})
	ctx := ctxT(t)
	// A TTL whose heartbeat (every TTL/3) keeps the leases on a loaded
	// machine: a shorter one can be lost there, which is right (the
	// extend did not come back within the trust window) but not the point.
	const ttl = 3 * time.Second
	rd, err := b.m.Acquire(ctx, "rw:like", Shared(), WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.m.Acquire(ctx, "sem:like", WithLimit(1), WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// Several heartbeats: each moves the expiry by about TTL/3.
	waitExtended(t, rd, rd.ExpiresAt(), ttl/2)
	waitExtended(t, p, p.ExpiresAt(), ttl/2)
	if err := p.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	before := qn.Load()
	if _, ok, err := b.m.TryAcquire(ctx, "rw:like"); ok || err != nil {
		t.Errorf("exclusive try among readers: %v %v", ok, err)
	}
	if _, ok, err := b.m.TryAcquire(ctx, "sem:like", WithLimit(1)); ok || err != nil {
		t.Errorf("permit try of a full semaphore: %v %v", ok, err)
	}
	if n := qn.Load() - before; n != 0 {
		t.Errorf("%d queries for tries this process answers", n)
	}
	rd2, ok, err := b.m.TryAcquire(ctx, "rw:like", Shared())
	if !ok || err != nil {
		t.Fatalf("reader try among readers: %v %v", ok, err)
	}
	if err := rd.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rd2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// p stays held: Close releases it.
	if err := b.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(p.Err(), pglease.ErrClosed) {
		t.Errorf("permit after Close: %v", p.Err())
	}
	wantNoShared(t, b)
}

// TestPermitFenceCheck: the fence-regression check applies to exclusive
// grants (above every fence seen) and permits (above every fence seen
// when their attempt was made: two permits' answers may cross), not to
// readers (a reader's fence is the counter as it was, which repeats).
func TestPermitFenceCheck(t *testing.T) {
	st := &kernel.LoopState{Fences: map[string]pglease.Fence{}}
	ks := &kernel.KeyState{Key: "k"}
	ks.Fence, ks.HasFence = 10, true
	mk := func(shared bool, limit int32) *kernel.Attempt {
		a := &kernel.Attempt{Ks: ks, Kind: kernel.ExclusiveKind{}}
		if shared {
			a.Kind = &kernel.SharedKind{Limit: limit, Floor: ks.Fence, HasFloor: ks.HasFence}
		}
		return a
	}
	checkFence := func(a *kernel.Attempt, f pglease.Fence) bool {
		return a.Kind.FenceOK(st, a, 0, 1, []store.AcquireResult{{Fence: f}})
	}
	p1, p2 := mk(true, 4), mk(true, 4)
	if !checkFence(p2, 12) || !checkFence(p1, 11) {
		t.Fatal("permits whose answers crossed were refused")
	}
	if ks.Fence != 12 {
		t.Fatalf("highest fence seen %v, want 12", ks.Fence)
	}
	if checkFence(mk(true, 4), 12) {
		t.Error("a permit at a fence already seen before its attempt was accepted")
	}
	if !checkFence(mk(true, 0), 3) {
		t.Error("a reader's fence was checked")
	}
	if checkFence(mk(false, 0), 12) || !checkFence(mk(false, 0), 13) {
		t.Error("exclusive grants: not strictly above every fence seen")
	}
}
