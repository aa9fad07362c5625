package pgtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/keys"
)

// SyncGuard is a SyncGuard 2.5.2 process on one connection, on the
// default table names: the statements of its PostgreSQL backend,
// prepared once and then reused from the connection's statement cache as
// postgres.js does, including the `SELECT *` that would fail ("cached plan
// must not change result type") if a migration changed the lock table's
// columns.
type SyncGuard struct {
	tb   testing.TB
	conn *pgx.Conn
}

// NewSyncGuard connects a SyncGuard process with pool's connection
// config (closed when the test ends).
func NewSyncGuard(tb testing.TB, pool *pgxpool.Pool) *SyncGuard {
	tb.Helper()
	cfg := pool.Config().ConnConfig.Copy()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(c, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return &SyncGuard{tb: tb, conn: conn}
}

func (s *SyncGuard) ctx() context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s.tb.Cleanup(cancel)
	return c
}

// Acquire is SyncGuard's acquire: ok false when the key is live.
func (s *SyncGuard) Acquire(key string, ttl time.Duration) (lockID string, ok bool, err error) {
	c := s.ctx()
	tx, err := s.conn.Begin(c)
	if err != nil {
		return "", false, err
	}
	defer func() { _ = tx.Rollback(c) }()
	if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext($1))", key); err != nil {
		return "", false, err
	}
	var now float64
	if err := tx.QueryRow(c, "SELECT EXTRACT(EPOCH FROM NOW()) * 1000 AS now_ms").Scan(&now); err != nil {
		return "", false, err
	}
	rows, err := tx.Query(c, "SELECT * FROM syncguard_locks WHERE key = $1", key)
	if err != nil {
		return "", false, err
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		return "", false, err
	}
	if len(rs) == 1 && rs[0]["expires_at_ms"].(int64) > int64(now)-keys.TimeToleranceMs {
		return "", false, tx.Commit(c)
	}
	if _, err := tx.Exec(c, "INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, 0, $2) ON CONFLICT (fence_key) DO NOTHING", "fence:"+key, key); err != nil {
		return "", false, err
	}
	var fence int64
	if err := tx.QueryRow(c, "UPDATE syncguard_fence_counters SET fence = fence + 1 WHERE fence_key = $1 RETURNING fence", "fence:"+key).Scan(&fence); err != nil {
		return "", false, err
	}
	id := keys.NewLockID()
	if _, err := tx.Exec(c, `INSERT INTO syncguard_locks (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
		acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key`,
		key, id, int64(now)+ttl.Milliseconds(), int64(now), fmt.Sprintf("%015d", fence), key); err != nil {
		return "", false, err
	}
	return id, true, tx.Commit(c)
}

// ExtendOrRelease is SyncGuard's extend (its release when ttl is 0).
func (s *SyncGuard) ExtendOrRelease(lockID string, ttl time.Duration) (bool, error) {
	c := s.ctx()
	tx, err := s.conn.Begin(c)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(c) }()
	var now float64
	if err := tx.QueryRow(c, "SELECT EXTRACT(EPOCH FROM NOW()) * 1000 AS now_ms").Scan(&now); err != nil {
		return false, err
	}
	rows, err := tx.Query(c, "SELECT * FROM syncguard_locks WHERE lock_id = $1 FOR UPDATE", lockID)
	if err != nil {
		return false, err
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		return false, err
	}
	if len(rs) != 1 || rs[0]["expires_at_ms"].(int64) <= int64(now)-keys.TimeToleranceMs {
		return false, tx.Commit(c)
	}
	if ttl == 0 {
		_, err = tx.Exec(c, "DELETE FROM syncguard_locks WHERE key = $1", rs[0]["key"])
	} else {
		_, err = tx.Exec(c, "UPDATE syncguard_locks SET expires_at_ms = $1 WHERE key = $2", int64(now)+ttl.Milliseconds(), rs[0]["key"])
	}
	if err != nil {
		return false, err
	}
	return true, tx.Commit(c)
}
