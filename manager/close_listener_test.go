package manager

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager/internal/kernel"
)

// TestCloseEndsBrokenListenerSession (Close is bounded, session locks are
// freed): a Manager waits for a key held by a peer, so its listening
// session holds the key's waiter lock; the listening connection goes
// silent, its probe fails, and pgx starts closing it in a goroutine of
// its own. Close right after must leave no session of the listener and
// no advisory lock on the server (the server ends a session within
// milliseconds of its socket closing; the poll allows a second).
func TestCloseEndsBrokenListenerSession(t *testing.T) {
	t.Parallel()
	proxy := newProxy(t)
	app := pgtest.RandomName("lis_")
	b := setup(t, setupOpts{hooks: kernel.TestHooks{ListenProbe: 100 * time.Millisecond, ListenConfig: func(c *pgx.ConnConfig) {
		viaProxy(proxy)(c)
		c.RuntimeParams["application_name"] = app
	}}})
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)
	lk, err := peer.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Release(context.Background()) }()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() { _, _ = b.m.Acquire(wctx, "k") }()
	left := func() (s, n int) {
		if err := b.admin.QueryRow(ctx, `SELECT count(DISTINCT a.pid), count(l.pid) FROM pg_stat_activity a
			LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
			WHERE a.application_name = $1`, app).Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		return
	}
	for d := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, n := left(); n == 1 {
			break
		}
		if time.Now().After(d) {
			t.Fatal("no waiter mark")
		}
	}
	for len(b.sig.ListenerProbeFailed.Ch) > 0 { // a probe that failed before (a loaded machine) does not count
		<-b.sig.ListenerProbeFailed.Ch
	}
	if err := proxy.Blackhole(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.sig.ListenerProbeFailed.Ch:
	case <-ctx.Done():
		t.Fatal("the listener's probe did not fail on a silent connection")
	}
	if err := b.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d := time.Now().Add(time.Second)
	for {
		s, n := left()
		if s == 0 && n == 0 {
			break
		}
		if time.Now().After(d) {
			t.Fatalf("after Close: %d listener sessions, %d advisory locks", s, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
