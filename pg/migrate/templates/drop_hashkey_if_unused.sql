-- The hashKey function is shared by every table pair in its schema and by
-- release triggers (SetupReleaseTrigger): drop it only when no other
-- function in its schema refers to it.
DO $pglease$
DECLARE
  v_fn regprocedure := to_regprocedure('{fn_hash}(text)');
BEGIN
  IF v_fn IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM pg_proc AS p, pg_proc AS h WHERE h.oid = v_fn AND p.pronamespace = h.pronamespace
        AND p.oid <> v_fn AND p.prosrc LIKE '%pglease\_hashkey\_v1%') THEN
    EXECUTE format('DROP FUNCTION %s', v_fn);
  END IF;
END
$pglease$;
