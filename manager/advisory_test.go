package manager

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg/advisory"
)

// advKey returns a random int64-space key, so parallel tests never share
// one (advisory locks are per database, not per schema).
func advKey() advisory.Key { return advisory.Int64(rand.Int64()) }

// fastProbe makes m's advisory sessions notice a dead connection within
// about 100 ms (default 1 s). Call before m's first advisory call.
func fastProbe(m *Manager) {
	m.adv.mu.Lock()
	m.adv.opts = &advisory.Options{ProbeInterval: 100 * time.Millisecond, ProbeTimeout: time.Second}
	m.adv.mu.Unlock()
}

// advPID returns the backend pid of m's current advisory session, 0 if none.
func advPID(m *Manager) int32 {
	m.adv.mu.Lock()
	c := m.adv.c
	m.adv.mu.Unlock()
	if c == nil {
		return 0
	}
	return advFuncs.SessionPID(c)
}

// waitingFor reports whether m's advisory session is waiting on the
// server for a lock it has not been granted.
func waitingFor(t *testing.T, admin *pgxpool.Pool, m *Manager) bool {
	pid := advPID(m)
	if pid == 0 {
		return false
	}
	var n int
	if err := admin.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1", pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func waitErrCh(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(waitTimeout()):
		t.Fatal("timed out waiting for a call to return")
		return nil
	}
}

func waitDone(t *testing.T, l *advisory.Lock) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("timed out waiting for the advisory lock's context to end")
	}
}

type lockResult struct {
	l   *advisory.Lock
	err error
}

// TestAdvisoryTwoManagers: two Managers race for one key and exactly one
// wins; the loser's blocking LockAdvisory is granted once the winner
// unlocks; a Release with an ended context still releases.
func TestAdvisoryTwoManagers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noSignals: true})
	m1 := b.m
	m2, _ := b.newPeer(t, Config{})
	admin, _ := pgtest.Pool(t)
	ctx := ctxT(t)
	key := advKey()

	start := make(chan struct{})
	res := make([]lockResult, 2)
	var wg sync.WaitGroup
	for i, m := range []*Manager{m1, m2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, ok, err := m.TryLockAdvisory(ctx, key)
			if ok != (l != nil) {
				t.Errorf("ok = %v with lock %v", ok, l != nil)
			}
			res[i] = lockResult{l, err}
		}()
	}
	close(start)
	wg.Wait()
	winners := 0
	var winner *advisory.Lock
	var loser *Manager
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("manager %d: %v", i, r.err)
		}
		if r.l != nil {
			winners++
			winner = r.l
			loser = []*Manager{m2, m1}[i]
		}
	}
	if winners != 1 {
		t.Fatalf("%d winners, want 1", winners)
	}
	if winner.Key() != key || winner.Err() != nil {
		t.Fatalf("winner: key %v err %v", winner.Key(), winner.Err())
	}
	if _, ok, err := loser.TryLockAdvisory(ctx, key); ok || err != nil {
		t.Fatalf("loser TryLockAdvisory while held = %v, %v", ok, err)
	}

	// The loser waits; the winner's Release lets it in.
	got := make(chan lockResult, 1)
	go func() {
		l, err := loser.LockAdvisory(ctx, key)
		got <- lockResult{l, err}
	}()
	eventually(t, waitTimeout(), "the loser waits on the server", func() bool { return waitingFor(t, admin, loser) })
	select {
	case r := <-got:
		t.Fatalf("LockAdvisory returned while the key was held: %v", r.err)
	default:
	}
	if err := winner.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if c := context.Cause(winner.Context()); !errors.Is(c, pglease.ErrReleased) {
		t.Fatalf("cause after Release = %v, want pglease.ErrReleased", c)
	}
	if err := winner.Release(ctx); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	var r lockResult
	select {
	case r = <-got:
	case <-time.After(waitTimeout()):
		t.Fatal("the waiter was not granted the key after Release")
	}
	if r.err != nil {
		t.Fatalf("LockAdvisory after Release: %v", r.err)
	}
	other := m1
	if loser == m1 {
		other = m2
	}
	if _, ok, err := other.TryLockAdvisory(ctx, key); ok || err != nil {
		t.Fatalf("TryLockAdvisory of the new holder's key = %v, %v", ok, err)
	}

	// Release with an ended context: Aborted, but released in the background.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.l.Release(ended); !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("Release(ended ctx) = %v, want Aborted", err)
	}
	l, err := other.LockAdvisory(ctx, key)
	if err != nil {
		t.Fatalf("LockAdvisory after a background unlock: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAdvisoryBadInputNoIO: nil or ended context, zero key and a closed
// Manager fail with typed errors and send no statement; a valid call does
// send one; a key already held through this Manager is answered ok=false
// by a try, and waited for by LockAdvisory, without a statement either.
func TestAdvisoryBadInputNoIO(t *testing.T) {
	t.Parallel()
	qc, qn := queryCounter("", "SELECT pg_backend_pid()")
	// No listener: its connection (the pool's config, so this tracer)
	// sends statements of its own at any time.
	b := setup(t, setupOpts{cfg: Config{DisableNotify: true}, noSignals: true, pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc }}})
	m := b.m
	ctx := ctxT(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	//nolint:staticcheck // nil context on purpose
	var nilCtx context.Context
	key := advKey()

	check := func(name string, want *pglease.Error, call func() error) {
		t.Helper()
		before := qn.Load()
		err := call()
		if want == nil && err != nil {
			t.Errorf("%s: err = %v, want nil", name, err)
		}
		if want != nil && !errors.Is(err, want) {
			t.Errorf("%s: err = %v, want code %v", name, err, want.Code)
		}
		if err != nil && strings.Contains(err.Error(), key.String()[len("int64:"):]) {
			t.Errorf("%s: error echoes the key id", name)
		}
		if n := qn.Load() - before; n != 0 {
			t.Errorf("%s: %d statements for bad input", name, n)
		}
	}
	check("nil ctx", pglease.ErrInvalidArgument, func() error { _, err := m.LockAdvisory(nilCtx, key); return err })
	check("try nil ctx", pglease.ErrInvalidArgument, func() error { _, _, err := m.TryLockAdvisory(nilCtx, key); return err })
	check("cancelled ctx", pglease.ErrAborted, func() error { _, err := m.LockAdvisory(cancelled, key); return err })
	check("zero key", pglease.ErrInvalidArgument, func() error { _, err := m.LockAdvisory(ctx, advisory.Key{}); return err })
	check("try zero key", pglease.ErrInvalidArgument, func() error { _, _, err := m.TryLockAdvisory(ctx, advisory.Key{}); return err })
	check("release nil ctx", pglease.ErrInvalidArgument, func() error { return (&advisory.Lock{}).Release(nilCtx) })
	check("release zero lock", pglease.ErrInvalidArgument, func() error { return (&advisory.Lock{}).Release(ctx) })
	if pid := advPID(m); pid != 0 {
		t.Fatalf("bad input opened a session (pid %d)", pid)
	}

	// The positive control: a valid call does send statements.
	before := qn.Load()
	l, ok, err := m.TryLockAdvisory(ctx, key)
	if err != nil || !ok {
		t.Fatalf("TryLockAdvisory = %v, %v", ok, err)
	}
	if qn.Load() == before {
		t.Fatal("the statement counter saw no statement for a valid call")
	}
	check("release nil ctx of a held lock", pglease.ErrInvalidArgument, func() error { return l.Release(nilCtx) })
	// A key held through this Manager: the try answers ok=false and the
	// wait waits for the local holder, both without I/O (the wait ends
	// with its context here, saying who held the key).
	check("try held key", nil, func() error {
		l2, ok, err := m.TryLockAdvisory(ctx, key)
		if ok || l2 != nil {
			t.Errorf("try held key: ok = %v", ok)
		}
		return err
	})
	check("held key", pglease.ErrAborted, func() error {
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := m.LockAdvisory(wctx, key)
		if err == nil || !strings.Contains(err.Error(), "held by this process") {
			t.Errorf("held key: %v, want a message that says the key was held by this process", err)
		}
		return err
	})
	if l.Err() != nil {
		t.Fatalf("the refused call ended the held lock: %v", l.Err())
	}

	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if c := context.Cause(l.Context()); !errors.Is(c, pglease.ErrClosed) {
		t.Fatalf("cause after Close = %v, want ErrClosed", c)
	}
	check("closed", pglease.ErrClosed, func() error { _, err := m.LockAdvisory(ctx, advKey()); return err })
	check("try closed", pglease.ErrClosed, func() error { _, _, err := m.TryLockAdvisory(ctx, advKey()); return err })
	before = qn.Load()
	if err := l.Release(ctx); err != nil || qn.Load() != before {
		t.Fatalf("Release after Close = %v with %d statements, want nil and none", err, qn.Load()-before)
	}
}

// TestAdvisoryClose: Close cancels held advisory locks with ErrClosed,
// fails a waiting LockAdvisory with ErrClosed, frees the server locks
// (another Manager takes them) and leaves the Manager refusing calls.
func TestAdvisoryClose(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noSignals: true})
	m := b.m
	peer, _ := b.newPeer(t, Config{})
	admin, _ := pgtest.Pool(t)
	ctx := ctxT(t)
	held, contended := advKey(), advKey()
	pl, err := peer.LockAdvisory(ctx, contended)
	if err != nil {
		t.Fatal(err)
	}
	l, err := m.LockAdvisory(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() {
		_, err := m.LockAdvisory(ctx, contended)
		waiter <- err
	}()
	eventually(t, waitTimeout(), "the Manager waits on the server", func() bool { return waitingFor(t, admin, m) })

	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-m.Done():
	default:
		t.Fatal("Done not closed after Close returned")
	}
	if err := waitErrCh(t, waiter); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("waiting LockAdvisory = %v, want ErrClosed", err)
	}
	if c := context.Cause(l.Context()); !errors.Is(c, pglease.ErrClosed) {
		t.Fatalf("cause = %v, want ErrClosed", c)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after Close = %v, want nil", err)
	}
	pl2, ok, err := peer.TryLockAdvisory(ctx, held)
	if err != nil || !ok {
		t.Fatalf("peer TryLockAdvisory after Close = %v, %v", ok, err)
	}
	if _, err := m.LockAdvisory(ctx, advKey()); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("LockAdvisory after Close = %v", err)
	}
	for _, l := range []*advisory.Lock{pl, pl2} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdvisoryCloseUnderLoad: goroutines lock and unlock a few shared
// keys through one Manager while it is closed. Every call ends in a
// lock (callers of the Manager wait for each other) or ErrClosed, and
// every Release in nil; no lock is held in the server afterwards; no goroutine
// leaks (goleak in TestMain).
func TestAdvisoryCloseUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noSignals: true})
	m := b.m
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)
	keys := []advisory.Key{advKey(), advKey(), advKey()}
	var granted atomic.Int64
	halfway := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				k := keys[(g+i)%len(keys)]
				l, err := m.LockAdvisory(ctx, k)
				switch {
				case errors.Is(err, pglease.ErrClosed):
					return
				case err != nil:
					t.Errorf("LockAdvisory: %v", err)
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
		}()
	}
	select {
	case <-halfway:
	case <-time.After(waitTimeout()):
		t.Fatal("no progress before Close")
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, k := range keys {
		pl, ok, err := peer.TryLockAdvisory(ctx, k)
		if err != nil || !ok {
			t.Fatalf("peer TryLockAdvisory after Close = %v, %v", ok, err)
		}
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
