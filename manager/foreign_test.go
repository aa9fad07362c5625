package manager

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// sgAcquire runs SyncGuard 2.5.2's acquire statements on pool, in its
// order, in one transaction: the lockId of its grant, or "" when the key
// is live (SyncGuard's 1 s tolerance included). SyncGuard writes no
// holder row, and never LISTENs.
func sgAcquire(ctx context.Context, pool *pgxpool.Pool, key string) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", key); err != nil {
		return "", err
	}
	var now float64
	if err := tx.QueryRow(ctx, "SELECT EXTRACT(EPOCH FROM NOW()) * 1000").Scan(&now); err != nil {
		return "", err
	}
	var exp int64
	err = tx.QueryRow(ctx, "SELECT expires_at_ms FROM syncguard_locks WHERE key = $1", key).Scan(&exp)
	switch {
	case err == nil && exp > int64(now)-keys.TimeToleranceMs:
		return "", tx.Commit(ctx)
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return "", err
	}
	id := keys.NewLockID()
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{"INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, 0, $2) ON CONFLICT (fence_key) DO NOTHING", []any{"fence:" + key, key}},
		{"UPDATE syncguard_fence_counters SET fence = fence + 1 WHERE fence_key = $1", []any{"fence:" + key}},
		{`INSERT INTO syncguard_locks (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
		  VALUES ($1, $2, $3::bigint + 30000, $3::bigint, '000000000000001', $1)
		  ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
		  acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key`, []any{key, id, int64(now)}},
	} {
		if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
			return "", err
		}
	}
	return id, tx.Commit(ctx)
}

// sgRelease deletes the row of SyncGuard's grant id, as its release does
// (the release trigger then notifies the Managers).
func sgRelease(ctx context.Context, pool *pgxpool.Pool, id string) error {
	_, err := pool.Exec(ctx, "DELETE FROM syncguard_locks WHERE lock_id = $1", id)
	return err
}

// TestForeignPollerGetsHotKey: a key that a SyncGuard process also takes
// is shared in time. Three callers of one Manager hammer a key (acquire,
// release, again: local handoffs), with the release trigger installed,
// while a SyncGuard-like poller tries the key every 20 ms and never
// LISTENs. Once the Manager has found the key held by the poller, the
// poller gets the key within a few polls every time, and the Manager's
// callers still get it too. Without sharing, the Manager hands the key
// from caller to caller and re-takes it within a round trip of every
// plain release, and the poller waits for a lucky poll.
//
// Judged in polls, not wall time: the longest run of refused polls, and
// how many polls got the key.
func TestForeignPollerGetsHotKey(t *testing.T) {
	const channel = "pglease_foreign_test"
	b := setup(t, setupOpts{cfg: Config{Config: pg.Config{NotifyChannel: channel}}})
	ctx := ctxT(t)
	mg, err := migrate.New(b.admin, pg.Config{}) // the trigger needs the table owner
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.SetupReleaseTrigger(ctx, channel); err != nil {
		t.Fatal(err)
	}
	wait(t, &b.sig.listening)
	const key = "foreign:hot"
	// The poller holds the key first: the Manager's callers find a
	// holder that is not a pglease process.
	id, err := sgAcquire(ctx, b.admin, key)
	if err != nil || id == "" {
		t.Fatalf("first SyncGuard acquire = %q, %v", id, err)
	}
	stop := make(chan struct{})
	var sections atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				lk, err := b.m.Acquire(ctx, key, WithTTL(30*time.Second))
				if err != nil {
					errc <- err
					return
				}
				if err := lk.Release(ctx); err != nil {
					errc <- err
					return
				}
				sections.Add(1)
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
		select {
		case err := <-errc:
			t.Errorf("a Manager caller failed: %v", err)
		default:
		}
	}()
	wait(t, &b.sig.retrying) // a caller found the poller's holder
	if err := sgRelease(ctx, b.admin, id); err != nil {
		t.Fatal(err)
	}
	const polls = 100
	granted, run, longest := 0, 0, 0
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for range polls {
		<-tick.C
		id, err := sgAcquire(ctx, b.admin, key)
		if err != nil {
			t.Fatal(err)
		}
		if id == "" {
			run++
			longest = max(longest, run)
			continue
		}
		granted++
		run = 0
		if err := sgRelease(ctx, b.admin, id); err != nil {
			t.Fatal(err)
		}
	}
	n := sections.Load()
	t.Logf("poller: %d of %d polls granted, longest run of refused polls %d; Manager: %d sections", granted, polls, longest, n)
	// The Managers' stint (10 ms and a section) and the poll interval
	// (20 ms) make a refused poll mostly alone; 10 in a row is 200 ms of
	// refusals, which a loaded machine's slow sections can reach only
	// rarely.
	if longest > 10 {
		t.Errorf("the poller was refused %d polls in a row (want ≤ 10): the Manager kept the key", longest)
	}
	if granted < polls/4 {
		t.Errorf("the poller got the key at %d of %d polls (want ≥ %d)", granted, polls, polls/4)
	}
	if n < 20 {
		t.Errorf("the Manager's callers completed %d sections in %d polls' time (want ≥ 20): starved", n, polls)
	}
}
