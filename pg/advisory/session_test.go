package advisory

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestTwoSessionsOneWins(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s1, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 10*time.Second)
	k := randKey()
	var wg sync.WaitGroup
	locks := make([]*Lock, 2)
	errs := make([]error, 2)
	for i, s := range []*Session{s1, s2} {
		wg.Go(func() { locks[i], _, errs[i] = s.TryLock(ctx, k) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if (locks[0] == nil) == (locks[1] == nil) {
		t.Fatalf("want exactly one winner: %v", locks)
	}
	winner, loser := 0, 1
	if locks[0] == nil {
		winner, loser = 1, 0
	}
	if err := locks[winner].Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-locks[winner].Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	// The cause is the released sentinel, a *pglease.Error (it was
	// context.Canceled before the handles had one shape).
	var pe *pglease.Error
	if c := context.Cause(locks[winner].Context()); !errors.Is(c, pglease.ErrReleased) || !errors.As(c, &pe) {
		t.Errorf("cause after Release = %v, want ErrReleased", c)
	}
	if err := locks[winner].Err(); !errors.Is(err, pglease.ErrReleased) {
		t.Errorf("Err after Release = %v, want ErrReleased", err)
	}
	if err := locks[winner].Release(ctx); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
	l, ok, err := []*Session{s1, s2}[loser].TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatalf("loser after release: %v %v", ok, err)
	}
	_ = l.Release(ctx)
}

// TestConnectionCloseReleasesAndSignals: the holder's connection closes
// under it (no unlock): the server frees the lock for others and the
// holder's probe reports LockLost.
func TestConnectionCloseReleasesAndSignals(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s1, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 15*time.Second)
	k := randKey()
	l, ok, err := s1.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	s1.sem <- struct{}{} // take the connection away from the probe
	_ = s1.conn.PgConn().Close(ctx)
	<-s1.sem
	l2, err := s2.Lock(ctx, k)
	if err != nil {
		t.Fatalf("contender: %v", err)
	}
	defer l2.Release(ctx)
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("holder not told")
	}
	if c := context.Cause(l.Context()); !errors.Is(c, pglease.ErrLockLost) {
		t.Fatalf("cause = %v, want LockLost", c)
	}
}

func TestTerminateBackendSignalsLockLost(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s1, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 15*time.Second)
	k1, k2 := randKey(), randKey()
	locks, err := s1.LockAll(ctx, k1, k2)
	if err != nil {
		t.Fatal(err)
	}
	var terminated bool
	if err := superConn(t).QueryRow(ctx, "SELECT pg_terminate_backend($1)", s1.BackendPID()).Scan(&terminated); err != nil || !terminated {
		t.Fatalf("terminate: %v %v", terminated, err)
	}
	start := time.Now()
	for _, l := range locks {
		select {
		case <-l.Done():
		case <-ctx.Done():
			t.Fatal("holder not told")
		}
		if c := context.Cause(l.Context()); !errors.Is(c, pglease.ErrLockLost) {
			t.Fatalf("cause = %v, want LockLost", c)
		}
	}
	t.Logf("loss signalled %v after terminate (probe interval 100ms)", time.Since(start))
	wantCode(t, s1.Err(), pglease.CodeClosed)
	if !errors.Is(s1.Err(), pglease.ErrLockLost) {
		t.Errorf("session Err %v does not carry LockLost", s1.Err())
	}
	_, _, err = s1.TryLock(ctx, randKey())
	wantCode(t, err, pglease.CodeClosed)
	if err := locks[0].Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Errorf("Release after loss = %v, want LockLost", err)
	}
	if err := locks[0].Err(); !errors.Is(err, pglease.ErrLockLost) {
		t.Errorf("Err after loss = %v, want LockLost", err)
	}
	l, ok, err := s2.TryLock(ctx, k1)
	if !ok || err != nil {
		t.Fatalf("contender after terminate: %v %v", ok, err)
	}
	_ = l.Release(ctx)
}

func TestReentrancy(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t, 10*time.Second)
	other := openSession(t, pool, testOpts())

	t.Run("refused by default", func(t *testing.T) {
		s := openSession(t, pool, testOpts())
		k := randKey()
		l, ok, err := s.TryLock(ctx, k)
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		id, _ := k.Int64()
		for name, f := range map[string]func() error{
			"TryLock": func() error { _, _, err := s.TryLock(ctx, k); return err },
			"Lock":    func() error { _, err := s.Lock(ctx, k); return err },
			"LockAll": func() error { _, err := s.LockAll(ctx, randKey(), k); return err },
		} {
			err := f()
			wantCode(t, err, pglease.CodeInvalidArgument)
			if strings.Contains(err.Error(), strconv.FormatInt(id, 10)) {
				t.Errorf("%s: error shows the key id: %v", name, err)
			}
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := other.TryLock(ctx, k); !ok {
			t.Fatal("one Unlock did not free a lock taken once (it was stacked)")
		}
	})

	t.Run("explicit", func(t *testing.T) {
		o := testOpts()
		o.Reentrant = true
		s := openSession(t, pool, o)
		k := randKey()
		l1, err := s.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		l2, ok, err := s.TryLock(ctx, k)
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := other.TryLock(ctx, k); ok {
			t.Fatal("lock free after one of two Unlocks")
		}
		if l2.Context().Err() != nil {
			t.Fatal("second handle ended with the first")
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lo, ok, _ := other.TryLock(ctx, k)
		if !ok {
			t.Fatal("lock still held after both Unlocks")
		}
		_ = lo.Release(ctx)
	})
}

// TestLockCancelKeepsOtherLocks: a Lock whose ctx ends cancels its wait on
// the server (CancelRequest, not a closed connection) and the session's
// other locks stay held.
func TestLockCancelKeepsOtherLocks(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	o := testOpts()
	o.waitSlice = 20 * time.Second // so only the CancelRequest can end the wait early
	o.ProbeInterval = o.waitSlice
	o.userTimeout = 60 * time.Second
	o.keepaliveIdle = 60 * time.Second
	s1, s2 := openSession(t, pool, o), openSession(t, pool, o)
	ctx := ctxT(t, 20*time.Second)
	mine, busy := randKey(), randKey()
	lm, ok, err := s1.TryLock(ctx, mine)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	lb, ok, err := s2.TryLock(ctx, busy)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s1.Lock(wctx, busy)
	took := time.Since(start)
	wantCode(t, err, pglease.CodeAborted)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v does not wrap DeadlineExceeded", err)
	}
	if took > 5*time.Second {
		t.Errorf("Lock returned %v after its ctx; the wait was not cancelled", took)
	}
	if s1.Err() != nil || lm.Context().Err() != nil {
		t.Fatalf("session or other lock ended: %v %v", s1.Err(), context.Cause(lm.Context()))
	}
	if !heldBy(t, pool, s1.BackendPID(), mine) {
		t.Fatal("the session's other lock is gone")
	}
	infos, err := Inspect(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, li := range infos {
		if li.PID == s1.BackendPID() && !li.Granted {
			t.Fatalf("a wait is left on the server: %+v", li)
		}
	}
	if _, ok, _ := s2.TryLock(ctx, mine); ok {
		t.Fatal("other session took the cancelled waiter's held lock")
	}
	_ = lb.Release(ctx)
	_ = lm.Release(ctx)
}

// TestLockCancelRacesGrant: the holder releases at about the moment the
// waiter's ctx ends. Whatever wins, the waiter either returns the lock or
// does not hold it on the server.
func TestLockCancelRacesGrant(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	o := testOpts()
	o.waitSlice = 20 * time.Second
	o.ProbeInterval = o.waitSlice
	o.userTimeout = 60 * time.Second
	o.keepaliveIdle = 60 * time.Second
	s1, s2 := openSession(t, pool, o), openSession(t, pool, o)
	ctx := ctxT(t, 30*time.Second)
	granted, aborted := 0, 0
	for round := range 30 {
		k := randKey()
		lh, ok, err := s2.TryLock(ctx, k)
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		d := 20 * time.Millisecond
		wctx, cancel := context.WithTimeout(ctx, d)
		release := time.AfterFunc(d+time.Duration(rand.IntN(4000)-2000)*time.Microsecond, func() { _ = lh.Release(ctx) })
		l, err := s1.Lock(wctx, k)
		cancel()
		release.Stop()
		_ = lh.Release(ctx) // no-op if the timer did it
		switch {
		case err == nil:
			granted++
			if !heldBy(t, pool, s1.BackendPID(), k) {
				t.Fatalf("round %d: Lock succeeded but the server does not hold it", round)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case pglease.CodeOf(err) == pglease.CodeAborted:
			aborted++
			if heldBy(t, pool, s1.BackendPID(), k) {
				t.Fatalf("round %d: Lock gave up but the server still holds the lock for it", round)
			}
		default:
			t.Fatalf("round %d: %v", round, err)
		}
		if s1.Err() != nil {
			t.Fatal(s1.Err())
		}
	}
	t.Logf("granted %d, aborted %d", granted, aborted)
}

func TestLockAllNoDeadlock(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s1, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	keys := []Key{randKey(), Pair(rand.Int32(), rand.Int32()), randKey(), randKey()}
	rev := []Key{keys[3], keys[2], keys[1], keys[0]}
	for round := range 40 {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, s := range []*Session{s1, s2} {
			ks := keys
			if i == 1 {
				ks = rev
			}
			wg.Go(func() {
				locks, err := s.LockAll(ctx, ks...)
				if err != nil {
					errs[i] = err
					return
				}
				for j, l := range locks {
					if l.Key() != ks[j] {
						errs[i] = errors.New("locks not in argument order")
					}
					if err := l.Release(ctx); err != nil {
						errs[i] = errors.Join(errors.New("release failed"), err)
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}

	// Control: the same two sets taken in argument order on raw
	// connections do deadlock (PostgreSQL aborts one with 40P01 after
	// deadlock_timeout, 1 s), so the rounds above could have failed.
	t.Run("control", func(t *testing.T) {
		a, b := superConn(t), superConn(t)
		k1, k2 := randKey(), randKey()
		id1, _ := k1.Int64()
		id2, _ := k2.Int64()
		for c, id := range map[*pgx.Conn]int64{a: id1, b: id2} {
			if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		take := func(c *pgx.Conn, id int64) error {
			_, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", id)
			if err != nil { // the deadlock victim lets the other through
				_, _ = c.Exec(ctx, "SELECT pg_advisory_unlock_all()")
			}
			return err
		}
		wg.Go(func() { errs[0] = take(a, id2) })
		wg.Go(func() { errs[1] = take(b, id1) })
		wg.Wait()
		if sqlState(errs[0]) != "40P01" && sqlState(errs[1]) != "40P01" {
			t.Fatalf("no deadlock in the control: %v", errs)
		}
		for _, c := range []*pgx.Conn{a, b} {
			_, _ = c.Exec(ctx, "SELECT pg_advisory_unlock_all()")
		}
	})
}

// TestPooledConnectionNeverLeaksLock: with one pooled connection, the
// Session's connection is hijacked and never returns to the pool, so the
// pool's next user holds no advisory lock. The control shows the leak
// the hijack prevents.
func TestPooledConnectionNeverLeaksLock(t *testing.T) {
	t.Parallel()
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	ctx := ctxT(t, 10*time.Second)
	countMine := func() (pid int32, n int) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT pg_backend_pid(), (SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND pid = pg_backend_pid())`).Scan(&pid, &n)
		if err != nil {
			t.Fatal(err)
		}
		return pid, n
	}
	for _, unlockFirst := range []bool{true, false} {
		s, err := Open(ctx, pool, testOpts())
		if err != nil {
			t.Fatal(err)
		}
		l, ok, err := s.TryLock(ctx, randKey())
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		// While the lock is held the pool still serves (a new connection).
		if pid, n := countMine(); n != 0 || pid == s.BackendPID() {
			t.Fatalf("pool user pid %d sees %d advisory locks (session pid %d)", pid, n, s.BackendPID())
		}
		if unlockFirst {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if c := context.Cause(l.Context()); !unlockFirst && !errors.Is(c, pglease.ErrClosed) {
			t.Errorf("cause after Close = %v, want Closed", c)
		}
		if pid, n := countMine(); n != 0 {
			t.Fatalf("pool's next user (pid %d) holds %d advisory locks", pid, n)
		}
	}

	t.Run("control", func(t *testing.T) {
		id := rand.Int64()
		if _, err := pool.Exec(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
			t.Fatal(err)
		}
		defer pool.Exec(ctx, "SELECT pg_advisory_unlock_all()")
		if _, n := countMine(); n != 1 {
			t.Fatalf("control: pooled lock not leaked to the next user (%d locks)", n)
		}
	})
}

// TestBadInputNoIO: every rejected call does no I/O (counted with a pgx
// tracer on the session's connection and the pool).
func TestBadInputNoIO(t *testing.T) {
	t.Parallel()
	qc := &pgtest.Recorder{}
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc })
	o := &Options{ProbeInterval: 10 * time.Second}
	s := openSession(t, pool, o)
	ctx := ctxT(t, 10*time.Second)
	held, ok, err := s.TryLock(ctx, randKey())
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var nilPool *pgxpool.Pool
	var nilCtx context.Context
	before := qc.Queries()
	cases := []struct {
		name string
		code pglease.Code
		err  error
	}{
		{"Open nil ctx", pglease.CodeInvalidArgument, func() error { _, err := Open(nilCtx, pool, nil); return err }()},
		{"Open ended ctx", pglease.CodeAborted, func() error { _, err := Open(ended, pool, nil); return err }()},
		{"Open nil pool", pglease.CodeInvalidArgument, func() error { _, err := Open(ctx, nilPool, nil); return err }()},
		{"Open negative", pglease.CodeInvalidArgument, func() error { _, err := Open(ctx, pool, &Options{ProbeTimeout: -1}); return err }()},
		{"Open ProbeInterval + ProbeTimeout over half the server's 25 s", pglease.CodeInvalidArgument, func() error {
			_, err := Open(ctx, pool, &Options{ProbeInterval: 12 * time.Second})
			return err
		}()},
		{"Open keepalive too short", pglease.CodeInvalidArgument, func() error {
			_, err := Open(ctx, pool, &Options{connSettings: connSettings{userTimeout: time.Second}})
			return err
		}()},
		// Beyond what the server accepts.
		{"Open UserTimeout over int32 ms", pglease.CodeInvalidArgument, func() error {
			_, err := Open(ctx, pool, &Options{connSettings: connSettings{userTimeout: 25 * 24 * time.Hour}})
			return err
		}()},
		{"Open ServerIdleTimeout over int32 ms", pglease.CodeInvalidArgument, func() error {
			_, err := Open(ctx, pool, &Options{connSettings: connSettings{serverIdleTimeout: 25 * 24 * time.Hour}})
			return err
		}()},
		{"Open KeepaliveIdle over 32767 s", pglease.CodeInvalidArgument, func() error {
			_, err := Open(ctx, pool, &Options{connSettings: connSettings{keepaliveIdle: 32768 * time.Second}})
			return err
		}()},
		{"Open KeepaliveCount over 127", pglease.CodeInvalidArgument, func() error {
			_, err := Open(ctx, pool, &Options{connSettings: connSettings{keepaliveCount: 128}})
			return err
		}()},
		{"Open negative HoldLimit", pglease.CodeInvalidArgument, func() error { _, err := Open(ctx, pool, &Options{HoldLimit: -1}); return err }()},
		{"Open WaitSlice over ProbeInterval", pglease.CodeInvalidArgument, func() error {
			_, err := Open(ctx, pool, &Options{ProbeInterval: time.Second, connSettings: connSettings{waitSlice: 2 * time.Second}})
			return err
		}()},
		{"TryLock nil ctx", pglease.CodeInvalidArgument, func() error { _, _, err := s.TryLock(nilCtx, randKey()); return err }()},
		{"TryLock ended ctx", pglease.CodeAborted, func() error { _, _, err := s.TryLock(ended, randKey()); return err }()},
		{"TryLock zero key", pglease.CodeInvalidArgument, func() error { _, _, err := s.TryLock(ctx, Key{}); return err }()},
		{"Lock zero key", pglease.CodeInvalidArgument, func() error { _, err := s.Lock(ctx, Key{}); return err }()},
		{"LockAll none", pglease.CodeInvalidArgument, func() error { _, err := s.LockAll(ctx); return err }()},
		{"LockAll dup", pglease.CodeInvalidArgument, func() error { k := randKey(); _, err := s.LockAll(ctx, k, k); return err }()},
		{"Release nil ctx", pglease.CodeInvalidArgument, func() error { return held.Release(nilCtx) }()},
		{"nil session", pglease.CodeInvalidArgument, func() error { _, _, err := (*Session)(nil).TryLock(ctx, randKey()); return err }()},
		{"XactLock nil tx", pglease.CodeInvalidArgument, XactLock(ctx, nil, randKey())},
		{"XactLock zero key", pglease.CodeInvalidArgument, XactLock(ctx, tx, Key{})},
		{"XactLock ended ctx", pglease.CodeAborted, XactLock(ended, tx, randKey())},
		{"TryXactLock nil ctx", pglease.CodeInvalidArgument, func() error { _, err := TryXactLock(nilCtx, tx, randKey()); return err }()},
		{"TryLockShared nil ctx", pglease.CodeInvalidArgument, func() error { _, _, err := s.TryLockShared(nilCtx, randKey()); return err }()},
		{"TryLockShared zero key", pglease.CodeInvalidArgument, func() error { _, _, err := s.TryLockShared(ctx, Key{}); return err }()},
		{"LockShared ended ctx", pglease.CodeAborted, func() error { _, err := s.LockShared(ended, randKey()); return err }()},
		{"LockShared zero key", pglease.CodeInvalidArgument, func() error { _, err := s.LockShared(ctx, Key{}); return err }()},
		{"LockShared of a key held exclusive", pglease.CodeInvalidArgument, func() error { _, err := s.LockShared(ctx, held.Key()); return err }()},
		{"XactLockShared nil tx", pglease.CodeInvalidArgument, XactLockShared(ctx, nil, randKey())},
		{"XactLockShared zero key", pglease.CodeInvalidArgument, XactLockShared(ctx, tx, Key{})},
		{"TryXactLockShared nil tx", pglease.CodeInvalidArgument, func() error { _, err := TryXactLockShared(ctx, nil, randKey()); return err }()},
		{"TryXactLockShared zero key", pglease.CodeInvalidArgument, func() error { _, err := TryXactLockShared(ctx, tx, Key{}); return err }()},
		{"XactLockAll nil tx", pglease.CodeInvalidArgument, XactLockAll(ctx, nil, randKey())},
		{"XactLockAll none", pglease.CodeInvalidArgument, XactLockAll(ctx, tx)},
		{"XactLockAll zero key", pglease.CodeInvalidArgument, XactLockAll(ctx, tx, randKey(), Key{})},
		{"XactLockAll nil ctx", pglease.CodeInvalidArgument, XactLockAll(nilCtx, tx, randKey())},
		{"XactLockAll ended ctx", pglease.CodeAborted, XactLockAll(ended, tx, randKey())},
		{"TryXactLockAll nil tx", pglease.CodeInvalidArgument, func() error { _, err := TryXactLockAll(ctx, nil, randKey(), randKey()); return err }()},
		{"TryXactLockAll none", pglease.CodeInvalidArgument, func() error { _, err := TryXactLockAll(ctx, tx); return err }()},
		{"TryXactLockAll zero key", pglease.CodeInvalidArgument, func() error { _, err := TryXactLockAll(ctx, tx, randKey(), Key{}); return err }()},
		{"TryXactLockAll nil ctx", pglease.CodeInvalidArgument, func() error { _, err := TryXactLockAll(nilCtx, tx, randKey()); return err }()},
		{"WithXactLock nil pool", pglease.CodeInvalidArgument, WithXactLock(ctx, nilPool, randKey(), func(pgx.Tx) error { return nil })},
		{"WithXactLock nil fn", pglease.CodeInvalidArgument, WithXactLock(ctx, pool, randKey(), nil)},
		{"Inspect nil querier", pglease.CodeInvalidArgument, func() error { _, err := Inspect(ctx, nil, nil); return err }()},
		{"Inspect nil pool", pglease.CodeInvalidArgument, func() error { _, err := Inspect(ctx, nilPool, nil); return err }()},
		{"Inspect nil conn", pglease.CodeInvalidArgument, func() error { _, err := Inspect(ctx, (*pgx.Conn)(nil), nil); return err }()},
		{"Inspect nil ctx", pglease.CodeInvalidArgument, func() error { _, err := Inspect(nilCtx, pool, nil); return err }()},
	}
	for _, c := range cases {
		if pglease.CodeOf(c.err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.code)
		}
	}
	if n := qc.Queries() - before; n != 0 {
		t.Errorf("bad input caused %d queries", n)
	}

	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	before = qc.Queries()
	_, _, err = s.TryLock(ctx, randKey())
	wantCode(t, err, pglease.CodeClosed)
	_, err = s.Lock(ctx, randKey())
	wantCode(t, err, pglease.CodeClosed)
	_, err = s.LockAll(ctx, randKey())
	wantCode(t, err, pglease.CodeClosed)
	_, err = s.LockShared(ctx, randKey())
	wantCode(t, err, pglease.CodeClosed)
	_, _, err = s.TryLockShared(ctx, randKey())
	wantCode(t, err, pglease.CodeClosed)
	if err := held.Release(ctx); err != nil {
		t.Errorf("Release after Close = %v, want nil (Close released it)", err)
	}
	if err := held.Err(); !errors.Is(err, pglease.ErrClosed) {
		t.Errorf("Err after Close = %v, want Closed", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if n := qc.Queries() - before; n != 0 {
		t.Errorf("calls on a closed session caused %d queries", n)
	}
}

// TestLockTableFull: 53200 from the server is ResourceExhausted and the
// session recovers when capacity returns. It fills the whole server's
// lock table, so it runs only on the package's own throwaway cluster and
// not in parallel with other tests.
func TestLockTableFull(t *testing.T) {
	if pgtest.ClusterForTest() == nil {
		t.Skip("fills the server's lock table: only on a throwaway cluster")
	}
	pool := newPool(t)
	s := openSession(t, pool, testOpts())
	ctx := ctxT(t, 30*time.Second)
	filler, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close(ctx)
	base := rand.Int64N(1 << 60)
	_, err = filler.Exec(ctx, "SELECT count(pg_try_advisory_lock(i)) FROM generate_series($1::int8, $1::int8 + 10000000) i", base)
	if sqlState(err) != "53200" {
		t.Fatalf("filler: %v, want 53200", err)
	}
	_, _, err = s.TryLock(ctx, randKey())
	wantCode(t, err, pglease.CodeResourceExhausted)
	if !pglease.Retryable(err) {
		t.Error("ResourceExhausted not retryable")
	}
	if _, err := filler.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	l, ok, err := s.TryLock(ctx, randKey())
	if !ok || err != nil {
		t.Fatalf("after capacity returned: %v %v", ok, err)
	}
	_ = l.Release(ctx)
}

// TestOpenReplacesDeadPooledConnection: the pool's idle connection was
// ended by the server (here pg_terminate_backend; in production an
// idle_session_timeout or a restart) and the pool does not know yet; Open
// takes another connection instead of failing.
func TestOpenReplacesDeadPooledConnection(t *testing.T) {
	t.Parallel()
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	ctx := ctxT(t, 20*time.Second)
	var pid int32
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil { // the pool keeps this one idle
		t.Fatal(err)
	}
	if pool.Stat().IdleConns() != 1 {
		t.Fatalf("%d idle connections, want 1", pool.Stat().IdleConns())
	}
	admin := superConn(t)
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the backend to exit", func() bool {
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	s, err := Open(ctx, pool, testOpts())
	if err != nil {
		t.Fatalf("Open on a pool holding a dead connection: %v", err)
	}
	defer s.Close(ctx)
	if s.BackendPID() == pid {
		t.Fatal("the session runs on the terminated backend")
	}
	l, ok, err := s.TryLock(ctx, randKey())
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
