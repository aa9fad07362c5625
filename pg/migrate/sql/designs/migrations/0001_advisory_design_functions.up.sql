-- pglease optional migration 1 (advisory_design_functions), up: see package github.com/pglease/pglease/pg/migrate.
-- The email-keyed cleanup lock design's functions, equal to pg/advisory's
-- SHA256Key and NamespacedKey: first 8 bytes of SHA-256, big-endian, as a
-- signed bigint.
CREATE OR REPLACE FUNCTION email_to_lock_id(p_email text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
  v text := lower(trim(p_email) COLLATE "C");
BEGIN
  IF v = '' THEN
    RAISE EXCEPTION 'email_to_lock_id: empty input' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN ('x' || encode(substring(sha256(convert_to(v, 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint;
END
$fn$;

CREATE OR REPLACE FUNCTION generate_lock_id(p_namespace text, p_key text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
  v text := lower(trim(p_key) COLLATE "C");
BEGIN
  IF p_namespace = '' OR strpos(p_namespace, ':') > 0 THEN
    RAISE EXCEPTION 'generate_lock_id: namespace must be non-empty and free of '':''' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF v = '' THEN
    RAISE EXCEPTION 'generate_lock_id: empty key' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN ('x' || encode(substring(sha256(convert_to(p_namespace || ':' || v, 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint;
END
$fn$;

-- Session-level: the lock stays until release_cleanup_lock or the end of
-- the session (a crashed caller's connection closing frees it).
CREATE OR REPLACE FUNCTION acquire_cleanup_lock(p_email text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_lock_id bigint := email_to_lock_id(p_email);
  v_acquired boolean := pg_try_advisory_lock(v_lock_id);
BEGIN
  IF v_acquired THEN
    RAISE NOTICE 'Acquired cleanup lock for email hash: %', v_lock_id;
  ELSE
    RAISE NOTICE 'Failed to acquire cleanup lock (already held): %', v_lock_id;
  END IF;
  RETURN v_acquired;
END
$fn$;

CREATE OR REPLACE FUNCTION release_cleanup_lock(p_email text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_lock_id bigint := email_to_lock_id(p_email);
  v_released boolean := pg_advisory_unlock(v_lock_id);
BEGIN
  IF v_released THEN
    RAISE NOTICE 'Released cleanup lock for email hash: %', v_lock_id;
  ELSE
    RAISE WARNING 'Failed to release cleanup lock (not held by this session): %', v_lock_id;
  END IF;
  RETURN v_released;
END
$fn$;
