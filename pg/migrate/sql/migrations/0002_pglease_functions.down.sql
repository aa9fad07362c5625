-- pglease migration 2 (pglease_functions), down: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
DROP FUNCTION IF EXISTS "pglease_acquire_95ff2f1cda"(text[], text[], text[], text[], bigint[], text);
DROP FUNCTION IF EXISTS "pglease_release_95ff2f1cda"(text[], text);
DROP FUNCTION IF EXISTS "pglease_extend_95ff2f1cda"(text[], bigint[]);
DROP FUNCTION IF EXISTS "pglease_handoff_95ff2f1cda"(text[], text[], text[], text[], text[], bigint[], text, text);
DROP TABLE IF EXISTS "syncguard_locks_holders";
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
-- The schema version record: SELECT * FROM "pglease_schema_858d8d6934"();
CREATE OR REPLACE FUNCTION "pglease_schema_858d8d6934"(OUT version integer, OUT compatible_from integer)
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 1, 1 $fn$;
