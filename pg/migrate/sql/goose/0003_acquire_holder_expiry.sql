-- +goose Up
-- +goose StatementBegin
-- pglease migration 3 (acquire_holder_expiry), up: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
-- The acquire function of schema version 3. As version 2's, plus: every row
-- has the server clock the key was checked at (o_now_ms); a "locked" row
-- (status 1) has the holder's expires_at_ms (o_expires_ms: the key can be
-- taken from o_expires_ms + 1000 unless the holder extends it) and the
-- holder identity recorded for the holder's lockId (o_holder; NULL when
-- none was, e.g. a SyncGuard holder). Status: 0 acquired, 1 locked,
-- 2 fence overflow.
CREATE OR REPLACE FUNCTION "pglease_acquire_8eefe2f09a"(p_keys text[], p_user_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_holder text)
RETURNS TABLE (o_idx integer, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint, o_now_ms bigint, o_holder text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_exp bigint;
  v_id text;
  v_now bigint;
  v_fence bigint;
BEGIN
  -- A fence handed out and lost in a crash would be handed out again.
  PERFORM set_config('synchronous_commit', 'on', true);
  FOR r IN
    SELECT u.k, u.uk, u.fk, u.id, u.ttl, u.i::integer AS i
    FROM unnest(p_keys, p_user_keys, p_fence_keys, p_lock_ids, p_ttls) WITH ORDINALITY AS u(k, uk, fk, id, ttl, i)
    ORDER BY hashtext(u.k), u.k, u.i
  LOOP
    o_idx := r.i;
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL; o_holder := NULL;
    PERFORM pg_advisory_xact_lock(hashtext(r.k));
    v_exp := NULL; v_id := NULL;
    SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM "syncguard_locks" AS l WHERE l.key = r.k FOR UPDATE;
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    o_now_ms := v_now;
    IF v_exp IS NOT NULL AND v_exp + 1000 > v_now THEN
      o_status := 1;
      o_expires_ms := v_exp;
      SELECT h.holder INTO o_holder FROM "syncguard_locks_holders" AS h WHERE h.key = r.k AND h.lock_id = v_id;
      RETURN NEXT;
      CONTINUE;
    END IF;
    v_fence := NULL;
    INSERT INTO "syncguard_fence_counters" AS c (fence_key, fence, key_debug) VALUES (r.fk, 1, r.uk)
      ON CONFLICT (fence_key) DO UPDATE SET fence = c.fence + 1 WHERE c.fence < 900000000000000
      RETURNING c.fence INTO v_fence;
    IF v_fence IS NULL THEN
      o_status := 2;
      RETURN NEXT;
      CONTINUE;
    END IF;
    INSERT INTO "syncguard_locks" AS l (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
      VALUES (r.k, r.id, v_now + r.ttl, v_now, lpad(v_fence::text, 15, '0'), r.uk)
      ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
        acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key;
    -- Holder identity, tied to this grant's lockId (see version 2's).
    IF p_holder IS NOT NULL THEN
      INSERT INTO "syncguard_locks_holders" AS h (key, lock_id, holder) VALUES (r.k, r.id, p_holder)
        ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, holder = EXCLUDED.holder;
    END IF;
    o_status := 0; o_fence := v_fence; o_acquired_ms := v_now; o_expires_ms := v_now + r.ttl;
    RETURN NEXT;
  END LOOP;
END
$fn$;
-- The schema version record: SELECT * FROM "pglease_schema_858d8d6934"();
CREATE OR REPLACE FUNCTION "pglease_schema_858d8d6934"(OUT version integer, OUT compatible_from integer)
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 3, 2 $fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
-- pglease migration 3 (acquire_holder_expiry), down: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
DROP FUNCTION IF EXISTS "pglease_acquire_8eefe2f09a"(text[], text[], text[], text[], bigint[], text);
-- The schema version record: SELECT * FROM "pglease_schema_858d8d6934"();
CREATE OR REPLACE FUNCTION "pglease_schema_858d8d6934"(OUT version integer, OUT compatible_from integer)
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 2, 2 $fn$;
-- +goose StatementEnd
