-- pglease migration 1 (syncguard_tables), up: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
-- SyncGuard 2.5.2's tables (byte-compatible; IF NOT EXISTS: SyncGuard may have created them).
CREATE TABLE IF NOT EXISTS "syncguard_locks" (
  key TEXT PRIMARY KEY,
  lock_id TEXT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  acquired_at_ms BIGINT NOT NULL,
  fence TEXT NOT NULL,
  user_key TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS "idx_syncguard_locks_lock_id" ON "syncguard_locks" (lock_id);
CREATE INDEX IF NOT EXISTS "idx_syncguard_locks_expires" ON "syncguard_locks" (expires_at_ms);
CREATE TABLE IF NOT EXISTS "syncguard_fence_counters" (
  fence_key TEXT PRIMARY KEY,
  fence BIGINT NOT NULL DEFAULT 0,
  key_debug TEXT
);
-- The schema version record: SELECT * FROM "pglease_schema_858d8d6934"();
CREATE OR REPLACE FUNCTION "pglease_schema_858d8d6934"(OUT version integer, OUT compatible_from integer)
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 1, 1 $fn$;
