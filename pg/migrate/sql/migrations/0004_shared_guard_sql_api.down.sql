-- pglease migration 4 (shared_guard_sql_api), down: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
-- A guarded table keeps its guard: going down while one is installed
-- fails (remove the guards first: migrate.Migrator.Unguard, or
-- SELECT {lock}_unguard(table) for each).
DO $pglease$
DECLARE
  v_n integer;
BEGIN
  SELECT count(DISTINCT t.tgrelid) INTO v_n FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
    WHERE p.proname = 'pglease_guard_d2da60f171' AND p.pronamespace = (SELECT c.relnamespace FROM pg_class AS c WHERE c.oid = to_regclass('"syncguard_locks"'));
  IF v_n > 0 THEN
    RAISE EXCEPTION 'pglease: % tables are guarded by this lock table''s leases: remove their guards (Unguard) before going down', v_n
      USING ERRCODE = 'dependent_objects_still_exist';
  END IF;
END
$pglease$;
-- pglease_advisory_locks is shared by every lock table in its schema:
-- dropped only when no other one at version 4 or later is left there.
DO $pglease$
DECLARE
  v_fn regprocedure := to_regprocedure('"pglease_snapshot_07f27fb7aa"(text[])');
BEGIN
  IF v_fn IS NULL OR NOT EXISTS (
      SELECT 1 FROM pg_proc AS p, pg_proc AS h WHERE h.oid = v_fn AND p.pronamespace = h.pronamespace
        AND p.oid <> v_fn AND p.proname LIKE 'pglease\_snapshot\_%') THEN
    DROP VIEW IF EXISTS "pglease_advisory_locks";
  END IF;
END
$pglease$;
DROP VIEW IF EXISTS "syncguard_locks_leases";
DROP VIEW IF EXISTS "syncguard_locks_waiters";
DROP FUNCTION IF EXISTS "syncguard_locks_acquire"(text, bigint);
DROP FUNCTION IF EXISTS "syncguard_locks_release"(text);
DROP FUNCTION IF EXISTS "syncguard_locks_extend"(text, bigint);
DROP FUNCTION IF EXISTS "syncguard_locks_status"(text);
DROP FUNCTION IF EXISTS "syncguard_locks_revoke"(text, bigint, text);
DROP FUNCTION IF EXISTS "syncguard_locks_request_release"(text, text);
DROP FUNCTION IF EXISTS "syncguard_locks_guard"(regclass, name);
DROP FUNCTION IF EXISTS "syncguard_locks_guard"(regclass, name, boolean);
DROP FUNCTION IF EXISTS "syncguard_locks_unguard"(regclass);
DO $pglease$
DECLARE
  v_schema text;
BEGIN
  SELECT n.nspname INTO v_schema FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('"syncguard_locks"');
  IF v_schema IS NOT NULL THEN
    EXECUTE format('DROP FUNCTION IF EXISTS %I.%I()', v_schema, 'pglease_guard_d2da60f171');
  END IF;
END
$pglease$;
DROP FUNCTION IF EXISTS "pglease_snapshot_07f27fb7aa"(text[]);
DROP FUNCTION IF EXISTS "pglease_revoke_07f27fb7aa"(text[], bigint[], text[], text);
DROP FUNCTION IF EXISTS "pglease_handoff1_07f27fb7aa"(text, text, text, text, bigint, bigint, text, text);
DROP FUNCTION IF EXISTS "pglease_handoff_07f27fb7aa"(text[], text[], text[], text[], bigint[], bigint[], text, text);
DROP FUNCTION IF EXISTS "pglease_extend_07f27fb7aa"(text[], bigint[]);
DROP FUNCTION IF EXISTS "pglease_release_07f27fb7aa"(text[], text, integer, boolean);
DROP FUNCTION IF EXISTS "pglease_acquire_sets_07f27fb7aa"(integer[], text[], text[], text[], bigint[], bigint[], text, text, boolean[]);
DROP FUNCTION IF EXISTS "pglease_acquire_shared_07f27fb7aa"(text[], text[], text[], bigint[], integer[], text, text, boolean[]);
DROP FUNCTION IF EXISTS "pglease_acquire_07f27fb7aa"(text[], text[], text[], bigint[], bigint[], text, text, boolean[]);
DROP FUNCTION IF EXISTS "pglease_grant_07f27fb7aa"(text, text, text, bigint, bigint, text, text, bigint, boolean);
DROP FUNCTION IF EXISTS "pglease_check_07f27fb7aa"(text, integer, bigint);
DROP FUNCTION IF EXISTS "pglease_lockwait_07f27fb7aa"(text, integer, bigint);
DROP FUNCTION IF EXISTS "pglease_notify_07f27fb7aa"(text, text, integer, text);
DROP TABLE IF EXISTS "syncguard_locks_shared";
ALTER TABLE "syncguard_locks_holders" DROP COLUMN IF EXISTS excl_wait_until_ms, DROP COLUMN IF EXISTS lock_delay_ms, DROP COLUMN IF EXISTS delay_until_ms;
ALTER TABLE "syncguard_locks_holders" DROP COLUMN IF EXISTS revoked_lock_hash;
DROP FUNCTION IF EXISTS "pglease_qleave_07f27fb7aa"(text[], text);
DROP FUNCTION IF EXISTS "pglease_qrelease_07f27fb7aa"(text[], text, integer, boolean, boolean, text);
DROP FUNCTION IF EXISTS "pglease_qrefresh_07f27fb7aa"(text[], bigint);
DROP FUNCTION IF EXISTS "pglease_qwait1_07f27fb7aa"(text, text, text[], bigint[], bigint[], text, text, text, bigint);
DROP FUNCTION IF EXISTS "pglease_qrelease1_07f27fb7aa"(text, text, text, integer, boolean, boolean, text);
DROP FUNCTION IF EXISTS "pglease_qwait_07f27fb7aa"(integer[], text[], text[], text[], bigint[], bigint[], integer[], text, text, text, bigint, boolean[]);
DROP FUNCTION IF EXISTS "pglease_qserve_07f27fb7aa"(text, text, bigint, text);
DROP TABLE IF EXISTS "syncguard_locks_queue";
-- The schema version record: SELECT * FROM "pglease_schema_858d8d6934"();
CREATE OR REPLACE FUNCTION "pglease_schema_858d8d6934"(OUT version integer, OUT compatible_from integer)
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 3, 2 $fn$;
