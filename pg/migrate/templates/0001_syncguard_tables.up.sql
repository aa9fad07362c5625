-- SyncGuard 2.5.2's tables (byte-compatible; IF NOT EXISTS: SyncGuard may have created them).
CREATE TABLE IF NOT EXISTS {t} (
  key TEXT PRIMARY KEY,
  lock_id TEXT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  acquired_at_ms BIGINT NOT NULL,
  fence TEXT NOT NULL,
  user_key TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS {idx_lock_id} ON {t} (lock_id);
CREATE INDEX IF NOT EXISTS {idx_expires} ON {t} (expires_at_ms);
CREATE TABLE IF NOT EXISTS {f} (
  fence_key TEXT PRIMARY KEY,
  fence BIGINT NOT NULL DEFAULT 0,
  key_debug TEXT
);
