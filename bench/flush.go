package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// measureFlush measures the flush bound of the server: one client on one
// connection commits a one-row UPDATE of a regular (WAL-logged) table with
// synchronous_commit=on, one round trip per commit, for d. Every hot-key
// critical section needs at least one such durable commit (its grant) in
// series, so 1 / (mean commit round trip) bounds the hot-key rate; the
// hot-key targets are shares of it. Latency is per commit.
func measureFlush(ctx context.Context, url string, d time.Duration) (Result, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return Result{}, err
	}
	defer c.Close(context.Background())
	table := pgx.Identifier{fmt.Sprintf("pglease_bench_flush_%d", time.Now().UnixNano())}.Sanitize()
	if _, err := c.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, n bigint NOT NULL)"); err != nil {
		return Result{}, err
	}
	defer func() { _, _ = c.Exec(context.Background(), "DROP TABLE "+table) }()
	if _, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (1, 0)"); err != nil {
		return Result{}, err
	}
	if _, err := c.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		return Result{}, err
	}
	upd := "UPDATE " + table + " SET n = n + 1 WHERE id = 1"
	return chain(d, "one-row-commit", "commit", func() error { _, err := c.Exec(ctx, upd); return err })
}

// chain runs op 20 times to warm up (prepare, fill caches), then one
// after another for d, and reports its rate and latencies as a flush
// scenario's result named impl.
func chain(d time.Duration, impl, latency string, op func() error) (Result, error) {
	for range 20 {
		if err := op(); err != nil {
			return Result{}, err
		}
	}
	var lats latencies
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if err := op(); err != nil {
			return Result{}, err
		}
		lats = append(lats, time.Since(t0))
	}
	el := time.Since(start).Seconds()
	_, p50, p99, mx := summarize([]latencies{lats})
	return Result{Scenario: "flush", Impl: impl, Callers: 1, Seconds: el, Cycles: int64(len(lats)),
		CyclesPerSec: float64(len(lats)) / el, P50Ms: ms(p50), P99Ms: ms(p99), MaxMs: ms(mx), Latency: latency}, nil
}

// mergeFlush reports the flush bound measured before and after the hot-key
// points as one result: their combined rate, the worse percentiles, and
// each run's rate as extras.
func mergeFlush(a, b Result) Result {
	r := a
	r.Seconds = a.Seconds + b.Seconds
	r.Cycles = a.Cycles + b.Cycles
	r.CyclesPerSec = float64(r.Cycles) / r.Seconds
	r.P50Ms, r.P99Ms, r.MaxMs = (a.P50Ms+b.P50Ms)/2, max(a.P99Ms, b.P99Ms), max(a.MaxMs, b.MaxMs)
	r.Extra = map[string]float64{"before_per_s": a.CyclesPerSec, "after_per_s": b.CyclesPerSec,
		"mean_commit_ms": 1000 / r.CyclesPerSec}
	return r
}

// measureHandOffChain measures what one hot-key section costs the server
// without the Manager: one client on one connection keeps one key and
// hands it to itself with the store's HandOff (the statement of a local
// hot-key section: release, fence increment, grant, holder row, durable
// commit), one round trip each, for d. Its rate bounds what the Manager's
// hot key can reach with this statement; next to the flush bound it
// shows what the statement costs beyond a one-row commit.
func measureHandOffChain(ctx context.Context, url string, d time.Duration) (Result, error) {
	pool, _, cleanup, err := benchSchema(ctx, url, 1)
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	st, err := store.New("pg.New", pool, store.Config{})
	if err != nil {
		return Result{}, err
	}
	key := fmt.Sprintf("bench-handoff-chain-%d", time.Now().UnixNano())
	r, err := st.Acquire(ctx, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !r.OK {
		return Result{}, fmt.Errorf("acquire: %+v, %v", r, err)
	}
	cur := r.LockID
	hand := func() error {
		next := keys.NewLockID()
		res, err := st.HandOff(ctx, []store.HandOffRequest{{Old: cur, Key: key, TTL: time.Minute, LockID: next}})
		if err != nil {
			return err
		}
		if !res[0].Released || !res[0].OK {
			return fmt.Errorf("handoff not granted: %+v", res[0])
		}
		cur = next
		return nil
	}
	res, err := chain(d, "handoff-chain", "handoff", hand)
	if err != nil {
		return Result{}, err
	}
	if _, err := st.Release(ctx, cur); err != nil {
		return Result{}, err
	}
	return res, nil
}

// measureGrantFloor measures the least any grant on SyncGuard's tables
// writes, without pglease: one client on one connection chains, for d,
// one plain prepared statement (no function, no advisory lock, no holder
// row, no notification) that increments the key's fence counter and
// rewrites its lock row with a new lockId, times and fence, as every grant
// does; the lock row's lock_id and expires_at_ms are indexed, so the
// update is not HOT. Synchronous commit is on. Next to the flush bound it
// shows what the two rows cost before any locking logic: no hot key on
// these tables can pass this rate.
func measureGrantFloor(ctx context.Context, url string, d time.Duration) (Result, error) {
	pool, _, cleanup, err := benchSchema(ctx, url, 1, syncCommit)
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	grant, err := grantFloorStmt(ctx, pool, "bench:grant-floor")
	if err != nil {
		return Result{}, err
	}
	return chain(d, "grant-floor", "grant", func() error { return grant(ctx, "", keys.NewLockID()) })
}

// syncCommit makes a pool's sessions commit with synchronous_commit on.
func syncCommit(pc *pgxpool.Config) { pc.ConnConfig.RuntimeParams["synchronous_commit"] = "on" }

// grantFloorStmt sets up key's fence counter and lock row on pool's
// SyncGuard tables and returns the grant floor's statement: one plain
// prepared statement that increments the counter and rewrites the row
// with lockId next (old is not checked). The pool's sessions must commit
// durably (syncCommit).
func grantFloorStmt(ctx context.Context, pool *pgxpool.Pool, key string) (func(ctx context.Context, old, next string) error, error) {
	fk := "fence:" + key // SyncGuard's fence key for a plain key
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Release()
	if _, err := c.Exec(ctx, `INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, 0, $2)`, fk, key); err != nil {
		return nil, err
	}
	if _, err := c.Exec(ctx, `INSERT INTO syncguard_locks (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
		VALUES ($1, $2, 0, 0, '000000000000000', $1)`, key, keys.NewLockID()); err != nil {
		return nil, err
	}
	// A prepared statement (pgx caches it): planned once, as the
	// statements of pglease's functions are.
	const grant = `WITH f AS (UPDATE syncguard_fence_counters SET fence = fence + 1 WHERE fence_key = $2 RETURNING fence),
		n AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS n)
		UPDATE syncguard_locks SET lock_id = $3, acquired_at_ms = n.n, expires_at_ms = n.n + 30000,
			fence = lpad(f.fence::text, 15, '0') FROM f, n WHERE key = $1`
	return func(ctx context.Context, _, next string) error {
		tag, err := pool.Exec(ctx, grant, key, fk, next)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("%d rows updated, want 1", tag.RowsAffected())
		}
		return err
	}, nil
}
