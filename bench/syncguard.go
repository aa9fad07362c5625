package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/keys"
)

// syncGuardProtocol replays SyncGuard 2.5.2's PostgreSQL protocol as
// written in syncguard-facts.md §4.2, statement for statement, with pgx:
// acquire is one 8-statement transaction (8 round trips), release 5. It is
// the baseline (a) pglease is measured against; it is not used by pglease.
type syncGuardProtocol struct {
	pool         *pgxpool.Pool
	locks, fence string // quoted identifiers
}

func newSyncGuardProtocol(pool *pgxpool.Pool, lockTable, fenceTable string) *syncGuardProtocol {
	return &syncGuardProtocol{pool: pool,
		locks: pgx.Identifier{lockTable}.Sanitize(), fence: pgx.Identifier{fenceTable}.Sanitize()}
}

func isLive(expiresAtMs, nowMs int64) bool { return expiresAtMs > nowMs-keys.TimeToleranceMs }

// acquire returns the lockId, or "" when the key is held.
func (s *syncGuardProtocol) acquire(ctx context.Context, key string, ttl time.Duration) (string, error) {
	lockID := keys.NewLockID()
	storageKey := key
	fenceKey := "fence:" + key
	tx, err := s.pool.Begin(ctx) // 1 BEGIN
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", storageKey); err != nil { // 2
		return "", err
	}
	var nowMs float64
	if err := tx.QueryRow(ctx, "SELECT EXTRACT(EPOCH FROM NOW()) * 1000 AS now_ms").Scan(&nowMs); err != nil { // 3
		return "", err
	}
	now := int64(math.Floor(nowMs))
	rows, err := tx.Query(ctx, "SELECT expires_at_ms FROM "+s.locks+" WHERE key = $1", storageKey) // 4
	if err != nil {
		return "", err
	}
	live := false
	for rows.Next() {
		var exp int64
		if err := rows.Scan(&exp); err != nil {
			rows.Close()
			return "", err
		}
		live = isLive(exp, now)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	if live {
		return "", tx.Commit(ctx) // SyncGuard commits the "locked" path (5 round trips)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+s.fence+" (fence_key, fence, key_debug) VALUES ($1, 0, $2) ON CONFLICT (fence_key) DO NOTHING", fenceKey, key); err != nil { // 5
		return "", err
	}
	var fence int64
	if err := tx.QueryRow(ctx, "UPDATE "+s.fence+" SET fence = fence + 1 WHERE fence_key = $1 RETURNING fence", fenceKey).Scan(&fence); err != nil { // 6
		return "", err
	}
	ttlMs := ttl.Milliseconds()
	if _, err := tx.Exec(ctx, "INSERT INTO "+s.locks+" (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key) VALUES ($1, $2, $3, $4, $5, $6) "+
		"ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms, "+
		"acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key",
		storageKey, lockID, now+ttlMs, now, fmt.Sprintf("%015d", fence), key); err != nil { // 7
		return "", err
	}
	return lockID, tx.Commit(ctx) // 8
}

func (s *syncGuardProtocol) release(ctx context.Context, lockID string) (bool, error) {
	tx, err := s.pool.Begin(ctx) // 1
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	var nowMs float64
	if err := tx.QueryRow(ctx, "SELECT EXTRACT(EPOCH FROM NOW()) * 1000 AS now_ms").Scan(&nowMs); err != nil { // 2
		return false, err
	}
	var key, gotID string
	var exp int64
	err = tx.QueryRow(ctx, "SELECT key, lock_id, expires_at_ms FROM "+s.locks+" WHERE lock_id = $1 FOR UPDATE", lockID).Scan(&key, &gotID, &exp) // 3
	if err == pgx.ErrNoRows {
		return false, tx.Commit(ctx)
	}
	if err != nil {
		return false, err
	}
	if gotID != lockID || !isLive(exp, int64(math.Floor(nowMs))) {
		return false, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+s.locks+" WHERE key = $1", key); err != nil { // 4
		return false, err
	}
	return true, tx.Commit(ctx) // 5
}
