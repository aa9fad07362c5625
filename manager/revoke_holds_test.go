package manager

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// serverMs is the server's clock in ms.
func serverMs(t *testing.T, b *bundle) int64 {
	t.Helper()
	var now int64
	if err := b.admin.QueryRow(ctxT(t), "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// waitServerMs polls until the server's clock reaches ms.
func waitServerMs(t *testing.T, b *bundle, ms int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for now := serverMs(t, b); now < ms; now = serverMs(t, b) {
		if time.Now().After(deadline) {
			t.Fatal("the server's clock did not advance")
		}
		time.Sleep(time.Duration(min(ms-now, 50)) * time.Millisecond)
	}
}

// ended waits (bounded) for lk's Context to end and returns its cause.
func ended(t *testing.T, lk *Lock) error {
	t.Helper()
	select {
	case <-lk.Done():
		return context.Cause(lk.Context())
	case <-time.After(waitTimeout()):
		t.Fatalf("lock of %s (fence %v) still held", lk.Key(), lk.Fence())
		return nil
	}
}

// A lease taken WithLockDelay(3 s) with a TTL of 500 ms is left to expire;
// 1.3 s after its expiry another Manager's TryAcquire is refused; a revoke
// then (Manager.Revoke, or the SQL function) revokes nothing, says so and
// says when the delay ends, and the key is still refused until expiry +
// 3 s. The holder's Release of the expired lease does not free it either,
// and a waiting Acquire (a takeover) gets it only at expiry + 3 s.
func TestRevokeKeepsLockDelay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	peer, _ := b.newPeer(t, Config{})
	const delay = 3 * time.Second
	for _, via := range []string{"Revoke", "SQL", "Release"} {
		key := "delay:seam:" + via
		lk, err := b.m.Acquire(ctx, key, WithTTL(500*time.Millisecond), WithoutAutoExtend(), WithLockDelay(delay))
		if err != nil {
			t.Fatal(err)
		}
		exp := lk.ExpiresAt().UnixMilli()
		end := exp + delay.Milliseconds()
		waitServerMs(t, b, exp+1300)
		if l2, ok, err := peer.TryAcquire(ctx, key); err != nil || ok {
			t.Fatalf("%s: TryAcquire 1.3 s after expiry = %v, %v, %v; want refused (lock delay)", via, l2, ok, err)
		}
		switch via {
		case "Revoke":
			n, notBefore, err := peer.Revoke(ctx, key)
			if err != nil || n != 0 || notBefore.UnixMilli() != end {
				t.Fatalf("Revoke of the expired lease = %d, %v, %v; want 0 revoked, notBefore expiry + 3 s (%d)", n, notBefore, err, end)
			}
		case "SQL":
			var revoked int
			var until int64
			if err := b.pool.QueryRow(ctx, "SELECT revoked, not_before_ms FROM syncguard_locks_revoke($1)", key).Scan(&revoked, &until); err != nil ||
				revoked != 0 || until != end {
				t.Fatalf("SQL revoke of the expired lease = %d, %d, %v; want 0, %d", revoked, until, err, end)
			}
		case "Release":
			if err := lk.Release(ctx); err == nil {
				t.Fatal("Release of a lease that expired: no error")
			}
		}
		now := serverMs(t, b)
		l2, ok, err := peer.TryAcquire(ctx, key)
		if err != nil || (ok && now < end) {
			t.Fatalf("%s: TryAcquire %d ms after expiry, after the %s = granted %v, %v; want refused until %d ms", via, now-exp, via, ok, err, delay.Milliseconds())
		}
		if ok {
			_ = l2.Release(ctx)
			continue
		}
		// A takeover waits for the delay's end.
		l2, err = peer.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if at := l2.AcquiredAt().UnixMilli(); at < end {
			t.Fatalf("%s: taken over %d ms after expiry, inside the %v lock delay", via, at-exp, delay)
		}
		if l2.Fence() != lk.Fence()+1 {
			t.Fatalf("%s: fence %v after %v", via, l2.Fence(), lk.Fence())
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		_ = lk.Release(ctx)
	}
}

// Revoke reaches readers and semaphore permits: one permit named by its
// grant id, then every permit, a reader named by its lockId's hash, and
// one from SQL. Each revoked holder's Manager (another process) ends the
// lock with ErrRevoked (CodeRevoked), the others keep theirs, and a
// revoked hold's slot is free at once. RequestRelease reaches one named
// hold, or all of a key's.
func TestRevokeSharedHolds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	peer, psig := b.newPeer(t, Config{})
	wait(t, &psig.Listening)
	const sem = "exports:slots"
	var p [3]*Lock
	for i := range p {
		lk, err := b.m.Acquire(ctx, sem, WithLimit(3), WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		p[i] = lk
	}
	if _, ok, err := peer.TryAcquire(ctx, sem, WithLimit(3)); err != nil || ok {
		t.Fatalf("a fourth permit of three: %v, %v", ok, err)
	}
	revokedCode := func(what string, lk *Lock) {
		t.Helper()
		cause := ended(t, lk)
		if !errors.Is(cause, pglease.ErrRevoked) || pglease.CodeOf(cause) != pglease.CodeRevoked {
			t.Fatalf("%s: cause %v; want ErrRevoked", what, cause)
		}
		if err := lk.Release(ctx); !errors.Is(err, pglease.ErrRevoked) {
			t.Fatalf("%s: Release = %v; want ErrRevoked", what, err)
		}
	}

	// RequestRelease of one permit: only its holder is asked.
	if err := peer.RequestRelease(ctx, sem, p[0].GrantID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p[0].ReleaseRequested():
	case <-time.After(waitTimeout()):
		t.Fatal("the permit named was not asked to release")
	}
	// A round trip through the holder's loop, which handled the request
	// in one turn before it.
	if lk, ok, err := b.m.TryAcquire(ctx, "unrelated"); err != nil || !ok {
		t.Fatal(ok, err)
	} else {
		_ = lk.Release(ctx)
	}
	for _, lk := range p[1:] {
		select {
		case <-lk.ReleaseRequested():
			t.Fatal("a permit not named was asked to release")
		default:
		}
	}

	// One permit, by grant id.
	n, notBefore, err := peer.Revoke(ctx, sem, p[1].GrantID())
	if err != nil || n != 1 || !notBefore.IsZero() {
		t.Fatalf("Revoke of one permit = %d, %v, %v", n, notBefore, err)
	}
	revokedCode("the permit revoked", p[1])
	for _, lk := range []*Lock{p[0], p[2]} {
		if err := lk.Err(); err != nil {
			t.Fatalf("a permit not named: %v", err)
		}
	}
	mine, ok, err := peer.TryAcquire(ctx, sem, WithLimit(3))
	if err != nil || !ok {
		t.Fatalf("the revoked permit's slot: %v, %v", ok, err)
	}
	// Every permit: the two left here and the peer's own.
	n, _, err = peer.Revoke(ctx, sem)
	if err != nil || n != 3 {
		t.Fatalf("Revoke of every permit = %d, %v", n, err)
	}
	revokedCode("a permit (all revoked)", p[0])
	revokedCode("a permit (all revoked)", p[2])
	revokedCode("the revoker's own permit", mine)

	// Readers: one by its lockId's hash, one from SQL; RequestRelease of all.
	const rw = "cache:rw"
	r1, err := b.m.Acquire(ctx, rw, Shared(), WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.m.Acquire(ctx, rw, Shared(), WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// From SQL, one reader asked (the other is not), then all from Go.
	var asked int
	if err := b.admin.QueryRow(ctx, "SELECT syncguard_locks_request_release($1, $2)", rw, pglease.HashKey(r2.hd.ID)).Scan(&asked); err != nil || asked != 1 {
		t.Fatalf("SQL request of one reader = %d, %v", asked, err)
	}
	select {
	case <-r2.ReleaseRequested():
	case <-time.After(waitTimeout()):
		t.Fatal("the reader named from SQL was not asked to release")
	}
	if lk, ok, err := b.m.TryAcquire(ctx, "unrelated"); err != nil || !ok {
		t.Fatal(ok, err)
	} else {
		_ = lk.Release(ctx)
	}
	select {
	case <-r1.ReleaseRequested():
		t.Fatal("a reader not named was asked to release")
	default:
	}
	if err := peer.RequestRelease(ctx, rw); err != nil {
		t.Fatal(err)
	}
	for _, lk := range []*Lock{r1, r2} {
		select {
		case <-lk.ReleaseRequested():
		case <-time.After(waitTimeout()):
			t.Fatal("a reader was not asked to release")
		}
	}
	n, _, err = peer.Revoke(ctx, rw, pglease.HashKey(r1.hd.ID))
	if err != nil || n != 1 {
		t.Fatalf("Revoke of one reader = %d, %v", n, err)
	}
	revokedCode("the reader revoked", r1)
	if err := r2.Err(); err != nil {
		t.Fatalf("the other reader: %v", err)
	}
	var revoked int
	if err := b.admin.QueryRow(ctx, "SELECT revoked FROM syncguard_locks_revoke($1, 0, $2)", rw, r2.GrantID()).Scan(&revoked); err != nil || revoked != 1 {
		t.Fatalf("SQL revoke of a reader = %d, %v", revoked, err)
	}
	revokedCode("the reader revoked from SQL", r2)

	// Bad holds: before any I/O.
	for _, bad := range []string{"", "x", pglease.HashKey("a") + "0"} {
		if _, _, err := peer.Revoke(ctx, rw, bad); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("Revoke with hold %q: %v", bad, err)
		}
		if err := peer.RequestRelease(ctx, rw, bad); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("RequestRelease with hold %q: %v", bad, err)
		}
	}
}
