package store

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// LockInfo is the sanitized state of a live lock (pg.LockInfo has the
// same fields, so each converts to the other; its godoc is the
// reference).
type LockInfo struct {
	// KeyHash is pglease.HashKey of the (NFC) key.
	KeyHash string
	// LockIDHash is pglease.HashKey of the lockId.
	LockIDHash string
	// AcquiredAt and ExpiresAt are server times, millisecond precision.
	AcquiredAt, ExpiresAt time.Time
	// Fence is the grant's fencing token.
	Fence pglease.Fence
	// Holder is the holder identity the granting pglease process recorded
	// (Config.Holder, by default DefaultHolder()); "" when the holder did
	// not record one.
	Holder string
}

// String formats the sanitized fields.
func (i LockInfo) String() string {
	return fmt.Sprintf("store.LockInfo{KeyHash:%s LockIDHash:%s AcquiredAt:%s ExpiresAt:%s Fence:%s Holder:%q}",
		i.KeyHash, i.LockIDHash, i.AcquiredAt.UTC().Format(time.RFC3339Nano), i.ExpiresAt.UTC().Format(time.RFC3339Nano), i.Fence, i.Holder)
}

// RawLockInfo is LockInfo plus the raw key and lockId, returned only by
// the explicit LookupRaw* calls. Its String, Format and LogValue redact
// Key and LockID (read the fields directly when you mean to).
type RawLockInfo struct {
	LockInfo
	// Key is the NFC key as stored (user_key).
	Key string
	// LockID is the lock's lockId: a bearer secret.
	LockID string
}

// String shows the sanitized fields only.
func (i RawLockInfo) String() string {
	return "store.RawLockInfo{" + i.LockInfo.String() + " Key:[redacted] LockID:[redacted]}"
}

// Format makes every verb (%v, %+v, %#v, %s …) print String.
func (i RawLockInfo) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(i.String())) }

// Format makes every verb print String.
func (i LockInfo) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(i.String())) }

// LogValue logs the sanitized fields only.
func (i RawLockInfo) LogValue() slog.Value { return i.LockInfo.LogValue() }

// LogValue logs the fields (all sanitized).
func (i LockInfo) LogValue() slog.Value {
	return slog.GroupValue(slog.String("key_hash", i.KeyHash), slog.String("lock_id_hash", i.LockIDHash),
		slog.Time("acquired_at", i.AcquiredAt), slog.Time("expires_at", i.ExpiresAt), slog.String("fence", i.Fence.String()),
		slog.String("holder", i.Holder))
}

// IsLocked reports whether key has a live lock record, by SyncGuard's
// liveness rule: expires_at_ms + 1000 > server now (what an acquirer
// checks). One round trip, read-only.
func (s *Store) IsLocked(ctx context.Context, key string) (bool, error) {
	const op = "pg.IsLocked"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return false, err
	}
	k, err := keys.NormalizeKey(key)
	if err != nil {
		return false, WithOp(op, err)
	}
	var locked bool
	err = s.run(ctx, op, false, s.isLockedSQL, []any{k}, func(rows pgx.Rows) error { return rows.Scan(&locked) })
	return locked, err
}

// LookupByKey returns the sanitized state of key's lock, or nil, nil when
// there is none or it is not live (SyncGuard's rule, as IsLocked). It is
// SyncGuard's lookup({key}) and its getByKey helper.
func (s *Store) LookupByKey(ctx context.Context, key string) (*LockInfo, error) {
	return s.Lookup(ctx, "pg.LookupByKey", key)
}

// Lookup is LookupByKey with errors under op.
func (s *Store) Lookup(ctx context.Context, op, key string) (*LockInfo, error) {
	r, err := s.lookupKey(ctx, op, key)
	if r == nil || err != nil {
		return nil, err
	}
	return &r.LockInfo, nil
}

// LookupByID returns the sanitized state of the lock lockID holds, or
// nil, nil when there is none or it is not live. It is SyncGuard's
// lookup({lockId}) and its getById helper.
func (s *Store) LookupByID(ctx context.Context, lockID string) (*LockInfo, error) {
	r, err := s.lookupID(ctx, "pg.LookupByID", lockID)
	if r == nil || err != nil {
		return nil, err
	}
	return &r.LockInfo, nil
}

// LookupRawByKey is LookupByKey plus the raw key and lockId (SyncGuard's
// getByKeyRaw). Treat the result as secret.
func (s *Store) LookupRawByKey(ctx context.Context, key string) (*RawLockInfo, error) {
	return s.lookupKey(ctx, "pg.LookupRawByKey", key)
}

// LookupRawByID is LookupByID plus the raw key and lockId (SyncGuard's
// getByIdRaw).
func (s *Store) LookupRawByID(ctx context.Context, lockID string) (*RawLockInfo, error) {
	return s.lookupID(ctx, "pg.LookupRawByID", lockID)
}

// Owns reports whether lockID holds a live lock (SyncGuard's owns:
// lookup by lockId != nil). Diagnostic only: by the time you act on it the
// answer may be stale; use the fence to protect data.
func (s *Store) Owns(ctx context.Context, lockID string) (bool, error) {
	r, err := s.lookupID(ctx, "pg.Owns", lockID)
	return r != nil, err
}

func (s *Store) lookupKey(ctx context.Context, op, key string) (*RawLockInfo, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	k, err := keys.NormalizeKey(key)
	if err != nil {
		return nil, WithOp(op, err)
	}
	return s.lookup(ctx, op, s.lookupKeySQL, k)
}

func (s *Store) lookupID(ctx context.Context, op, lockID string) (*RawLockInfo, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if err := keys.ValidateLockID(lockID); err != nil {
		return nil, WithOp(op, err)
	}
	r, err := s.lookup(ctx, op, s.lookupIDSQL, lockID)
	if r != nil && r.LockID != lockID { // SyncGuard's in-code re-check
		return nil, err
	}
	return r, err
}

func (s *Store) lookup(ctx context.Context, op, sql, arg string) (*RawLockInfo, error) {
	var out *RawLockInfo
	err := s.run(ctx, op, false, sql, []any{arg}, func(rows pgx.Rows) error {
		var key, id, fence, userKey string
		var exp, acq int64
		var holder *string
		if err := rows.Scan(&key, &id, &exp, &acq, &fence, &userKey, &holder); err != nil {
			return err
		}
		f, err := keys.ParseFence(fence)
		if err != nil {
			return pgerr.New(pglease.CodeInternal, op, "stored fence is not 15 digits", nil)
		}
		out = &RawLockInfo{
			LockInfo: LockInfo{KeyHash: pglease.HashKey(userKey), LockIDHash: pglease.HashKey(id),
				AcquiredAt: time.UnixMilli(acq), ExpiresAt: time.UnixMilli(exp), Fence: f},
			Key: userKey, LockID: id,
		}
		if holder != nil {
			out.Holder = *holder
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
