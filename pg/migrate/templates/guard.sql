DO $pglease$
DECLARE
  v integer := 0;
BEGIN
  IF to_regprocedure('{fn_schema}()') IS NOT NULL THEN
    EXECUTE 'SELECT version FROM {fn_schema}()' INTO v;
  END IF;
  IF v IS DISTINCT FROM {want} THEN
    RAISE EXCEPTION 'pglease: schema version changed concurrently (now %, expected {want})', v USING ERRCODE = '{errcode}';
  END IF;
END
$pglease$;
