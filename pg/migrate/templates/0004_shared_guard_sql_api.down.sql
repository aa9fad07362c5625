-- A guarded table keeps its guard: going down while one is installed
-- fails (remove the guards first: migrate.Migrator.Unguard, or
-- SELECT {lock}_unguard(table) for each).
DO $pglease$
DECLARE
  v_n integer;
BEGIN
  SELECT count(DISTINCT t.tgrelid) INTO v_n FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
    WHERE p.proname = '{fn_guard_trigger}' AND p.pronamespace = (SELECT c.relnamespace FROM pg_class AS c WHERE c.oid = to_regclass('{t}'));
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
  v_fn regprocedure := to_regprocedure('{fn_snapshot}(text[])');
BEGIN
  IF v_fn IS NULL OR NOT EXISTS (
      SELECT 1 FROM pg_proc AS p, pg_proc AS h WHERE h.oid = v_fn AND p.pronamespace = h.pronamespace
        AND p.oid <> v_fn AND p.proname LIKE 'pglease\_snapshot\_%') THEN
    DROP VIEW IF EXISTS {v_advisory};
  END IF;
END
$pglease$;
DROP VIEW IF EXISTS {v_leases};
DROP VIEW IF EXISTS {v_waiters};
DROP FUNCTION IF EXISTS {api_acquire}(text, bigint);
DROP FUNCTION IF EXISTS {api_release}(text);
DROP FUNCTION IF EXISTS {api_extend}(text, bigint);
DROP FUNCTION IF EXISTS {api_status}(text);
DROP FUNCTION IF EXISTS {api_revoke}(text, bigint, text);
DROP FUNCTION IF EXISTS {api_request_release}(text, text);
DROP FUNCTION IF EXISTS {api_guard}(regclass, name);
DROP FUNCTION IF EXISTS {api_guard}(regclass, name, boolean);
DROP FUNCTION IF EXISTS {api_unguard}(regclass);
DO $pglease$
DECLARE
  v_schema text;
BEGIN
  SELECT n.nspname INTO v_schema FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('{t}');
  IF v_schema IS NOT NULL THEN
    EXECUTE format('DROP FUNCTION IF EXISTS %I.%I()', v_schema, '{fn_guard_trigger}');
  END IF;
END
$pglease$;
DROP FUNCTION IF EXISTS {fn_snapshot}(text[]);
DROP FUNCTION IF EXISTS {fn_revoke}(text[], bigint[], text[], text);
DROP FUNCTION IF EXISTS {fn_handoff1}(text, text, text, text, bigint, bigint, text, text);
DROP FUNCTION IF EXISTS {fn_handoff4}(text[], text[], text[], text[], bigint[], bigint[], text, text);
DROP FUNCTION IF EXISTS {fn_extend4}(text[], bigint[]);
DROP FUNCTION IF EXISTS {fn_release4}(text[], text, integer, boolean);
DROP FUNCTION IF EXISTS {fn_acquire_sets}(integer[], text[], text[], text[], bigint[], bigint[], text, text, boolean[]);
DROP FUNCTION IF EXISTS {fn_acquire_shared}(text[], text[], text[], bigint[], integer[], text, text, boolean[]);
DROP FUNCTION IF EXISTS {fn_acquire4}(text[], text[], text[], bigint[], bigint[], text, text, boolean[]);
DROP FUNCTION IF EXISTS {fn_grant}(text, text, text, bigint, bigint, text, text, bigint, boolean);
DROP FUNCTION IF EXISTS {fn_check}(text, integer, bigint);
DROP FUNCTION IF EXISTS {fn_lockwait}(text, integer, bigint);
DROP FUNCTION IF EXISTS {fn_notify}(text, text, integer, text);
DROP TABLE IF EXISTS {s};
ALTER TABLE {h} DROP COLUMN IF EXISTS excl_wait_until_ms, DROP COLUMN IF EXISTS lock_delay_ms, DROP COLUMN IF EXISTS delay_until_ms;
ALTER TABLE {h} DROP COLUMN IF EXISTS revoked_lock_hash;
DROP FUNCTION IF EXISTS {fn_qleave}(text[], text);
DROP FUNCTION IF EXISTS {fn_qrelease}(text[], text, integer, boolean, boolean, text);
DROP FUNCTION IF EXISTS {fn_qrefresh}(text[], bigint);
DROP FUNCTION IF EXISTS {fn_qwait1}(text, text, text[], bigint[], bigint[], text, text, text, bigint);
DROP FUNCTION IF EXISTS {fn_qrelease1}(text, text, text, integer, boolean, boolean, text);
DROP FUNCTION IF EXISTS {fn_qwait}(integer[], text[], text[], text[], bigint[], bigint[], integer[], text, text, text, bigint, boolean[]);
DROP FUNCTION IF EXISTS {fn_qserve}(text, text, bigint, text);
DROP TABLE IF EXISTS {q};
