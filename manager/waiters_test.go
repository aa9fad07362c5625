package manager

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/retry"
)

// noPolling makes a waiter's retries a minute apart: within a test, only
// a wake-up (a notification, or its registration as a waiter) gets it
// the key.
var noPolling = retry.Policy{Base: time.Minute, MaxDelay: time.Minute}

// waiterLocksSQL selects the holds of the waiter locks (store.WaiterLockClass)
// of the keys in $2 (other tests' keys are none of this test's business).
const waiterLocksSQL = "FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objsubid = 2 " +
	"AND objid IN (SELECT hashtext(k)::oid FROM unnest($2::text[]) AS k)"

// waiterLocksHeld counts sessions' holds of the waiter locks of keys.
func waiterLocksHeld(t testing.TB, b *bundle, keys ...string) int {
	t.Helper()
	var n int
	if err := b.admin.QueryRow(ctxT(t), "SELECT count(*) "+waiterLocksSQL, store.WaiterLockClass, keys).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ownChannel returns a Config without polling on a notify channel of its
// own (other tests' releases notify too), and a connection LISTENing to
// it and its 256 wake channels, so that it hears every wake-up.
func ownChannel(t *testing.T, prefix string) (Config, *pgx.Conn) {
	t.Helper()
	cfg := Config{Retry: noPolling, Config: pg.Config{NotifyChannel: prefix + strings.ToLower(strings.ReplaceAll(keys.NewLockID()[:12], "-", "_"))}}
	l, err := pgx.Connect(ctxT(t), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	q := "LISTEN " + cfg.NotifyChannel
	for i := range 256 {
		q += fmt.Sprintf(`; LISTEN "%s.%02x"`, cfg.NotifyChannel, i)
	}
	if _, err := l.Exec(ctxT(t), q); err != nil {
		t.Fatal(err)
	}
	return cfg, l
}

// Releases nobody waits for send no notification; a key another Manager
// waits for is registered as waited for, its release notifies and wakes
// that Manager (its retries are a minute apart), and the registration
// ends when the waiter no longer needs it.
func TestReleaseNotifiesOnlyWaitedKeys(t *testing.T) {
	t.Parallel()
	cfg, l := ownChannel(t, "waited_")
	b := setup(t, setupOpts{cfg: cfg})
	w, wsig := b.newPeer(t, cfg)
	ctx := ctxT(t)
	// Keys unique to this test: notifications are database-wide.
	key := func(s string) string { return "waited:" + s + ":" + b.schema }
	hot := key("hot")
	var keys []string
	for i := range 20 {
		keys = append(keys, key(string(rune('a'+i))))
	}

	for _, k := range keys {
		lk, err := b.m.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := waiterLocksHeld(t, b, append(keys, hot)...); n != 0 {
		t.Fatalf("%d waiter locks with nobody waiting", n)
	}

	held, err := b.m.Acquire(ctx, hot)
	if err != nil {
		t.Fatal(err)
	}
	// A listener that connects after the first try registers the key
	// and resyncs instead (no registered signal): let it connect first.
	wait(t, &wsig.Listening)
	got := acquireAndRelease(ctx, w, hot)
	wait(t, &wsig.Registered)
	if n := waiterLocksHeld(t, b, hot); n != 1 {
		t.Fatalf("%d waiter locks while one Manager waits for one key", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectGrant(t, got, "the waiting Manager was not woken by the release")
	wc, cancel := context.WithTimeout(ctx, waitTimeout())
	defer cancel()
	n, err := l.WaitForNotification(wc)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != pglease.HashKey(hot) {
		t.Fatalf("first notification is %s, want the waited key's %s: a release nobody waited for notified", n.Payload, pglease.HashKey(hot))
	}
	if want := store.WakeChannel(cfg.NotifyChannel, n.Payload); n.Channel != want {
		t.Fatalf("the waited key's release notified on %q, want its wake channel %q", n.Channel, want)
	}
	eventually(t, waitTimeout(), "the waiter's registration ends", func() bool { return waiterLocksHeld(t, b, hot) == 0 })
}

// A key's waiter registration ends with its wait: once the waiter has
// the key and lets it go, its Manager holds no waiter lock (and so reads
// no more releases of the key), and the next wait registers again.
func TestWaiterRegistrationEndsWithWait(t *testing.T) {
	t.Parallel()
	cfg := Config{Retry: noPolling}
	b := setup(t, setupOpts{cfg: cfg})
	w, wsig := b.newPeer(t, cfg)
	ctx := ctxT(t)
	hot := "waited-ends:" + b.schema
	wait(t, &wsig.Listening)
	for round := range 3 {
		held, err := b.m.Acquire(ctx, hot)
		if err != nil {
			t.Fatal(err)
		}
		// A refusal signalled in the round before must not pass for this
		// round's: the release would come before the waiter waits.
		drain(&wsig.Retrying)
		handOver(t, ctx, held, w, wsig, hot, "the waiter was not woken by the release")
		eventually(t, waitTimeout(), "the registration ends with the wait", func() bool { return waiterLocksHeld(t, b, hot) == 0 })
		regs := 0
		for {
			select {
			case n := <-wsig.Registered.Ch:
				regs += n
				continue
			default:
			}
			break
		}
		if regs != 1 {
			t.Fatalf("round %d: %d registrations, want 1 (each wait registers)", round, regs)
		}
	}
}

// A waiter's registration ends when it is granted the key, not when it
// lets the key go: while it holds the key its Manager holds no waiter
// lock, so its own release, with nobody else waiting, notifies nobody
// (before, its listener's lock made that release notify, and the
// listener read it back).
func TestWaiterRegistrationEndsAtGrant(t *testing.T) {
	t.Parallel()
	cfg, l := ownChannel(t, "granted_")
	b := setup(t, setupOpts{cfg: cfg})
	w, wsig := b.newPeer(t, cfg)
	ctx := ctxT(t)
	next := func() string {
		t.Helper()
		wc, cancel := context.WithTimeout(ctx, waitTimeout())
		defer cancel()
		n, err := l.WaitForNotification(wc)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}
	hot := "granted:" + b.schema
	held, err := b.m.Acquire(ctx, hot)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, &wsig.Listening)
	got := make(chan *Lock, 1)
	go func() {
		lk, err := w.Acquire(ctx, hot)
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	waitFor(t, &wsig.Retrying, func(k string) bool { return k == hot })
	wait(t, &wsig.Registered)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	if p := next(); p != pglease.HashKey(hot) {
		t.Fatalf("notified %s, want the waited key's release", p)
	}
	eventually(t, waitTimeout(), "the registration ends at the grant", func() bool { return waiterLocksHeld(t, b, hot) == 0 })
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	sentinel := "sentinel-" + b.schema
	if _, err := b.admin.Exec(ctx, "SELECT pg_notify($1, $2)", cfg.NotifyChannel, sentinel); err != nil {
		t.Fatal(err)
	}
	if p := next(); p != sentinel {
		t.Fatalf("notified %s after the holder's release, want the sentinel: the release of a key nobody waits for notified", p)
	}
}

// A listener that reconnects takes its waiter locks again (a new session
// holds none), so releases keep waking its waiters.
func TestWaiterRegistrationAfterReconnect(t *testing.T) {
	t.Parallel()
	cfg := Config{Retry: noPolling}
	b := setup(t, setupOpts{cfg: cfg})
	w, wsig := b.newPeer(t, cfg)
	ctx := ctxT(t)
	hot := "waited-reconnect:" + b.schema
	held, err := b.m.Acquire(ctx, hot)
	if err != nil {
		t.Fatal(err)
	}
	// A listener that connects after the first try registers the key
	// and resyncs instead (no registered signal): let it connect first.
	wait(t, &wsig.Listening)
	got := acquireAndRelease(ctx, w, hot)
	wait(t, &wsig.Registered)
	drain(&wsig.Listening)
	var killed int
	if err := b.admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) "+waiterLocksSQL, store.WaiterLockClass, []string{hot}).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listener backends, %v", killed, err)
	}
	wait(t, &wsig.Listening) // reconnected, waiter locks taken, resync
	if n := waiterLocksHeld(t, b, hot); n != 1 {
		t.Fatalf("%d waiter locks after the listener reconnected, want 1", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expectGrant(t, got, "waiter not woken after its listener reconnected")
}

// Extend statements carry up to store.MaxExtendBatch locks by default (one
// statement per heartbeat tick for up to 100,000 locks: the bench's
// 100,000-lock point shows it end to end); a MaxBatch set in Config caps
// them too.
func TestExtendBatchSize(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	if b.m.k.ExtBatch != store.MaxExtendBatch {
		t.Fatalf("default extend batch %d, want store.MaxExtendBatch", b.m.k.ExtBatch)
	}
	const capped, locks = 20, 50
	c := setup(t, setupOpts{cfg: Config{MaxBatch: capped}})
	ctx := ctxT(t)
	drain(&c.sig.BatchSent)
	var wg sync.WaitGroup
	held := make(chan *Lock, locks)
	for i := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := c.m.Acquire(ctx, fmt.Sprintf("extbatch:%d:%s", i, c.schema), WithTTL(3*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			held <- lk
		}()
	}
	wg.Wait()
	close(held)
	// Every lock's first extend (due 1 s after its grant) goes out in
	// batches of at most capped.
	extended := 0
	for extended < locks {
		bi := waitFor(t, &c.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindExtend })
		if bi.N > capped {
			t.Fatalf("extend batch of %d with MaxBatch %d", bi.N, capped)
		}
		extended += bi.N
	}
	for lk := range held {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A waiter whose attempt failed (an outage: here its statement ran out of
// time) while the key was held by another Manager that never waited for
// it, so that nobody had registered the key, is still woken by the
// release: a failed attempt registers its keys as waited for too. Its
// retries are a minute apart, so only that registration gets it the key
// within the test's bound (the silent-host failover lost this wake-up
// when the waiter's first attempt after the failover met a pooled
// connection to the dead primary). Both an Acquire and an AcquireAll.
func TestWaiterRegisteredAfterFailedAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		kind kernel.BatchKind
		take func(ctx context.Context, m *Manager, key string) <-chan error
	}{
		{"acquire", kernel.KindAcquire, acquireAndRelease},
		{"set", kernel.KindSets, func(ctx context.Context, m *Manager, key string) <-chan error {
			got := make(chan error, 1)
			go func() {
				locks, err := m.AcquireAll(ctx, []string{key, key + ":free"})
				for _, lk := range locks {
					if err == nil {
						err = lk.Release(ctx)
					}
				}
				got <- err
			}()
			return got
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const timeout = 2 * time.Second
			var sent atomic.Int32
			// Not hedged (stuckAfter): the first attempt's statement runs
			// out of time before it is sent.
			w := setup(t, setupOpts{cfg: Config{Retry: noPolling, StatementTimeout: timeout}, hooks: kernel.TestHooks{StuckAfter: time.Hour, BeforeBatch: func(kind kernel.BatchKind, n int) {
				if kind == tc.kind && sent.Add(1) == 1 {
					time.Sleep(timeout + 500*time.Millisecond)
				}
			}}})
			h, _ := w.newPeer(t, Config{})
			ctx := ctxT(t)
			key := "waited-failed:" + w.schema
			held, err := h.Acquire(ctx, key) // nobody waits for it: not registered
			if err != nil {
				t.Fatal(err)
			}
			wait(t, &w.sig.Listening)
			got := tc.take(ctx, w.m, key)
			wait(t, &w.sig.Retrying) // the first attempt failed
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			expectGrant(t, got, "waiter whose attempt failed not woken by the release: the key was never registered as waited for")
		})
	}
}
