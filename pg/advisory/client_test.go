package advisory

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// testClient returns a Client on pool with o, closed when the test ends.
func testClient(t testing.TB, pool *pgxpool.Pool, o *Options) *Client {
	t.Helper()
	c, err := NewClient(pool, o)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// clientPID is the backend pid of c's current session, 0 if none.
func clientPID(c *Client) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil {
		return 0
	}
	return c.sess.BackendPID()
}

// waitsOnServer reports whether backend pid waits for k (not granted).
func waitsOnServer(t testing.TB, pid int32, k Key) bool {
	t.Helper()
	infos, err := Inspect(ctxT(t, 5*time.Second), superConn(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, li := range infos {
		if li.PID == pid && li.Key == k && !li.Granted {
			return true
		}
	}
	return false
}

// localWaiters waits until n callers of c wait for k behind a caller of c.
func localWaiters(t testing.TB, c *Client, k Key, n int) {
	t.Helper()
	waitFor(t, "local waiters", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queues[k]) == n
	})
}

// stmtCounter counts the statements sent through a pool, except the
// session's probe (which runs on its own schedule).
type stmtCounter struct{ n atomic.Int64 }

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL != "SELECT pg_backend_pid()" {
		c.n.Add(1)
	}
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type lockResult struct {
	id  int
	l   *Lock
	err error
}

func recv(t testing.TB, ch <-chan lockResult) lockResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("timed out waiting for a call to return")
		return lockResult{}
	}
}

func waitEnded(t testing.TB, l *Lock) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("timed out waiting for the lock's context to end")
	}
}

// TestClientTwoClients: two Clients race for one key and exactly one
// wins; the loser's Lock waits on the server and is granted once the
// winner releases; a Release with an ended context still releases.
func TestClientTwoClients(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	c1, c2 := testClient(t, pool, testOpts()), testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	k := randKey()

	start := make(chan struct{})
	res := make([]lockResult, 2)
	var wg sync.WaitGroup
	for i, c := range []*Client{c1, c2} {
		wg.Go(func() {
			<-start
			l, ok, err := c.TryLock(ctx, k)
			if ok != (l != nil) {
				t.Errorf("ok = %v with lock %v", ok, l != nil)
			}
			res[i] = lockResult{i, l, err}
		})
	}
	close(start)
	wg.Wait()
	var winner *Lock
	var loser, other *Client
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("client %d: %v", i, r.err)
		}
		if r.l != nil {
			if winner != nil {
				t.Fatal("two winners")
			}
			winner, loser, other = r.l, []*Client{c2, c1}[i], []*Client{c1, c2}[i]
		}
	}
	if winner == nil {
		t.Fatal("no winner")
	}
	if winner.Key() != k || winner.Err() != nil {
		t.Fatalf("winner: key %v err %v", winner.Key(), winner.Err())
	}
	if _, ok, err := loser.TryLock(ctx, k); ok || err != nil {
		t.Fatalf("loser TryLock while held = %v, %v", ok, err)
	}
	got := make(chan lockResult, 1)
	go func() {
		l, err := loser.Lock(ctx, k)
		got <- lockResult{0, l, err}
	}()
	waitFor(t, "the loser waits on the server", func() bool { return waitsOnServer(t, clientPID(loser), k) })
	select {
	case r := <-got:
		t.Fatalf("Lock returned while the key was held: %v", r.err)
	default:
	}
	if err := winner.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if c := context.Cause(winner.Context()); !errors.Is(c, pglease.ErrReleased) {
		t.Fatalf("cause after Release = %v, want ErrReleased", c)
	}
	if err := winner.Release(ctx); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	r := recv(t, got)
	if r.err != nil {
		t.Fatalf("Lock after Release: %v", r.err)
	}
	if _, ok, err := other.TryLock(ctx, k); ok || err != nil {
		t.Fatalf("TryLock of the new holder's key = %v, %v", ok, err)
	}

	// Release with an ended context: Aborted, but released in the background.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.l.Release(ended); !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("Release(ended ctx) = %v, want Aborted", err)
	}
	l, err := other.Lock(ctx, k)
	if err != nil {
		t.Fatalf("Lock after a background unlock: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClientBadInputNoIO: bad arguments fail with typed errors before any
// I/O, and opening nothing; a key held through the Client is answered
// ok=false by a try and waited for by Lock, without a statement; after
// Close, calls fail with ErrClosed and Release sends nothing.
func TestClientBadInputNoIO(t *testing.T) {
	t.Parallel()
	qc := &stmtCounter{}
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc })
	for name, f := range map[string]func() error{
		"nil pool":  func() error { _, err := NewClient(nil, nil); return err },
		"reentrant": func() error { _, err := NewClient(pool, &Options{Reentrant: true}); return err },
		"negative":  func() error { _, err := NewClient(pool, &Options{ProbeInterval: -1}); return err },
		"too slow": func() error {
			_, err := NewClient(pool, &Options{ProbeInterval: 10 * time.Second, ProbeTimeout: 10 * time.Second})
			return err
		},
	} {
		if err := f(); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("NewClient %s = %v, want InvalidArgument", name, err)
		}
	}
	c := testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	//nolint:staticcheck // nil context on purpose
	var nilCtx context.Context
	k := randKey()
	check := func(name string, want error, call func() error) {
		t.Helper()
		before := qc.n.Load()
		err := call()
		if want == nil && err != nil {
			t.Errorf("%s: err = %v, want nil", name, err)
		}
		if want != nil && !errors.Is(err, want) {
			t.Errorf("%s: err = %v, want %v", name, err, want)
		}
		if err != nil && strings.Contains(err.Error(), k.String()[len("int64:"):]) {
			t.Errorf("%s: error echoes the key id", name)
		}
		if n := qc.n.Load() - before; n != 0 {
			t.Errorf("%s: %d statements", name, n)
		}
	}
	check("nil ctx", pglease.ErrInvalidArgument, func() error { _, err := c.Lock(nilCtx, k); return err })
	check("try nil ctx", pglease.ErrInvalidArgument, func() error { _, _, err := c.TryLock(nilCtx, k); return err })
	check("cancelled ctx", pglease.ErrAborted, func() error { _, err := c.Lock(cancelled, k); return err })
	check("zero key", pglease.ErrInvalidArgument, func() error { _, err := c.Lock(ctx, Key{}); return err })
	check("try zero key", pglease.ErrInvalidArgument, func() error { _, _, err := c.TryLock(ctx, Key{}); return err })
	check("zero client", pglease.ErrInvalidArgument, func() error { _, err := (&Client{}).Lock(ctx, k); return err })
	check("nil client", pglease.ErrInvalidArgument, func() error { _, _, err := (*Client)(nil).TryLock(ctx, k); return err })
	check("close nil client", pglease.ErrInvalidArgument, func() error { return (*Client)(nil).Close(ctx) })
	check("close nil ctx", pglease.ErrInvalidArgument, func() error { return c.Close(nilCtx) })
	if pid := clientPID(c); pid != 0 {
		t.Fatalf("bad input opened a session (pid %d)", pid)
	}

	// The positive control: a valid call sends statements.
	before := qc.n.Load()
	l, ok, err := c.TryLock(ctx, k)
	if err != nil || !ok {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	if qc.n.Load() == before {
		t.Fatal("the counter saw no statement for a valid call")
	}
	check("release nil ctx", pglease.ErrInvalidArgument, func() error { return l.Release(nilCtx) })
	check("try held key", nil, func() error {
		l2, ok, err := c.TryLock(ctx, k)
		if ok || l2 != nil {
			t.Errorf("try held key: ok = %v", ok)
		}
		return err
	})
	check("held key", pglease.ErrAborted, func() error {
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := c.Lock(wctx, k)
		if err == nil || !strings.Contains(err.Error(), "held through this Client") {
			t.Errorf("held key: %v, want a message that says the key was held through this Client", err)
		}
		return err
	})
	if l.Err() != nil {
		t.Fatalf("the refused calls ended the held lock: %v", l.Err())
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, pglease.ErrClosed) {
		t.Fatalf("cause after Close = %v, want ErrClosed", cause)
	}
	check("closed", pglease.ErrClosed, func() error { _, err := c.Lock(ctx, randKey()); return err })
	check("try closed", pglease.ErrClosed, func() error { _, _, err := c.TryLock(ctx, randKey()); return err })
	check("release after close", nil, func() error { return l.Release(ctx) })
	check("close again", nil, func() error { return c.Close(ctx) })
}

// TestClientOneOpen: concurrent first calls share one Open: every lock
// they take is held by the backend of the Client's one session.
func TestClientOneOpen(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	c := testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	const n = 8
	keys := make([]Key, n)
	locks := make([]*Lock, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		keys[i] = randKey()
		wg.Go(func() {
			<-start
			locks[i], errs[i] = c.Lock(ctx, keys[i])
		})
	}
	close(start)
	wg.Wait()
	pid := clientPID(c)
	if pid == 0 {
		t.Fatal("no session after the calls")
	}
	super := superConn(t)
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Lock %d: %v", i, errs[i])
		}
		if !heldBy(t, super, pid, keys[i]) {
			t.Errorf("key %d is not held by the session's backend", i)
		}
	}
	for _, l := range locks {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClientTerminate: pg_terminate_backend of the session's backend ends
// every lock with ErrLockLost (the server freed them), and the next call
// opens a new session.
func TestClientTerminate(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	c, peer := testClient(t, pool, testOpts()), testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	ka, kb := randKey(), randKey()
	la, err := c.Lock(ctx, ka)
	if err != nil {
		t.Fatal(err)
	}
	lb, ok, err := c.TryLock(ctx, kb)
	if err != nil || !ok {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	pid := clientPID(c)
	if _, err := superConn(t).Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lock{la, lb} {
		waitEnded(t, l)
		if !errors.Is(l.Err(), pglease.ErrLockLost) {
			t.Fatalf("cause = %v, want ErrLockLost", l.Err())
		}
	}
	if err := la.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Release of a lost lock = %v, want ErrLockLost", err)
	}
	pl, ok, err := peer.TryLock(ctx, kb)
	if err != nil || !ok {
		t.Fatalf("peer TryLock of a freed key = %v, %v", ok, err)
	}
	la2, err := c.Lock(ctx, ka)
	if err != nil {
		t.Fatalf("Lock after the loss: %v", err)
	}
	if np := clientPID(c); np == 0 || np == pid {
		t.Fatalf("session pid %d after the loss, old %d", np, pid)
	}
	if _, ok, err := peer.TryLock(ctx, ka); ok || err != nil {
		t.Fatalf("peer TryLock of the re-taken key = %v, %v", ok, err)
	}
	// The stale entry of lb does not block kb once the peer lets it go.
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb2, err := c.Lock(ctx, kb)
	if err != nil {
		t.Fatalf("Lock of the lost key: %v", err)
	}
	for _, l := range []*Lock{la2, lb2} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClientWaitBounded: a Lock whose ctx ends while the key is held
// elsewhere returns Aborted wrapping the ctx's error, and the Client's
// other locks stay held on the same session.
func TestClientWaitBounded(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	c, peer := testClient(t, pool, testOpts()), testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	mine, theirs := randKey(), randKey()
	l, err := c.Lock(ctx, mine)
	if err != nil {
		t.Fatal(err)
	}
	pid := clientPID(c)
	pl, err := peer.Lock(ctx, theirs)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Lock(wctx, theirs)
	cancel()
	if !errors.Is(err, pglease.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("bounded Lock = %v, want Aborted wrapping DeadlineExceeded", err)
	}
	if l.Err() != nil || clientPID(c) != pid {
		t.Fatalf("the other lock ended (%v) or the session changed", l.Err())
	}
	if _, ok, err := peer.TryLock(ctx, mine); ok || err != nil {
		t.Fatalf("peer TryLock of the still-held key = %v, %v", ok, err)
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := c.Lock(ctx, theirs)
	if err != nil {
		t.Fatalf("Lock after the holder left: %v", err)
	}
	for _, l := range []*Lock{l, l2} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClientWaitsForLocalHolder: callers of one Client exclude each
// other: Lock of a key held through it waits for the holder, FIFO,
// handed on at its Release (the key is then free on the server after the
// last one: nothing stacked on the shared session), at its loss (the
// session ended) and failed with ErrClosed by Close.
func TestClientWaitsForLocalHolder(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	c, peer := testClient(t, pool, testOpts()), testClient(t, pool, testOpts())
	ctx := ctxT(t, 60*time.Second)
	res := make(chan lockResult, 4)
	lockIn := func(id int, k Key) {
		go func() {
			l, err := c.Lock(ctx, k)
			res <- lockResult{id, l, err}
		}()
	}
	next := func() lockResult {
		t.Helper()
		r := recv(t, res)
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.id, r.err)
		}
		return r
	}

	k := randKey()
	l1, err := c.Lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	lockIn(1, k)
	localWaiters(t, c, k, 1)
	lockIn(2, k)
	localWaiters(t, c, k, 2)
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w1 := next()
	if w1.id != 1 {
		t.Fatalf("waiter %d handed the key first, want 1 (FIFO)", w1.id)
	}
	localWaiters(t, c, k, 1) // waiter 2 still waits while waiter 1 holds it
	select {
	case r := <-res:
		t.Fatalf("waiter %d handed the key while waiter 1 holds it", r.id)
	default:
	}
	if err := w1.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w2 := next()
	if w2.id != 2 {
		t.Fatalf("waiter %d, want 2", w2.id)
	}
	if _, ok, _ := peer.TryLock(ctx, k); ok {
		t.Fatal("another Client took the key while waiter 2 holds it")
	}
	if err := w2.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	pl, ok, err := peer.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatalf("key not free after the last local holder's Release (stacked on the session?): %v, %v", ok, err)
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The holder's loss hands over too, to a new session.
	k2 := randKey()
	l3, err := c.Lock(ctx, k2)
	if err != nil {
		t.Fatal(err)
	}
	lockIn(3, k2)
	localWaiters(t, c, k2, 1)
	if _, err := superConn(t).Exec(ctx, "SELECT pg_terminate_backend($1)", clientPID(c)); err != nil {
		t.Fatal(err)
	}
	w3 := next()
	if !errors.Is(l3.Err(), pglease.ErrLockLost) {
		t.Fatalf("the terminated holder's Err = %v", l3.Err())
	}
	if _, ok, _ := peer.TryLock(ctx, k2); ok {
		t.Fatal("another Client took the key handed to waiter 3")
	}
	if err := w3.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = l3.Release(ctx)

	// Close fails the waiters.
	k3 := randKey()
	if _, err := c.Lock(ctx, k3); err != nil {
		t.Fatal(err)
	}
	lockIn(4, k3)
	localWaiters(t, c, k3, 1)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, res); r.id != 4 || !errors.Is(r.err, pglease.ErrClosed) {
		t.Fatalf("waiter %d after Close: %v, want 4 with ErrClosed", r.id, r.err)
	}
}

// TestClientClose: Close ends held locks with ErrClosed, fails a Lock
// waiting on the server with ErrClosed, frees the keys on the server and
// leaves the Client refusing calls.
func TestClientClose(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	c, peer := testClient(t, pool, testOpts()), testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	held, contended := randKey(), randKey()
	pl, err := peer.Lock(ctx, contended)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Lock(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan lockResult, 1)
	go func() {
		l, err := c.Lock(ctx, contended)
		waiter <- lockResult{0, l, err}
	}()
	waitFor(t, "the Client waits on the server", func() bool { return waitsOnServer(t, clientPID(c), contended) })
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if r := recv(t, waiter); !errors.Is(r.err, pglease.ErrClosed) {
		t.Fatalf("waiting Lock = %v, want ErrClosed", r.err)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, pglease.ErrClosed) {
		t.Fatalf("cause = %v, want ErrClosed", cause)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after Close = %v, want nil", err)
	}
	pl2, ok, err := peer.TryLock(ctx, held)
	if err != nil || !ok {
		t.Fatalf("peer TryLock after Close = %v, %v", ok, err)
	}
	for _, l := range []*Lock{pl, pl2} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClientCloseUnderLoad: goroutines lock and unlock a few keys through
// one Client while it is closed. Every call ends in a lock or ErrClosed,
// and every Release in nil; no lock is held on the server afterwards; no
// goroutine leaks (goleak in TestMain).
func TestClientCloseUnderLoad(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	c, peer := testClient(t, pool, testOpts()), testClient(t, pool, testOpts())
	ctx := ctxT(t, 60*time.Second)
	keys := []Key{randKey(), randKey(), randKey()}
	var granted atomic.Int64
	halfway := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				l, err := c.Lock(ctx, keys[(g+i)%len(keys)])
				switch {
				case errors.Is(err, pglease.ErrClosed):
					return
				case err != nil:
					t.Errorf("Lock: %v", err)
					return
				}
				if granted.Add(1) == 50 {
					once.Do(func() { close(halfway) })
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	select {
	case <-halfway:
	case <-time.After(30 * time.Second):
		t.Fatal("no progress before Close")
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, k := range keys {
		pl, ok, err := peer.TryLock(ctx, k)
		if err != nil || !ok {
			t.Fatalf("peer TryLock after Close = %v, %v", ok, err)
		}
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClientHoldLimit: Options.HoldLimit ends a Client's lock's Context
// with HoldLimitExceeded while the lock stays held (no one else can take
// it, nor another caller of the Client); Release then releases it.
func TestClientHoldLimit(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	o := testOpts()
	o.HoldLimit = 200 * time.Millisecond
	c, peer := testClient(t, pool, o), testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	k := randKey()
	l, err := c.Lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, l)
	if !errors.Is(l.Err(), pglease.ErrHoldLimitExceeded) {
		t.Fatalf("cause = %v, want HoldLimitExceeded", l.Err())
	}
	if _, ok, err := peer.TryLock(ctx, k); ok || err != nil {
		t.Fatalf("peer TryLock past the limit = %v, %v, want held", ok, err)
	}
	if _, ok, err := c.TryLock(ctx, k); ok || err != nil {
		t.Fatalf("the Client's TryLock past the limit = %v, %v, want held", ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release past the limit = %v", err)
	}
	pl, ok, err := peer.TryLock(ctx, k)
	if err != nil || !ok {
		t.Fatalf("peer TryLock after Release = %v, %v", ok, err)
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// gatedPool returns a pool whose new connections wait, before they
// connect, until gate is closed or their context ends; connects counts
// the connections started.
func gatedPool(t testing.TB) (pool *pgxpool.Pool, gate chan struct{}, connects *atomic.Int64) {
	gate, connects = make(chan struct{}), &atomic.Int64{}
	pool = newPool(t, func(c *pgxpool.Config) {
		c.BeforeConnect = func(ctx context.Context, _ *pgx.ConnConfig) error {
			connects.Add(1)
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	return pool, gate, connects
}

// TestClientOpenOutlivesCaller: the session is opened once for all
// callers, detached from their contexts: a caller whose context ends while
// the session is being opened returns Aborted, and the open goes on for
// the caller who came next, which gets its lock on that same open (one
// connection made in all).
func TestClientOpenOutlivesCaller(t *testing.T) {
	t.Parallel()
	pool, gate, connects := gatedPool(t)
	c := testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	k := randKey()

	short, cancel := context.WithCancel(ctx)
	first := make(chan lockResult, 1)
	go func() {
		l, err := c.Lock(short, k)
		first <- lockResult{1, l, err}
	}()
	waitFor(t, "the open to start", func() bool { return connects.Load() == 1 })
	cancel()
	r := recv(t, first)
	if !errors.Is(r.err, pglease.ErrAborted) || !strings.Contains(r.err.Error(), "being opened") {
		t.Fatalf("Lock whose ctx ended during the open = %v, want Aborted while the session was being opened", r.err)
	}
	second := make(chan lockResult, 1)
	go func() {
		l, err := c.Lock(ctx, k)
		second <- lockResult{2, l, err}
	}()
	close(gate)
	r = recv(t, second)
	if r.err != nil {
		t.Fatalf("Lock after the first caller left: %v", r.err)
	}
	if n := connects.Load(); n != 1 {
		t.Errorf("%d connections made, want 1: the first caller's end cancelled the shared open", n)
	}
	if !heldBy(t, superConn(t), clientPID(c), k) {
		t.Error("the key is not held by the Client's session")
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClientCloseDuringOpen: Close while the session is being opened
// cancels the open: the waiting caller gets ErrClosed, Close returns, and
// no session is left (goleak in TestMain checks for goroutines).
func TestClientCloseDuringOpen(t *testing.T) {
	t.Parallel()
	pool, _, connects := gatedPool(t)
	c := testClient(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	res := make(chan lockResult, 1)
	go func() {
		l, err := c.Lock(ctx, randKey())
		res <- lockResult{1, l, err}
	}()
	waitFor(t, "the open to start", func() bool { return connects.Load() == 1 })
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, res); !errors.Is(r.err, pglease.ErrClosed) {
		t.Fatalf("Lock during Close = %v, want ErrClosed", r.err)
	}
	if pid := clientPID(c); pid != 0 {
		t.Fatalf("a session (pid %d) is left after Close", pid)
	}
}

// TestClientExclusion: goroutines of two Clients take one key over and
// over; at no moment do two of them hold it (callers of one Client are
// excluded by its queue, the two Clients by the server), and every call
// is granted.
func TestClientExclusion(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	clients := []*Client{testClient(t, pool, testOpts()), testClient(t, pool, testOpts())}
	ctx := ctxT(t, 120*time.Second)
	k := randKey()
	var holders, grants atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		c := clients[g%2]
		wg.Go(func() {
			for range 15 {
				l, err := c.Lock(ctx, k)
				if err != nil {
					t.Errorf("Lock: %v", err)
					return
				}
				if n := holders.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				grants.Add(1)
				holders.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := grants.Load(); n != 8*15 {
		t.Fatalf("%d grants, want %d", n, 8*15)
	}
}
