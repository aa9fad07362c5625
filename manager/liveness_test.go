package manager

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
		c.Fallbacks = nil
	}
}

// TestListenerRecoversFromHalfOpen (issue 9.1, L3b): the listening
// connection goes half-open (server side closed, client side open and
// silent, as a NAT or proxy dropping its state leaves it). The listener
// must notice, reconnect and retry the waiting keys, so that a release in
// another process still wakes the waiter: with polling 10–20 s away, the
// hand-over must take far less than that.
func TestListenerRecoversFromHalfOpen(t *testing.T) {
	t.Parallel()
	proxy := newProxy(t)
	b := setup(t, setupOpts{cfg: Config{Retry: pollingTooSlow}, hooks: testHooks{listenConfig: viaProxy(proxy)}})
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)
	wait(t, &b.sig.listening)
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
	waitFor(t, &b.sig.retrying, func(k string) bool { return k == "k" })
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
	wait(t, &b.sig.listening) // it re-subscribed
}

var _ = context.Background
