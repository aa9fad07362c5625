package advisory

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// grantedModes returns, for backend pid, the mode of every advisory lock
// it holds (granted), from pg_locks.
func grantedModes(t testing.TB, q Querier, pid int32) map[Key]string {
	t.Helper()
	infos, err := Inspect(ctxT(t, 5*time.Second), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[Key]string{}
	for _, li := range infos {
		if li.PID == pid && li.Granted {
			out[li.Key] = li.Mode
		}
	}
	return out
}

// waiting reports whether backend pid waits for k in pg_locks.
func waiting(t testing.TB, q Querier, pid int32, k Key) bool {
	t.Helper()
	infos, err := Inspect(ctxT(t, 5*time.Second), q, nil)
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

// beginTx begins a transaction that is rolled back when the test ends (if
// it is still open), before the pool is closed: a test that fails with a
// transaction open must not leave pool.Close waiting for its connection.
func beginTx(t testing.TB, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(ctx)
	})
	return tx
}

func backendPID(t testing.TB, tx pgx.Tx) int32 {
	t.Helper()
	var pid int32
	if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestSharedLocksCoexistAndExclude: shared holders (sessions and a
// transaction) hold one key together and keep every exclusive taker out,
// a blocking exclusive taker gets it when the last one lets go, and an
// exclusive holder keeps shared takers out until it releases, when the
// waiting shared takers all get it together. For an int64 and a pair key.
func TestSharedLocksCoexistAndExclude(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t, 30*time.Second)
	const n = 5
	readers := make([]*Session, n)
	for i := range readers {
		readers[i] = openSession(t, pool, testOpts())
	}
	writer := openSession(t, pool, testOpts())

	for _, k := range []Key{randKey(), Pair(rand.Int32(), rand.Int32())} {
		// Shared holders coexist: n sessions at once, and a transaction.
		locks := make([]*Lock, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, s := range readers {
			wg.Go(func() {
				var ok bool
				locks[i], ok, errs[i] = s.TryLockShared(ctx, k)
				if errs[i] == nil && !ok {
					errs[i] = errors.New("TryLockShared: false while only shared holders hold the key")
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(k.space, err)
		}
		for i, s := range readers {
			if m := grantedModes(t, pool, s.BackendPID())[k]; m != "ShareLock" {
				t.Fatalf("%v: reader %d holds %q in pg_locks, want ShareLock", k.space, i, m)
			}
		}
		txr := beginTx(t, pool)
		if ok, err := TryXactLockShared(ctx, txr, k); !ok || err != nil {
			t.Fatalf("%v: TryXactLockShared beside shared session holders: %v %v", k.space, ok, err)
		}

		// ...and exclude every exclusive taker.
		if _, ok, err := writer.TryLock(ctx, k); ok || err != nil {
			t.Fatalf("%v: exclusive TryLock beside shared holders: %v %v", k.space, ok, err)
		}
		txw := beginTx(t, pool)
		if ok, err := TryXactLock(ctx, txw, k); ok || err != nil {
			t.Fatalf("%v: TryXactLock beside shared holders: %v %v", k.space, ok, err)
		}
		if ok, err := TryXactLockAll(ctx, txw, randKey(), k); ok || err != nil {
			t.Fatalf("%v: TryXactLockAll beside shared holders: %v %v", k.space, ok, err)
		}
		_ = txw.Rollback(ctx)

		// A blocking exclusive taker waits for the last shared holder.
		got := make(chan error, 1)
		var wl *Lock
		go func() {
			var err error
			wl, err = writer.Lock(ctx, k)
			got <- err
		}()
		waitFor(t, "the exclusive waiter in pg_locks", func() bool { return waiting(t, pool, writer.BackendPID(), k) })
		for _, l := range locks {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The transaction still holds it shared: the writer cannot have it.
		select {
		case err := <-got:
			t.Fatalf("%v: exclusive Lock returned while a transaction held the key shared: %v", k.space, err)
		default:
		}
		if err := txr.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("%v: exclusive Lock after the shared holders left: %v", k.space, err)
		}
		if m := grantedModes(t, pool, writer.BackendPID())[k]; m != "ExclusiveLock" {
			t.Fatalf("%v: writer holds %q, want ExclusiveLock", k.space, m)
		}

		// An exclusive holder excludes shared takers, session and transaction.
		for _, s := range readers {
			if _, ok, err := s.TryLockShared(ctx, k); ok || err != nil {
				t.Fatalf("%v: TryLockShared beside an exclusive holder: %v %v", k.space, ok, err)
			}
		}
		txr = beginTx(t, pool)
		if ok, err := TryXactLockShared(ctx, txr, k); ok || err != nil {
			t.Fatalf("%v: TryXactLockShared beside an exclusive holder: %v %v", k.space, ok, err)
		}
		_ = txr.Rollback(ctx)
		// Blocking shared takers wait, then all get it together.
		for i, s := range readers {
			wg.Go(func() { locks[i], errs[i] = s.LockShared(ctx, k) })
		}
		for _, s := range readers {
			waitFor(t, "the shared waiters in pg_locks", func() bool { return waiting(t, pool, s.BackendPID(), k) })
		}
		if err := wl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(k.space, err)
		}
		for i, l := range locks {
			if m := grantedModes(t, pool, readers[i].BackendPID())[k]; m != "ShareLock" {
				t.Fatalf("%v: reader %d holds %q after the writer left, want ShareLock", k.space, i, m)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		l, ok, err := writer.TryLock(ctx, k)
		if !ok || err != nil {
			t.Fatalf("%v: key not free after every shared Release: %v %v", k.space, ok, err)
		}
		_ = l.Release(ctx)
	}
}

// TestSharedExclusiveMutualExclusion: 12 goroutines, half on sessions and
// half in transactions, take one key shared or exclusive at random, 40
// rounds each; while a goroutine holds it exclusively no one else holds
// it, and while one holds it shared no one holds it exclusively.
func TestSharedExclusiveMutualExclusion(t *testing.T) {
	t.Parallel()
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	ctx := ctxT(t, 60*time.Second)
	k := randKey()
	var readers, writers, maxReaders atomic.Int64
	var shared, exclusive atomic.Int64
	hold := func(isShared bool) error {
		if isShared {
			shared.Add(1)
			r := readers.Add(1)
			defer readers.Add(-1)
			for m := maxReaders.Load(); r > m && !maxReaders.CompareAndSwap(m, r); m = maxReaders.Load() {
			}
			if w := writers.Load(); w != 0 {
				return errors.New("a shared holder beside an exclusive holder")
			}
		} else {
			exclusive.Add(1)
			w := writers.Add(1)
			defer writers.Add(-1)
			if r := readers.Load(); w != 1 || r != 0 {
				return errors.New("an exclusive holder beside " + strconv.FormatInt(w-1, 10) + " exclusive and " + strconv.FormatInt(r, 10) + " shared holders")
			}
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		return nil
	}
	const goroutines, rounds = 12, 40
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		var s *Session
		if g%2 == 0 {
			s = openSession(t, pool, testOpts())
		}
		wg.Go(func() {
			for range rounds {
				isShared := rand.IntN(3) != 0
				if s != nil {
					var l *Lock
					var err error
					if isShared {
						l, err = s.LockShared(ctx, k)
					} else {
						l, err = s.Lock(ctx, k)
					}
					if err != nil {
						errs[g] = err
						return
					}
					err = hold(isShared)
					if rerr := l.Release(ctx); err != nil || rerr != nil {
						errs[g] = errors.Join(err, rerr)
						return
					}
					continue
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					if isShared {
						err = XactLockShared(ctx, tx, k)
					} else {
						err = XactLock(ctx, tx, k)
					}
					if err != nil {
						return err
					}
					return hold(isShared)
				})
				if err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d shared and %d exclusive holds; at most %d shared holders at once", shared.Load(), exclusive.Load(), maxReaders.Load())
}

// TestSharedModeBookkeeping: the session refuses a key in the other mode
// than it holds it, with or without Reentrant, and with no I/O; with
// Reentrant, shared holds of one key stack and each needs its Release.
func TestSharedModeBookkeeping(t *testing.T) {
	t.Parallel()
	qc := &pgtest.Recorder{}
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc })
	ctx := ctxT(t, 20*time.Second)
	other := openSession(t, pool, testOpts())
	for _, reentrant := range []bool{false, true} {
		o := testOpts()
		o.Reentrant = reentrant
		s := openSession(t, pool, o)
		ex, sh := randKey(), randKey()
		le, ok, err := s.TryLock(ctx, ex)
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		ls, ok, err := s.TryLockShared(ctx, sh)
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		before := qc.Queries()
		calls := map[string]func() error{
			"LockShared of an exclusive key":    func() error { _, err := s.LockShared(ctx, ex); return err },
			"TryLockShared of an exclusive key": func() error { _, _, err := s.TryLockShared(ctx, ex); return err },
			"Lock of a shared key":              func() error { _, err := s.Lock(ctx, sh); return err },
			"TryLock of a shared key":           func() error { _, _, err := s.TryLock(ctx, sh); return err },
			"LockAll with a shared key":         func() error { _, err := s.LockAll(ctx, randKey(), sh); return err },
		}
		if !reentrant {
			calls["TryLockShared again"] = func() error { _, _, err := s.TryLockShared(ctx, sh); return err }
			calls["LockShared again"] = func() error { _, err := s.LockShared(ctx, sh); return err }
		}
		for name, f := range calls {
			err := f()
			if pglease.CodeOf(err) != pglease.CodeInvalidArgument {
				t.Errorf("reentrant=%v: %s: %v, want InvalidArgument", reentrant, name, err)
				continue
			}
			if id, _ := sh.Int64(); strings.Contains(err.Error(), strconv.FormatInt(id, 10)) {
				t.Errorf("%s: error shows the key id: %v", name, err)
			}
		}
		if n := qc.Queries() - before; n != 0 {
			t.Errorf("reentrant=%v: refused calls made %d queries", reentrant, n)
		}
		if got := grantedModes(t, pool, s.BackendPID()); got[ex] != "ExclusiveLock" || got[sh] != "ShareLock" || len(got) != 2 {
			t.Fatalf("reentrant=%v: pg_locks after the refusals: %v", reentrant, got)
		}
		if reentrant {
			// Shared holds stack: the key stays held shared until both go.
			ls2, err := s.LockShared(ctx, sh)
			if err != nil {
				t.Fatal(err)
			}
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if _, ok, _ := other.TryLock(ctx, sh); ok {
				t.Fatal("key free after one of two shared Releases")
			}
			if ls2.Context().Err() != nil {
				t.Fatal("second shared handle ended with the first")
			}
			ls = ls2
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// Released, a key may be taken in the other mode.
		l1, ok, err := s.TryLockShared(ctx, ex)
		if !ok || err != nil {
			t.Fatalf("shared after the exclusive Release: %v %v", ok, err)
		}
		l2, ok, err := s.TryLock(ctx, sh)
		if !ok || err != nil {
			t.Fatalf("exclusive after the shared Release: %v %v", ok, err)
		}
		_, _ = l1.Release(ctx), l2.Release(ctx)
		if got := grantedModes(t, pool, s.BackendPID()); len(got) != 0 {
			t.Fatalf("reentrant=%v: held after every Release: %v", reentrant, got)
		}
	}
}

// TestSharedLockLoss: shared locks are watched like exclusive ones: a
// terminated session ends them with LockLost, and an unlock the server
// answers false (the lock was gone behind the handle's back) ends the
// session as lost.
func TestSharedLockLoss(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t, 15*time.Second)

	t.Run("terminated", func(t *testing.T) {
		s, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
		k1, k2 := randKey(), Pair(rand.Int32(), rand.Int32())
		l1, err := s.LockShared(ctx, k1)
		if err != nil {
			t.Fatal(err)
		}
		l2, ok, err := s.TryLockShared(ctx, k2)
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		var terminated bool
		if err := superConn(t).QueryRow(ctx, "SELECT pg_terminate_backend($1)", s.BackendPID()).Scan(&terminated); err != nil || !terminated {
			t.Fatalf("terminate: %v %v", terminated, err)
		}
		for _, l := range []*Lock{l1, l2} {
			select {
			case <-l.Done():
			case <-ctx.Done():
				t.Fatal("shared holder not told of the loss")
			}
			if c := context.Cause(l.Context()); !errors.Is(c, pglease.ErrLockLost) {
				t.Fatalf("cause = %v, want LockLost", c)
			}
		}
		lx, err := s2.Lock(ctx, k1) // the server freed it
		if err != nil {
			t.Fatal(err)
		}
		_ = lx.Release(ctx)
	})

	t.Run("unlock answered false", func(t *testing.T) {
		s := openSession(t, pool, testOpts())
		k := randKey()
		l, ok, err := s.TryLockShared(ctx, k)
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		id, _ := k.Int64()
		s.sem <- struct{}{}
		var unlocked bool
		err = s.conn.QueryRow(ctx, "SELECT pg_advisory_unlock_shared($1::int8)", id).Scan(&unlocked)
		<-s.sem
		if err != nil || !unlocked {
			t.Fatalf("behind-the-back unlock: %v %v", unlocked, err)
		}
		if err := l.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
			t.Fatalf("Release after the server lost the shared lock = %v, want LockLost", err)
		}
		if err := s.Err(); !errors.Is(err, pglease.ErrLockLost) {
			t.Fatalf("session Err = %v, want LockLost", err)
		}
	})
}

// TestLockSharedCancelRacesGrant: as TestLockCancelRacesGrant for a
// shared waiter behind an exclusive holder: whatever wins, the waiter
// either returns the lock or does not hold the key on the server (the
// grant that raced the cancel is found in pg_locks by its mode and
// released with pg_advisory_unlock_shared).
func TestLockSharedCancelRacesGrant(t *testing.T) {
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
		l, err := s1.LockShared(wctx, k)
		cancel()
		release.Stop()
		_ = lh.Release(ctx)
		mode, held := grantedModes(t, pool, s1.BackendPID())[k]
		switch {
		case err == nil:
			granted++
			if mode != "ShareLock" {
				t.Fatalf("round %d: LockShared succeeded but the server holds %q", round, mode)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case pglease.CodeOf(err) == pglease.CodeAborted:
			aborted++
			if held {
				t.Fatalf("round %d: LockShared gave up but the server still holds the key (%s) for it", round, mode)
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

// TestInspectSharedAndWaiters: Inspect shows shared holders as ShareLock
// and an exclusive waiter behind them as ExclusiveLock with both holders
// as blocking pids; and a shared waiter behind an exclusive holder.
func TestInspectSharedAndWaiters(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	o := testOpts()
	o.waitSlice = 20 * time.Second // one continuous wait, so the waiter row stays
	o.ProbeInterval = o.waitSlice
	o.userTimeout, o.keepaliveIdle = 60*time.Second, 60*time.Second
	reader, writer := openSession(t, pool, o), openSession(t, pool, o)
	ctx := ctxT(t, 20*time.Second)
	k, k2 := randKey(), randKey()
	if _, ok, err := reader.TryLockShared(ctx, k); !ok || err != nil {
		t.Fatal(ok, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := XactLockShared(ctx, tx, k); err != nil {
		t.Fatal(err)
	}
	txPID := backendPID(t, tx)
	if _, ok, err := writer.TryLock(ctx, k2); !ok || err != nil {
		t.Fatal(ok, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { _, err := writer.Lock(wctx, k); done <- err }()
	go func() { _, err := reader.LockShared(wctx, k2); done <- err }()
	defer func() { cancel(); <-done; <-done }()

	var rows []LockInfo
	waitFor(t, "both waiters in pg_locks", func() bool {
		all, err := Inspect(ctx, pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		rows = slices.DeleteFunc(all, func(li LockInfo) bool { return li.Key != k && li.Key != k2 })
		return len(rows) == 5
	})
	byKey := map[Key][]LockInfo{}
	for _, li := range rows {
		byKey[li.Key] = append(byKey[li.Key], li)
	}
	r := byKey[k] // holders first, then the waiter
	if len(r) != 3 {
		t.Fatalf("rows of the shared key: %+v", r)
	}
	holders := []int32{r[0].PID, r[1].PID}
	slices.Sort(holders)
	want := []int32{reader.BackendPID(), txPID}
	slices.Sort(want)
	if !slices.Equal(holders, want) || !r[0].Granted || !r[1].Granted || r[0].Mode != "ShareLock" || r[1].Mode != "ShareLock" {
		t.Errorf("shared holders: %+v", r[:2])
	}
	w := r[2]
	blocking := slices.Clone(w.BlockingPIDs)
	slices.Sort(blocking)
	if w.PID != writer.BackendPID() || w.Granted || w.Mode != "ExclusiveLock" || !slices.Equal(blocking, want) || w.WaitStart.IsZero() != (serverMajor(t) < 14) {
		t.Errorf("exclusive waiter: %+v, want blocked by %v", w, want)
	}
	r2 := byKey[k2]
	if len(r2) != 2 || r2[0].PID != writer.BackendPID() || r2[0].Mode != "ExclusiveLock" || !r2[0].Granted ||
		r2[1].PID != reader.BackendPID() || r2[1].Mode != "ShareLock" || r2[1].Granted ||
		!slices.Equal(r2[1].BlockingPIDs, []int32{writer.BackendPID()}) {
		t.Errorf("exclusive holder and shared waiter: %+v", r2)
	}
	for _, li := range rows {
		t.Logf("%-28s pid=%d mode=%-13s granted=%-5v blocking=%v", li.Key, li.PID, li.Mode, li.Granted, li.BlockingPIDs)
	}
}
