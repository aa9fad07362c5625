-- pglease release trigger: deleting a lock row notifies hashKey(user_key)
-- on its wake channel (the channel, '.', the hash's hex digits 7 and 8).
DO $do$
DECLARE
  v_rel regclass := to_regclass('{t}');
  v_schema text;
  v_hash text;
  v_fn text;
  v_fnoid oid;
BEGIN
  IF v_rel IS NULL THEN
    RAISE EXCEPTION 'pglease: lock table missing (run SetupSchema first)' USING ERRCODE = 'undefined_table';
  END IF;
  SELECT n.nspname INTO v_schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = v_rel;
  SELECT format('%I.%I', n.nspname, p.proname) INTO v_hash
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = to_regprocedure('{fn_hash}(text)');
  IF v_hash IS NULL THEN
    RAISE EXCEPTION 'pglease: hashKey function missing (run SetupSchema first)' USING ERRCODE = 'undefined_function';
  END IF;
  v_fn := format('%I.%I', v_schema, '{fn_trigger}');
  EXECUTE format($f$CREATE OR REPLACE FUNCTION %s() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_hash text;
BEGIN
  v_hash := %s(OLD.user_key);
  PERFORM pg_notify(CASE WHEN octet_length(TG_ARGV[0]) <= 60 THEN TG_ARGV[0] || '.' || substr(v_hash, 7, 2) ELSE TG_ARGV[0] END, v_hash);
  RETURN NULL;
END
$fn$$f$, v_fn, v_hash);
  v_fnoid := to_regprocedure(v_fn || '()');
  -- tgtype 9 = ROW | DELETE (AFTER); tgargs = the channel, NUL-terminated.
  IF NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = v_rel AND t.tgname = '{trigger}'
      AND t.tgfoid = v_fnoid AND t.tgtype = 9 AND t.tgenabled = 'O'
      AND t.tgargs = convert_to('{channel}', 'UTF8') || '\x00'::bytea) THEN
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', '{trigger}', v_rel);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L)', '{trigger}', v_rel, v_fn, '{channel}');
  END IF;
END
$do$;
