package manager

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

// newProxy starts a fault proxy in front of the package's server, closed
// when the test ends.
func newProxy(t testing.TB) *faultproxy.Proxy {
	t.Helper()
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// viaProxy routes a connection config through p.
func viaProxy(p *faultproxy.Proxy) func(*pgx.ConnConfig) {
	return func(c *pgx.ConnConfig) {
		host, port, _ := net.SplitHostPort(p.Addr())
		c.Host = host
		var n uint16
		for _, d := range port {
			n = n*10 + uint16(d-'0')
		}
		c.Port = n
		for _, fb := range c.Fallbacks { // sslmode=prefer's plain connection is one
			fb.Host, fb.Port = host, n
		}
	}
}

// TestListenerRecoversFromHalfOpen (dead connections cost one bounded timeout): the listening
// connection goes half-open (server side closed, client side open and
// silent, as a NAT or proxy dropping its state leaves it). The listener
// must notice, reconnect and retry the waiting keys, so that a release in
// another process still wakes the waiter: with polling 10–20 s away, the
// hand-over must take far less than that.
func TestListenerRecoversFromHalfOpen(t *testing.T) {
	t.Parallel()
	proxy := newProxy(t)
	b := setup(t, setupOpts{cfg: Config{Retry: pollingTooSlow}, hooks: kernel.TestHooks{ListenConfig: viaProxy(proxy)}})
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	if err := proxy.HalfOpen(); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Pass(); err != nil { // new connections go through again; the old one stays half-open
		t.Fatal(err)
	}
	hold, err := peer.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, "k", WithAcquireTimeout(30*time.Second))
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == "k" })
	released := time.Now()
	if err := hold.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	handoff := time.Since(released)
	t.Logf("hand-over after a half-open LISTEN connection: %v", handoff)
	if handoff > 9*time.Second {
		t.Fatalf("hand-over took %v: the waiter was woken by polling, not by the listener", handoff)
	}
	wait(t, &b.sig.Listening) // it re-subscribed
}

var _ = context.Background

// deadPool returns a Manager on a pool of at most 4 connections (pgxpool's
// default on 2 cores) through a fault proxy, and a function that leaves n
// idle pooled connections half-open (server side closed, client side
// silent): dead, though nothing tells the pool.
func deadPool(t *testing.T, cfg Config) (*bundle, func(n int)) {
	t.Helper()
	proxy := newProxy(t)
	cfg.DisableNotify = true
	b := setup(t, setupOpts{cfg: cfg, pool: []func(*pgxpool.Config){func(c *pgxpool.Config) {
		viaProxy(proxy)(c.ConnConfig)
		c.MaxConns, c.MinConns = 4, 0
	}}})
	// Runs first: Close (it waits for the statements stuck on dead
	// connections to end, at their statement timeout), then cut the dead
	// connections, which pgconn would otherwise drain for 15 s while
	// closing them (holding up the pool's Close), and start the pool afresh
	// for the post-checks.
	t.Cleanup(func() {
		if err := b.m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		proxy.Disconnect()
		b.pool.Reset()
	})
	kill := func(n int) {
		t.Helper()
		ctx := ctxT(t)
		var conns []*pgxpool.Conn
		for range n {
			c, err := b.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		if err := proxy.HalfOpen(); err != nil {
			t.Fatal(err)
		}
		if err := proxy.Pass(); err != nil { // new connections work
			t.Fatal(err)
		}
		for _, c := range conns {
			c.Release()
		}
	}
	return b, kill
}

// TestDeadPooledConnections (dead connections cost one bounded timeout): right after pooled
// connections went half-open, an uncontended Acquire on a healthy server
// costs at most a short timeout per dead connection it meets, not the
// statement timeout, and never the whole wait: both when the dead
// connections are reused at once (the statement is sent on one of them)
// and after a second idle (pgxpool's liveness check meets them).
func TestDeadPooledConnections(t *testing.T) {
	t.Parallel()
	// Before the fix each dead connection cost the statement timeout; now
	// a dead connection costs about a second (stuckAfter, connCheckSlice).
	const statementTimeout = 8 * time.Second
	for _, c := range []struct {
		name string
		idle time.Duration
	}{{"reused at once", 0}, {"after a second idle", 1200 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b, kill := deadPool(t, Config{StatementTimeout: statementTimeout})
			ctx := ctxT(t)
			kill(2)
			time.Sleep(c.idle)
			start := time.Now()
			lk, err := b.m.Acquire(ctx, "k", WithAcquireTimeout(3*statementTimeout))
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			t.Logf("uncontended Acquire after 2 dead pooled connections: %v", took)
			if took >= statementTimeout {
				t.Errorf("took %v: a dead connection cost the statement timeout", took)
			}
		})
	}
}

// TestStuckBatchNoGlobalStall: one acquire batch that gets no
// answer (here held before it is sent; in life a statement on a dead
// connection) must not hold back every other acquire of the process behind
// the in-flight cap ((MaxConns − 1)/2 = 1 with 4 connections), and its own
// callers are served by a new attempt: both within about stuckAfter.
func TestStuckBatchNoGlobalStall(t *testing.T) {
	t.Parallel()
	testStuckBatch(t, Config{})
}

// TestFairStuckBatchNoGlobalStall is TestStuckBatchNoGlobalStall with the
// fair queue: a stuck QueueWait is hedged with the same tickets.
func TestFairStuckBatchNoGlobalStall(t *testing.T) {
	t.Parallel()
	testStuckBatch(t, Config{FairQueue: true})
}

func testStuckBatch(t *testing.T, cfg Config) {
	gate := make(chan struct{})
	var sent atomic.Int32
	b := setup(t, setupOpts{
		cfg:  cfg,
		pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.MaxConns = 4 }},
		hooks: kernel.TestHooks{BeforeBatch: func(kind kernel.BatchKind, n int) {
			if kind == kernel.KindAcquire && sent.Add(1) == 1 {
				<-gate
			}
		}},
	})
	defer close(gate)
	ctx := ctxT(t)
	if b.m.k.AcqLimit != 1 {
		t.Fatalf("acquire cap %d, want 1", b.m.k.AcqLimit)
	}
	stuck := make(chan error, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, "stuck", WithAcquireTimeout(waitTimeout()))
		if err == nil {
			err = lk.Release(ctx)
		}
		stuck <- err
	}()
	waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindAcquire })
	const bound = 4 * kernel.StuckAfterMax // stuckAfter, plus a round trip, under load
	start := time.Now()
	lk, err := b.m.Acquire(ctx, "other", WithAcquireTimeout(waitTimeout()))
	if err != nil {
		t.Fatalf("another key's Acquire behind the stuck batch: %v", err)
	}
	took := time.Since(start)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-stuck; err != nil {
		t.Fatalf("the stuck batch's caller: %v", err)
	}
	t.Logf("another key's Acquire while a batch was stuck: %v", took)
	if took > bound {
		t.Fatalf("took %v", took)
	}
}

// Under heavy load one more batch of a kind goes out beyond MaxInFlight:
// with an acquire batch in flight (held here), FullBatch − 1 waiting
// acquires wait for it, and the next (FullBatch waiting) sends them all at
// once as a second batch. (The held batch is never counted stuck here,
// which would also let a batch out.)
func TestAdaptiveInFlight(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var sent atomic.Int32
	b := setup(t, setupOpts{
		pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.MaxConns = 20 }},
		hooks: kernel.TestHooks{StuckAfter: time.Hour, BeforeBatch: func(kind kernel.BatchKind, n int) {
			if kind == kernel.KindAcquire && sent.Add(1) == 1 {
				<-gate
			}
		}},
	})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	defer release() // before Close, which waits for the held batch
	ctx := ctxT(t)
	if b.m.k.AcqLimit != 1 {
		t.Fatalf("acquire cap %d, want 1", b.m.k.AcqLimit)
	}
	results := make(chan error, kernel.FullBatch+1)
	acquire := func(key string) {
		go func() {
			lk, err := b.m.Acquire(ctx, key)
			if err == nil {
				err = lk.Release(ctx)
			}
			results <- err
		}()
	}
	acquire("adapt:first")
	waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindAcquire })
	for i := range kernel.FullBatch - 1 {
		acquire(fmt.Sprintf("adapt:%d", i))
	}
	for range kernel.FullBatch { // the first's and the FullBatch − 1 others'
		wait(t, &b.sig.Queued)
	}
	acquire("adapt:last")
	bi := waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindAcquire })
	release()
	if bi.N != kernel.FullBatch {
		t.Fatalf("second acquire batch of %d, want the %d waiting (none may go out before a full batch waits)", bi.N, kernel.FullBatch)
	}
	for range kernel.FullBatch + 1 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
}
