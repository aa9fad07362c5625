-- +goose Up
-- +goose StatementBegin
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
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
-- pglease migration 1 (syncguard_tables), down: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
-- Keep SyncGuard's tables and fence counters unless asked explicitly:
-- SET pglease.drop_tables = 'on' (or options=-c pglease.drop_tables=on in the connection string).
DO $pglease$
BEGIN
  IF coalesce(current_setting('pglease.drop_tables', true), '') = 'on' THEN
    DROP TABLE IF EXISTS "syncguard_locks";
    DROP TABLE IF EXISTS "syncguard_fence_counters";
  ELSE
    RAISE NOTICE 'pglease: kept the lock and fence counter tables (set pglease.drop_tables = on to drop them)';
  END IF;
END
$pglease$;
-- The hashKey function is shared by every table pair in its schema and by
-- release triggers (SetupReleaseTrigger): drop it only when no other
-- function in its schema refers to it.
DO $pglease$
DECLARE
  v_fn regprocedure := to_regprocedure('"pglease_hashkey_v1"(text)');
BEGIN
  IF v_fn IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM pg_proc AS p, pg_proc AS h WHERE h.oid = v_fn AND p.pronamespace = h.pronamespace
        AND p.oid <> v_fn AND p.prosrc LIKE '%pglease\_hashkey\_v1%') THEN
    EXECUTE format('DROP FUNCTION %s', v_fn);
  END IF;
END
$pglease$;
DROP FUNCTION IF EXISTS "pglease_schema_858d8d6934"();
-- +goose StatementEnd
