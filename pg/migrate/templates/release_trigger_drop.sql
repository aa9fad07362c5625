DO $do$
DECLARE
  v_rel regclass := to_regclass('{t}');
  v_schema text;
BEGIN
  IF v_rel IS NULL THEN
    RETURN;
  END IF;
  SELECT n.nspname INTO v_schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = v_rel;
  IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = v_rel AND t.tgname = '{trigger}') THEN
    EXECUTE format('DROP TRIGGER %I ON %s', '{trigger}', v_rel);
  END IF;
  EXECUTE format('DROP FUNCTION IF EXISTS %I.%I()', v_schema, '{fn_trigger}');
END
$do$;
