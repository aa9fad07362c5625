package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
)

// Everyday paths a new user meets: a try after a timed-out acquire, a
// wait during an outage, a wait for a crashed holder, acquiring a key one
// already holds, Close with the database down.

// proxied returns a Manager whose pool and listener reach the server
// through a fault proxy, for outage tests. The test checks Close itself
// where it matters: the cleanup brings the network back, closes the
// Manager (ignoring its answer) and deletes the lease rows.
func proxied(t *testing.T, cfg Config) (*bundle, *faultproxy.Proxy) {
	t.Helper()
	proxy := newProxy(t)
	pool, rs := pgtest.RuntimePool(t, func(c *pgxpool.Config) { viaProxy(proxy)(c.ConnConfig) })
	b := &bundle{pool: pool, admin: rs.AdminPool(t), schema: rs.Schema, sig: &kernel.Signals{}}
	b.sig.Init()
	m, err := newManager("test", pool, false, cfg, func(m *Manager) {
		m.k.Sig = b.sig
		m.k.Test = kernel.TestHooks{ListenConfig: viaProxy(proxy)}
	})
	if err != nil {
		t.Fatal(err)
	}
	b.m = m
	if err := m.SetupSchema(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proxy.Pass()
		_ = m.Close(context.Background())
		_, _ = b.admin.Exec(context.Background(), "DELETE FROM syncguard_locks")
	})
	return b, proxy
}

// warm takes and releases a key, so that the pool holds a connection used
// a moment ago (pgxpool hands it out again without a liveness check).
func warm(t *testing.T, m *Manager) {
	t.Helper()
	lk, err := m.Acquire(ctxT(t), "warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestTryAcquireDuringOutageAnswersAtOnce: with the database unreachable,
// after an Acquire of a key timed out, TryAcquire of that key makes its
// one attempt at once and answers the outage, as for a fresh key. It used
// to wait in the key's queue behind the retried release of the timed-out
// acquire's lockId: 34.9 s at the default TTL.
func TestTryAcquireDuringOutageAnswersAtOnce(t *testing.T) {
	t.Parallel()
	b, proxy := proxied(t, Config{})
	warm(t, b.m)
	if err := proxy.Cut(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := b.m.Acquire(ctx, "k", WithAcquireTimeout(time.Second)); err == nil {
		t.Fatal("Acquire granted with the database unreachable")
	}
	// Generous against a loaded machine; the refused connect takes
	// microseconds.
	const bound = 3 * time.Second
	for _, key := range []string{"k", "fresh"} {
		tctx, cancel := context.WithTimeout(ctx, 5*bound)
		start := time.Now()
		_, ok, err := b.m.TryAcquire(tctx, key)
		took := time.Since(start)
		cancel()
		t.Logf("TryAcquire(%s) with the database unreachable: ok=%v after %v: %v", key, ok, took, err)
		if took > bound {
			t.Errorf("TryAcquire(%s) took %v", key, took)
		}
		if ok || !errors.Is(err, pglease.ErrServiceUnavailable) || errors.Is(err, pglease.ErrAcquisitionTimeout) {
			t.Errorf("TryAcquire(%s) = %v, %v; want the outage (ServiceUnavailable)", key, ok, err)
		}
	}
	// A key that callers of this Manager wait for is theirs first; while
	// they wait out the outage, a try answers the outage, not "locked".
	wctx, stopWaiter := context.WithCancel(ctx)
	waiter := make(chan error, 1)
	go func() { _, err := b.m.Acquire(wctx, "waited"); waiter <- err }()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == "waited" })
	if _, ok, err := b.m.TryAcquire(ctx, "waited"); ok || !errors.Is(err, pglease.ErrServiceUnavailable) {
		t.Errorf("TryAcquire of a key waited for during the outage = %v, %v; want the outage (ServiceUnavailable)", ok, err)
	}
	stopWaiter()
	if err := <-waiter; !errors.Is(err, pglease.ErrAborted) {
		t.Errorf("cancelled waiter = %v", err)
	}

	// The database is back: the key is free (no row was ever written).
	// (A try may still meet a connection the outage broke: try again.)
	if err := proxy.Pass(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout())
	for {
		lk, ok, err := b.m.TryAcquire(ctx, "k")
		if ok {
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("TryAcquire after the outage = %v, %v", ok, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTryAcquireDoesNotWaitForOrphanRelease: a key whose lockId from an
// acquire nobody waits for any more is being released (the release held
// here before it is sent) is answered by a TryAcquire at once: the server
// still has that lockId's row, so "locked"; and once the release went
// through, the next try gets the key. Exclusion is the server's: the try
// never waits for this process's own clean-up.
func TestTryAcquireDoesNotWaitForOrphanRelease(t *testing.T) {
	t.Parallel()
	acqGate, relGate := make(chan struct{}), make(chan struct{})
	var acquires, releases atomic.Int32
	b := setup(t, setupOpts{hooks: kernel.TestHooks{BeforeBatch: func(kind kernel.BatchKind, n int) {
		switch {
		case kind == kernel.KindAcquire && acquires.Add(1) == 1:
			<-acqGate
		case kind == kernel.KindRelease && releases.Add(1) == 1:
			<-relGate
		}
	}}})
	openRel := sync1(func() { close(relGate) })
	defer openRel() // before Close, which waits for the held release
	ctx := ctxT(t)
	// The caller leaves while its attempt is held; then the attempt is
	// granted with nobody to take it, and its release is held.
	if _, err := b.m.Acquire(ctx, "k", WithAcquireTimeout(100*time.Millisecond)); !errors.Is(err, pglease.ErrAcquisitionTimeout) {
		t.Fatalf("Acquire = %v, want AcquisitionTimeout", err)
	}
	close(acqGate)
	wait(t, &b.sig.Orphaned)
	waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindRelease })

	tctx, cancel := context.WithTimeout(ctx, waitTimeout()/2)
	defer cancel()
	start := time.Now()
	_, ok, err := b.m.TryAcquire(tctx, "k")
	t.Logf("TryAcquire while the orphan's release is in flight: ok=%v, %v after %v", ok, err, time.Since(start))
	if ok || err != nil {
		t.Fatalf("TryAcquire = %v, %v; want ok=false at once (the orphan's row is live)", ok, err)
	}
	openRel()
	waitFor(t, &b.sig.Released, func(k string) bool { return k == "k" })
	lk, ok, err := b.m.TryAcquire(ctx, "k")
	if err != nil || !ok {
		t.Fatalf("TryAcquire after the release = %v, %v", ok, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// sync1 returns f wrapped to run at most once.
func sync1(f func()) func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			f()
		}
	}
}

// TestOutageIsNotContention: a wait that ends while the database cannot
// be reached is not "held elsewhere": it does not match
// ErrAcquisitionTimeout (which the Quick start reports as "being charged
// elsewhere"), and it carries the outage's code and cause. Connections
// refused: ServiceUnavailable; no answer at all: NetworkTimeout. The
// control: a key held by another holder still times out with
// AcquisitionTimeout.
func TestOutageIsNotContention(t *testing.T) {
	t.Parallel()
	t.Run("held elsewhere", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		ctx := ctxT(t)
		other, err := pg.New(b.pool, pg.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Acquire(ctx, "k", time.Minute); err != nil {
			t.Fatal(err)
		}
		_, err = b.m.Acquire(ctx, "k", WithAcquireTimeout(500*time.Millisecond))
		if !errors.Is(err, pglease.ErrAcquisitionTimeout) || strings.Contains(err.Error(), "held by this process") {
			t.Fatalf("Acquire of a key held elsewhere = %v, want AcquisitionTimeout", err)
		}
		if _, err := b.pool.Exec(ctx, "DELETE FROM syncguard_locks WHERE key = 'k'"); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range []struct {
		name  string
		fault func(*faultproxy.Proxy) error
		want  *pglease.Error
	}{
		{"connections refused", (*faultproxy.Proxy).Cut, pglease.ErrServiceUnavailable},
		{"no answer", (*faultproxy.Proxy).Blackhole, pglease.ErrNetworkTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b, proxy := proxied(t, Config{StatementTimeout: 3 * time.Second})
			warm(t, b.m)
			if err := c.fault(proxy); err != nil {
				t.Fatal(err)
			}
			dctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
			defer cancel()
			_, err := b.m.Acquire(dctx, "k")
			t.Logf("Acquire: %v", err)
			if errors.Is(err, pglease.ErrAcquisitionTimeout) {
				t.Fatalf("Acquire during an outage = %v: reported as contention", err)
			}
			if !errors.Is(err, c.want) || !pglease.Retryable(err) || !strings.Contains(err.Error(), "could not be reached") {
				t.Fatalf("Acquire during an outage = %v, want a retryable %v saying the database could not be reached", err, c.want.Code)
			}
		})
	}
}

// TestFatalConnectErrorsFailAtOnce: errors no retry can fix end the wait
// at once with their own, not retryable, code, as the package doc
// promises: a database that does not exist (3D000: it was retried for the
// whole wait and ended in a retryable AcquisitionTimeout), a role that
// does not exist (28000), a wrong password (28P01). Close then has
// nothing to report: no acquire was sent.
func TestFatalConnectErrorsFailAtOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  func(t *testing.T, c *pgxpool.Config)
		want *pglease.Error
	}{
		{"database missing", func(t *testing.T, c *pgxpool.Config) { c.ConnConfig.Database = pgtest.RandomName("missing_") }, pglease.ErrInvalidArgument},
		{"role missing", func(t *testing.T, c *pgxpool.Config) { c.ConnConfig.User = pgtest.RandomName("nobody_") }, pglease.ErrAuthFailed},
		{"wrong password", func(t *testing.T, c *pgxpool.Config) {
			c.ConnConfig.User, c.ConnConfig.Password = passwordRole(t), "wrong"
		}, pglease.ErrAuthFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			c.cfg(t, cfg)
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			m, err := New(pool, Config{DisableNotify: true})
			if err != nil {
				t.Fatal(err)
			}
			dctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err = m.Acquire(dctx, "k")
			took := time.Since(start)
			t.Logf("Acquire after %v: %v", took, err)
			if !errors.Is(err, c.want) || pglease.Retryable(err) || errors.Is(err, pglease.ErrAcquisitionTimeout) {
				t.Errorf("Acquire = %v, want %v, not retryable", err, c.want.Code)
			}
			if took > 5*time.Second {
				t.Errorf("Acquire took %v: retried an error no retry fixes", took)
			}
			cctx, ccancel := context.WithTimeout(context.Background(), waitTimeout())
			defer ccancel()
			if err := m.Close(cctx); err != nil {
				t.Errorf("Close = %v, want nil (no lockId was sent)", err)
			}
		})
	}
}

// passwordRole makes the package's server ask a fresh login role for its
// password (scram-sha-256, set to "right"), by a pg_hba.conf line that
// matches only that role, and returns the role. Skips on DATABASE_URL
// (the server's configuration is not ours to change).
func passwordRole(t *testing.T) string {
	t.Helper()
	if pgtest.ClusterForTest() == nil {
		t.Skip("DATABASE_URL given: cannot change the server's pg_hba.conf")
	}
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, pgtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	role := pgtest.RandomName("pglease_pw_")
	if _, err := conn.Exec(ctx, "SET password_encryption = 'scram-sha-256'; CREATE ROLE "+role+" LOGIN PASSWORD 'right'"); err != nil {
		t.Fatal(err)
	}
	var hba string
	if err := conn.QueryRow(ctx, "SHOW hba_file").Scan(&hba); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(hba)
	if err != nil {
		t.Fatal(err)
	}
	lines := fmt.Sprintf("host all %[1]s 127.0.0.1/32 scram-sha-256\nhost all %[1]s ::1/128 scram-sha-256\n", role)
	// Replaced whole (rename), so the server never reads half a file.
	write := func(b []byte) {
		tmp := filepath.Join(filepath.Dir(hba), ".pg_hba.conf."+role)
		if err := os.WriteFile(tmp, b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
		if s, ok := st.Sys().(*syscall.Stat_t); ok {
			_ = os.Chown(tmp, int(s.Uid), int(s.Gid))
		}
		if err := os.Rename(tmp, hba); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(context.Background(), "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	write(append([]byte(lines), orig...))
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), pgtest.ServerURL(t))
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		tmp := filepath.Join(filepath.Dir(hba), ".pg_hba.conf."+role)
		if err := os.WriteFile(tmp, orig, st.Mode().Perm()); err == nil {
			if s, ok := st.Sys().(*syscall.Stat_t); ok {
				_ = os.Chown(tmp, int(s.Uid), int(s.Gid))
			}
			_ = os.Rename(tmp, hba)
		}
		_, _ = conn.Exec(context.Background(), "SELECT pg_reload_conf()")
		_, _ = conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	// The reload is asynchronous: wait until the server asks for the
	// password.
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = role, "wrong"
	deadline := time.Now().Add(waitTimeout())
	for {
		c, err := pgx.ConnectConfig(ctx, cfg)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "28P01" {
			return role
		}
		if c != nil {
			_ = c.Close(ctx)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server does not ask %s for a password: %v", role, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAcquireWaitsOutCrashedHolder: with no option, Acquire waits as long
// as its context allows, so a worker outwaits a holder that crashed (its
// row stays until it expires, here 5 s) without any tuning. It used to
// give up after 5 s (the old default acquire timeout).
func TestAcquireWaitsOutCrashedHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t) // a deadline well past the crashed holder's lease
	crashed, err := pg.New(b.pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Acquire(ctx, "job", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lk, err := b.m.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("Acquire after %v = %v; want the lock once the crashed holder's lease expired", time.Since(start), err)
	}
	t.Logf("granted %v after the crashed holder's grant", time.Since(start))
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSelfDeadlockSaysHeldHere: Acquire of a key this Manager holds waits
// for the holder like any caller (locks are not re-entrant), and when the
// wait ends without the lock the error says that this process held the
// key; a try answers ok=false. The same rule for the Manager's advisory
// locks is TestAdvisoryWaitsForLocalHolder.
func TestSelfDeadlockSaysHeldHere(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	if l2, ok, err := b.m.TryAcquire(ctx, "mine"); ok || err != nil || l2 != nil {
		t.Fatalf("TryAcquire of a key held here = %v, %v", ok, err)
	}
	_, err = b.m.Acquire(ctx, "mine", WithAcquireTimeout(300*time.Millisecond))
	if !errors.Is(err, pglease.ErrAcquisitionTimeout) || !strings.Contains(err.Error(), "held by this process") {
		t.Fatalf("Acquire of a key held here, wait capped = %v; want AcquisitionTimeout saying this process held it", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err = b.m.Acquire(cctx, "mine")
	if !errors.Is(err, pglease.ErrAborted) || !strings.Contains(err.Error(), "held by this process") {
		t.Fatalf("Acquire of a key held here, cancelled = %v; want Aborted saying this process held it", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// advQueued waits until n callers of m wait for key behind a local holder.
func advQueued(t *testing.T, m *Manager, n int, key advisory.Key) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout())
	for {
		got := 0
		if c, _ := m.advisoryClient("test"); c != nil {
			got = advFuncs.Waiters(c, key)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d advisory waiters, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAdvisoryWaitsForLocalHolder: the Manager's advisory locks follow
// the lease rule (callers of one Manager exclude each other): a try of a
// key held through this Manager answers ok=false, and LockAdvisory waits
// for the local holder in FIFO order — handed on at its Release (the
// key is then free on the server after the last one: nothing stacked on
// the shared session), at its loss (the session ended), and failed with
// ErrClosed by Close. It used to be refused with InvalidArgument.
func TestAdvisoryWaitsForLocalHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noSignals: true})
	m := b.m
	fastProbe(m)
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)
	type result struct {
		id int
		l  *advisory.Lock
		e  error
	}
	res := make(chan result, 4)
	lockIn := func(id int, key advisory.Key) {
		go func() {
			l, err := m.LockAdvisory(ctx, key)
			res <- result{id, l, err}
		}()
	}
	next := func() result {
		t.Helper()
		select {
		case r := <-res:
			if r.e != nil {
				t.Fatalf("waiter %d: %v", r.id, r.e)
			}
			return r
		case <-time.After(waitTimeout()):
			t.Fatal("no waiter was handed the key")
			panic("unreachable")
		}
	}

	// Release hands over, FIFO.
	k := advKey()
	l1, err := m.LockAdvisory(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if l, ok, err := m.TryLockAdvisory(ctx, k); ok || err != nil || l != nil {
		t.Fatalf("TryLockAdvisory of a key held here = %v, %v", ok, err)
	}
	lockIn(1, k)
	advQueued(t, m, 1, k)
	lockIn(2, k)
	advQueued(t, m, 2, k)
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w1 := next()
	if w1.id != 1 {
		t.Fatalf("waiter %d handed the key first, want 1 (FIFO)", w1.id)
	}
	select {
	case r := <-res:
		t.Fatalf("waiter %d handed the key while waiter 1 holds it", r.id)
	case <-time.After(100 * time.Millisecond):
	}
	if err := w1.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w2 := next()
	if w2.id != 2 {
		t.Fatalf("waiter %d, want 2", w2.id)
	}
	if _, ok, _ := peer.TryLockAdvisory(ctx, k); ok {
		t.Fatal("another Manager took the key while waiter 2 holds it")
	}
	if err := w2.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	pl, ok, err := peer.TryLockAdvisory(ctx, k)
	if !ok || err != nil {
		t.Fatalf("key not free after the last local holder's Release (stacked on the session?): %v, %v", ok, err)
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The holder's loss (its session ended: the server freed the key)
	// hands over too, to a new session.
	k2 := advKey()
	l3, err := m.LockAdvisory(ctx, k2)
	if err != nil {
		t.Fatal(err)
	}
	lockIn(3, k2)
	advQueued(t, m, 1, k2)
	admin, _ := pgtest.Pool(t)
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", advPID(m)); err != nil {
		t.Fatal(err)
	}
	w3 := next()
	if !errors.Is(l3.Err(), pglease.ErrLockLost) {
		t.Fatalf("the terminated holder's Err = %v", l3.Err())
	}
	if _, ok, _ := peer.TryLockAdvisory(ctx, k2); ok {
		t.Fatal("another Manager took the key handed to waiter 3")
	}
	if err := w3.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = l3.Release(ctx)

	// Close fails the waiters.
	k3 := advKey()
	if _, err := m.LockAdvisory(ctx, k3); err != nil {
		t.Fatal(err)
	}
	lockIn(4, k3)
	advQueued(t, m, 1, k3)
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if !errors.Is(r.e, pglease.ErrClosed) {
			t.Fatalf("waiter at Close = %v, want ErrClosed", r.e)
		}
	case <-time.After(waitTimeout()):
		t.Fatal("Close left a waiter waiting")
	}
}

// TestCloseWithDatabaseDown: Close reports on what callers hold. With the
// database down and no lock held, the clean-up of a lockId nobody ever
// got (an acquire whose answer was lost) is tried once and is not Close's
// error: Close returns nil at once. It used to retry it until
// CloseTimeout (4.6 s) and return "release outcome unknown … expires by
// itself". A lock a caller holds is reported, within CloseTimeout.
func TestCloseWithDatabaseDown(t *testing.T) {
	t.Parallel()
	t.Run("nothing held", func(t *testing.T) {
		t.Parallel()
		b, proxy := proxied(t, Config{})
		warm(t, b.m)
		// The acquire's statement reaches the proxy and is held there;
		// its caller leaves; then the connection is cut: the outcome is
		// unknown, so its lockId is released, and that release fails.
		if err := proxy.Blackhole(); err != nil {
			t.Fatal(err)
		}
		if _, err := b.m.Acquire(ctxT(t), "k", WithAcquireTimeout(300*time.Millisecond)); err == nil {
			t.Fatal("granted through a blackhole")
		}
		if err := proxy.Cut(); err != nil {
			t.Fatal(err)
		}
		wait(t, &b.sig.ReleaseRetry)
		start := time.Now()
		err := b.m.Close(ctxT(t))
		took := time.Since(start)
		t.Logf("Close with the database down, nothing held: %v after %v", err, took)
		if err != nil {
			t.Errorf("Close = %v, want nil: no caller held a lock", err)
		}
		if took > kernel.DefaultCloseTimeout/2 {
			t.Errorf("Close took %v: it retried the release of a lockId nobody held", took)
		}
	})
	t.Run("a lock held", func(t *testing.T) {
		t.Parallel()
		const closeTimeout = time.Second
		b, proxy := proxied(t, Config{CloseTimeout: closeTimeout})
		if _, err := b.m.Acquire(ctxT(t), "held"); err != nil {
			t.Fatal(err)
		}
		if err := proxy.Cut(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := b.m.Close(ctxT(t))
		took := time.Since(start)
		t.Logf("Close with the database down, a lock held: %v after %v", err, took)
		if !errors.Is(err, pglease.ErrServiceUnavailable) || !strings.Contains(err.Error(), "release outcome unknown") {
			t.Errorf("Close = %v, want the held lock's release failure", err)
		}
		if took > closeTimeout+waitTimeout()/3 {
			t.Errorf("Close took %v, CloseTimeout %v", took, closeTimeout)
		}
	})
}
