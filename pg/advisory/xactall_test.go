package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// txHolds returns how many of keys tx's own backend holds, from pg_locks
// read inside tx (exclusive, granted).
func txHolds(ctx context.Context, tx pgx.Tx, keys []Key) (int, error) {
	var classids, objids []int64
	var objsubids []int16
	for _, k := range keys {
		c, o, s := k.pgLocksIDs()
		classids, objids, objsubids = append(classids, int64(c)), append(objids, int64(o)), append(objsubids, s)
	}
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks l
		JOIN unnest($1::int8[], $2::int8[], $3::int2[]) AS k(classid, objid, objsubid)
		  ON l.classid::int8 = k.classid AND l.objid::int8 = k.objid AND l.objsubid = k.objsubid
		WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted AND l.mode = 'ExclusiveLock'`,
		classids, objids, objsubids).Scan(&n)
	return n, err
}

// mappedSQLState returns the SQLSTATE kept in a mapped error's chain.
func mappedSQLState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// TestXactLockAllOrder: XactLockAll takes the keys in Key order whatever
// order they are given in, on the server: with the 10th of 20 keys
// (int64 and pair keys mixed) held elsewhere, the waiting transaction
// holds exactly the 9 keys before it in Key order, none after, and gets
// all 20 once it is free. Then COMMIT frees them all.
func TestXactLockAllOrder(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t, 20*time.Second)
	var keys []Key
	for i := range 20 {
		if i%3 == 0 {
			keys = append(keys, Pair(rand.Int32(), rand.Int32()))
		} else {
			keys = append(keys, randKey())
		}
	}
	sorted := slices.SortedFunc(slices.Values(keys), Key.compare)
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	blocker := openSession(t, pool, testOpts())
	bl, ok, err := blocker.TryLock(ctx, sorted[9])
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	tx := beginTx(t, pool)
	pid := backendPID(t, tx)
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { // a duplicate too
		defer close(finished)
		done <- XactLockAll(ctx, tx, append(keys, keys[3])...)
	}()
	defer func() { // on failure: free the key, so tx's connection can be rolled back
		_ = bl.Release(context.Background())
		<-finished
	}()
	waitFor(t, "the transaction waiting for the 10th key", func() bool { return waiting(t, pool, pid, sorted[9]) })
	held := grantedModes(t, pool, pid)
	for i, k := range sorted {
		_, h := held[k]
		if h != (i < 9) {
			t.Errorf("key %d of 20 in Key order: held %v while the transaction waits for key 9", i, h)
		}
	}
	if err := bl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, err := txHolds(ctx, tx, keys); n != 20 || err != nil {
		t.Fatalf("after XactLockAll the transaction holds %d of 20 keys (%v)", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if held := grantedModes(t, pool, pid); len(held) != 0 {
		t.Fatalf("held after COMMIT: %v", held)
	}
}

// TestXactLockAllNoDeadlock: 16 goroutines, each on its own connection,
// take {a, b} (half of them as {b, a}) with XactLockAll, 50 rounds each:
// no error (no 40P01 deadlock), and inside every transaction both keys
// are held (pg_locks) and no other transaction is inside at the same
// time. The control shows that taking the keys one by one in argument
// order does deadlock.
func TestXactLockAllNoDeadlock(t *testing.T) {
	t.Parallel()
	const goroutines, rounds = 16, 50
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = goroutines })
	ctx := ctxT(t, 120*time.Second)
	a, b := randKey(), Pair(rand.Int32(), rand.Int32())
	var inside atomic.Int32
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		keys := []Key{a, b}
		if g%2 == 1 {
			keys = []Key{b, a}
		}
		wg.Go(func() {
			for round := range rounds {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := XactLockAll(ctx, tx, keys...); err != nil {
						return err
					}
					if n := inside.Add(1); n != 1 {
						return fmt.Errorf("%d transactions inside at once", n)
					}
					defer inside.Add(-1)
					if n, err := txHolds(ctx, tx, keys); n != 2 || err != nil {
						return fmt.Errorf("XactLockAll returned holding %d of 2 keys (%v)", n, err)
					}
					return nil
				})
				if err != nil {
					errs[g] = fmt.Errorf("goroutine %d round %d (SQLSTATE %q): %w", g, round, mappedSQLState(err), err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	t.Run("control", func(t *testing.T) {
		// One by one in argument order, {a, b} against {b, a}: each holds
		// its first key, then waits for the other's: PostgreSQL aborts one
		// with 40P01 after deadlock_timeout (1 s).
		var wg sync.WaitGroup
		started := make(chan struct{}, 2)
		proceed := make(chan struct{})
		cerrs := make([]error, 2)
		for i, keys := range [][]Key{{a, b}, {b, a}} {
			wg.Go(func() {
				cerrs[i] = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := XactLock(ctx, tx, keys[0]); err != nil {
						return err
					}
					started <- struct{}{}
					<-proceed
					return XactLock(ctx, tx, keys[1])
				})
			})
		}
		<-started
		<-started
		close(proceed)
		wg.Wait()
		if mappedSQLState(cerrs[0]) != "40P01" && mappedSQLState(cerrs[1]) != "40P01" {
			t.Fatalf("no deadlock in the control: %v", cerrs)
		}
	})
}

// TestTryXactLockAll: false leaves none of the keys held (pg_locks, read
// in the transaction and from outside) and the transaction usable, a key
// the transaction held before stays held, and true holds them all. Then
// 16 goroutines race TryXactLockAll on {a, b} and {b, a}: every false
// leaves nothing held and every true holds both.
func TestTryXactLockAll(t *testing.T) {
	t.Parallel()
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 17 })
	ctx := ctxT(t, 60*time.Second)
	a, b, c := randKey(), Pair(rand.Int32(), rand.Int32()), randKey()
	keys := []Key{c, b, a}
	sorted := slices.SortedFunc(slices.Values(keys), Key.compare)

	t.Run("busy key", func(t *testing.T) {
		other := openSession(t, pool, testOpts())
		// The last key in Key order is busy, so every other key was taken
		// before the busy one was tried.
		ol, ok, err := other.TryLock(ctx, sorted[2])
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		tx := beginTx(t, pool)
		pid := backendPID(t, tx)
		if err := XactLock(ctx, tx, sorted[0]); err != nil { // held before: stays held
			t.Fatal(err)
		}
		ok, err = TryXactLockAll(ctx, tx, keys...)
		if ok || err != nil {
			t.Fatalf("TryXactLockAll with a busy key: %v %v", ok, err)
		}
		if n, err := txHolds(ctx, tx, keys); n != 1 || err != nil {
			t.Fatalf("after false the transaction holds %d keys in pg_locks, want 1 (the one held before): %v", n, err)
		}
		if held := grantedModes(t, pool, pid); len(held) != 1 || held[sorted[0]] == "" {
			t.Fatalf("after false, pg_locks from outside: %v", held)
		}
		// The key held before is still held once, not stacked by the
		// rolled-back try: ROLLBACK TO gave back only what the try took.
		if _, ok, _ := other.TryLock(ctx, sorted[0]); ok {
			t.Fatal("the key the transaction held before was freed by the rollback to the savepoint")
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("transaction not usable after false: %v", err)
		}
		if err := ol.Release(ctx); err != nil {
			t.Fatal(err)
		}
		ok, err = TryXactLockAll(ctx, tx, keys...)
		if !ok || err != nil {
			t.Fatalf("TryXactLockAll with every key free: %v %v", ok, err)
		}
		if n, err := txHolds(ctx, tx, keys); n != 3 || err != nil {
			t.Fatalf("after true the transaction holds %d of 3 keys: %v", n, err)
		}
		// A savepoint of the caller's survives, and still rolls back.
		if _, err := tx.Exec(ctx, "SAVEPOINT mine"); err != nil {
			t.Fatal(err)
		}
		k4 := randKey()
		if ok, err := TryXactLockAll(ctx, tx, k4, randKey()); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT mine"); err != nil {
			t.Fatalf("the caller's savepoint is gone: %v", err)
		}
		if n, _ := txHolds(ctx, tx, []Key{k4}); n != 0 {
			t.Fatal("rolling back the caller's savepoint kept a key taken after it")
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if held := grantedModes(t, pool, pid); len(held) != 0 {
			t.Fatalf("held after COMMIT: %v", held)
		}
	})

	t.Run("race", func(t *testing.T) {
		const goroutines, rounds = 16, 50
		var won, lost atomic.Int64
		var inside atomic.Int32
		errs := make([]error, goroutines)
		var wg sync.WaitGroup
		for g := range goroutines {
			ks := []Key{a, b}
			if g%2 == 1 {
				ks = []Key{b, a}
			}
			wg.Go(func() {
				for round := range rounds {
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						ok, err := TryXactLockAll(ctx, tx, ks...)
						if err != nil {
							return err
						}
						n, err := txHolds(ctx, tx, ks)
						if err != nil {
							return err
						}
						if !ok {
							lost.Add(1)
							if n != 0 {
								return fmt.Errorf("false, holding %d of 2 keys", n)
							}
							return nil
						}
						won.Add(1)
						if n := inside.Add(1); n != 1 {
							return fmt.Errorf("%d transactions hold the set at once", n)
						}
						defer inside.Add(-1)
						if n != 2 {
							return fmt.Errorf("true, holding %d of 2 keys", n)
						}
						return nil
					})
					if err != nil {
						errs[g] = fmt.Errorf("goroutine %d round %d: %w", g, round, err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d true, %d false", won.Load(), lost.Load())
	})
}

// TestTryXactLockAllErrorGivesBack: when the tries fail with a server
// error (here statement_timeout, 1 ms against 4000 keys), TryXactLockAll
// rolls back to its savepoint: the transaction is usable and holds none
// of the keys it had taken.
func TestTryXactLockAllErrorGivesBack(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t, 20*time.Second)
	keys := make([]Key, 4000)
	for i := range keys {
		keys[i] = randKey()
	}
	for attempt := range 20 {
		hit := func() bool {
			tx := beginTx(t, pool)
			defer tx.Rollback(ctx)
			// A first call on the connection prepares the statement (pgx's
			// cache) before the savepoint exists; a timeout there aborts the
			// transaction as any failed statement does (see the doc).
			if ok, err := TryXactLockAll(ctx, tx, randKey(), randKey()); err != nil || !ok {
				t.Fatalf("warm-up = %v, %v", ok, err)
			}
			if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '1ms'"); err != nil {
				t.Fatal(err)
			}
			ok, err := TryXactLockAll(ctx, tx, keys...)
			if err == nil {
				if !ok {
					t.Fatal("false with every key free")
				}
				return false // too fast for 1 ms: try again
			}
			wantCode(t, err, pglease.CodeNetworkTimeout)
			if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
				t.Fatalf("transaction not usable after the error: %v", err)
			}
			if n, err := txHolds(ctx, tx, keys); n != 0 || err != nil {
				t.Fatalf("after the error the transaction holds %d keys (%v)", n, err)
			}
			return true
		}()
		if hit {
			t.Logf("statement_timeout hit on attempt %d", attempt)
			return
		}
	}
	t.Skip("4000 tries never exceeded a 1 ms statement_timeout")
}

// writeCounter counts the writes on a connection's socket: pgx sends one
// round trip's messages (a query, or a pipelined batch) in one write.
type writeCounter struct {
	net.Conn
	n *atomic.Int64
}

func (w writeCounter) Write(p []byte) (int, error) {
	w.n.Add(1)
	return w.Conn.Write(p)
}

// TestXactLockAllRoundTrips: the round trips the godoc promises, counted
// as writes on the socket once the statements are prepared: XactLockAll
// 1; TryXactLockAll 2 with several keys (true or false), 1 with one key.
func TestXactLockAllRoundTrips(t *testing.T) {
	t.Parallel()
	var writes atomic.Int64
	pool := newPool(t, func(c *pgxpool.Config) {
		c.MaxConns = 1
		dial := c.ConnConfig.DialFunc
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeCounter{conn, &writes}, nil
		}
	})
	ctx := ctxT(t, 20*time.Second)
	other := openSession(t, newPool(t), testOpts())
	busy := randKey()
	if _, ok, err := other.TryLock(ctx, busy); !ok || err != nil {
		t.Fatal(ok, err)
	}
	tx := beginTx(t, pool)
	count := func(name string, want int64, f func() error) {
		t.Helper()
		if err := f(); err != nil { // prepares the statements
			t.Fatalf("%s: %v", name, err)
		}
		before := writes.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := writes.Load() - before; n != want {
			t.Errorf("%s: %d round trips, want %d", name, n, want)
		}
	}
	try := func(want bool, keys ...Key) func() error {
		return func() error {
			ok, err := TryXactLockAll(ctx, tx, keys...)
			if err == nil && ok != want {
				err = fmt.Errorf("TryXactLockAll = %v, want %v", ok, want)
			}
			return err
		}
	}
	count("XactLockAll", 1, func() error { return XactLockAll(ctx, tx, randKey(), randKey(), Pair(1, 2)) })
	count("TryXactLockAll true", 2, try(true, randKey(), randKey()))
	count("TryXactLockAll false", 2, try(false, randKey(), busy))
	one := randKey()
	count("TryXactLockAll one key", 1, try(true, one, one))
}
