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
-- pglease migration 2 (pglease_functions), up: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
CREATE TABLE IF NOT EXISTS "syncguard_locks_holders" (
  key TEXT PRIMARY KEY,
  lock_id TEXT NOT NULL,
  holder TEXT NOT NULL
);
-- Superseded by the functions below: v0's (SetupSchema before schema versions).
DROP FUNCTION IF EXISTS "pglease_acquire_b0b8b6694e"(text[], text[], text[], text[], bigint[]);
DROP FUNCTION IF EXISTS "pglease_release_b0b8b6694e"(text[], text);
DROP FUNCTION IF EXISTS "pglease_extend_b0b8b6694e"(text[], bigint[]);

-- SyncGuard's hashKey (3 x uint32 polynomial over UTF-16 code units) of an
-- NFC string; needs a UTF8 database. Used for release notifications.
CREATE OR REPLACE FUNCTION "pglease_hashkey_v1"(p text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
  h1 bigint := 0; h2 bigint := 0; h3 bigint := 0;
  ch text; c bigint; u bigint; units bigint[];
BEGIN
  FOREACH ch IN ARRAY string_to_array(p, NULL) LOOP
    c := ascii(ch);
    IF c > 65535 THEN
      units := ARRAY[55296 + ((c - 65536) >> 10), 56320 + ((c - 65536) & 1023)];
    ELSE
      units := ARRAY[c];
    END IF;
    FOREACH u IN ARRAY units LOOP
      h1 := (31 * h1 + u) % 4294967296;
      h2 := (127 * h2 + 3 * u) % 4294967296;
      h3 := (2047 * h3 + 7 * u) % 4294967296;
    END LOOP;
  END LOOP;
  RETURN lpad(to_hex(h1), 8, '0') || lpad(to_hex(h2), 8, '0') || lpad(to_hex(h3), 8, '0');
END
$fn$;

-- Acquire N keys in one statement. Keys are processed in (hashtext, key)
-- order, so concurrent batches never deadlock. Per key: SyncGuard's
-- advisory lock, the lock row FOR UPDATE, the server clock read after both
-- waits, takeover only when expires_at_ms + 1000 <= now, fence upsert
-- (refused at FENCE MAX: status 2, nothing changed), lock row upsert,
-- holder upsert (p_holder NULL: none). Status: 0 acquired, 1 locked,
-- 2 fence overflow.
CREATE OR REPLACE FUNCTION "pglease_acquire_95ff2f1cda"(p_keys text[], p_user_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_holder text)
RETURNS TABLE (o_idx integer, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_exp bigint;
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
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL;
    PERFORM pg_advisory_xact_lock(hashtext(r.k));
    v_exp := NULL;
    SELECT l.expires_at_ms INTO v_exp FROM "syncguard_locks" AS l WHERE l.key = r.k FOR UPDATE;
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF v_exp IS NOT NULL AND v_exp + 1000 > v_now THEN
      o_status := 1;
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
    -- Holder identity, tied to this grant's lockId: a row left behind
    -- (release keeps it: the next grant's upsert is then a cheap HOT
    -- update, measured in BenchmarkHolderCost) or when SyncGuard (which
    -- never writes here) takes the key over names another lockId and is
    -- not shown. One row per key, like the fence counters.
    IF p_holder IS NOT NULL THEN
      INSERT INTO "syncguard_locks_holders" AS h (key, lock_id, holder) VALUES (r.k, r.id, p_holder)
        ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, holder = EXCLUDED.holder;
    END IF;
    o_status := 0; o_fence := v_fence; o_acquired_ms := v_now; o_expires_ms := v_now + r.ttl;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Release N lockIds in one statement: lock their rows in (hashtext, key)
-- order, read the server clock, then delete each row still unexpired
-- (expires_at_ms > now: no release inside the tolerance window). With a
-- channel, each successful release also notifies hashKey(user_key).
-- A release commits without waiting for its WAL flush: if a crash loses it,
-- the lease simply runs to its expiry (safe), and any later acquire that saw
-- the release flushes it (WAL is sequential) before it is acknowledged.
CREATE OR REPLACE FUNCTION "pglease_release_95ff2f1cda"(p_lock_ids text[], p_channel text)
RETURNS TABLE (o_idx integer, o_ok boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_now bigint;
  v_uk text;
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  PERFORM 1 FROM "syncguard_locks" AS l WHERE l.lock_id = ANY (p_lock_ids) ORDER BY hashtext(l.key), l.key FOR UPDATE;
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  FOR r IN SELECT u.id, u.i::integer AS i FROM unnest(p_lock_ids) WITH ORDINALITY AS u(id, i) ORDER BY u.i LOOP
    o_idx := r.i;
    v_uk := NULL;
    DELETE FROM "syncguard_locks" AS l WHERE l.lock_id = r.id AND l.expires_at_ms > v_now RETURNING l.user_key INTO v_uk;
    o_ok := v_uk IS NOT NULL;
    IF o_ok AND p_channel IS NOT NULL THEN
      PERFORM pg_notify(p_channel, "pglease_hashkey_v1"(v_uk));
    END IF;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Extend N lockIds in one statement: same locking order as release; new
-- expiry = server now + ttl (replaces, does not add), only for rows with
-- expires_at_ms > now (no revival). Commits with synchronous_commit = on,
-- like acquire: the holder's trust window rests on the new expiry, and an
-- extend acknowledged but lost in a crash would move the server's expiry
-- back behind it (another holder could be granted while this one trusts).
CREATE OR REPLACE FUNCTION "pglease_extend_95ff2f1cda"(p_lock_ids text[], p_ttls bigint[])
RETURNS TABLE (o_idx integer, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_now bigint;
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  PERFORM 1 FROM "syncguard_locks" AS l WHERE l.lock_id = ANY (p_lock_ids) ORDER BY hashtext(l.key), l.key FOR UPDATE;
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  FOR r IN SELECT u.id, u.ttl, u.i::integer AS i FROM unnest(p_lock_ids, p_ttls) WITH ORDINALITY AS u(id, ttl, i) ORDER BY u.i LOOP
    o_idx := r.i;
    o_expires_ms := NULL;
    UPDATE "syncguard_locks" AS l SET expires_at_ms = v_now + r.ttl WHERE l.lock_id = r.id AND l.expires_at_ms > v_now
      RETURNING l.expires_at_ms INTO o_expires_ms;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Hand N keys over in one statement: for each item, release the lockId
-- p_old_ids[i] (the caller's lock on p_keys[i]) and acquire p_keys[i] for
-- p_lock_ids[i], in one transaction. Same locking order, clock read and
-- fence upsert as the acquire function; the old row is taken over in place
-- when it is still live and holds the old lockId (o_released), or under the
-- acquire rule otherwise (free, or expired past the tolerance). The grant
-- commits durably, like an acquire; the holder row is written as by the
-- acquire function. No notification: the key is taken
-- again at once (a released key that could not be granted, status 2, is
-- notified on p_channel when it is not NULL).
CREATE OR REPLACE FUNCTION "pglease_handoff_95ff2f1cda"(p_old_ids text[], p_keys text[], p_user_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_holder text, p_channel text)
RETURNS TABLE (o_idx integer, o_released boolean, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_exp bigint;
  v_id text;
  v_now bigint;
  v_fence bigint;
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  FOR r IN
    SELECT u.old, u.k, u.uk, u.fk, u.id, u.ttl, u.i::integer AS i
    FROM unnest(p_old_ids, p_keys, p_user_keys, p_fence_keys, p_lock_ids, p_ttls) WITH ORDINALITY AS u(old, k, uk, fk, id, ttl, i)
    ORDER BY hashtext(u.k), u.k, u.i
  LOOP
    o_idx := r.i;
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL;
    PERFORM pg_advisory_xact_lock(hashtext(r.k));
    v_exp := NULL; v_id := NULL;
    SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM "syncguard_locks" AS l WHERE l.key = r.k FOR UPDATE;
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    o_released := v_id IS NOT NULL AND v_id = r.old AND v_exp > v_now;
    IF NOT o_released AND v_exp IS NOT NULL AND v_exp + 1000 > v_now THEN
      o_status := 1;
      RETURN NEXT;
      CONTINUE;
    END IF;
    v_fence := NULL;
    INSERT INTO "syncguard_fence_counters" AS c (fence_key, fence, key_debug) VALUES (r.fk, 1, r.uk)
      ON CONFLICT (fence_key) DO UPDATE SET fence = c.fence + 1 WHERE c.fence < 900000000000000
      RETURNING c.fence INTO v_fence;
    IF v_fence IS NULL THEN
      IF o_released THEN
        DELETE FROM "syncguard_locks" AS l WHERE l.key = r.k;
        IF p_channel IS NOT NULL THEN
          PERFORM pg_notify(p_channel, "pglease_hashkey_v1"(r.uk));
        END IF;
      END IF;
      o_status := 2;
      RETURN NEXT;
      CONTINUE;
    END IF;
    INSERT INTO "syncguard_locks" AS l (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
      VALUES (r.k, r.id, v_now + r.ttl, v_now, lpad(v_fence::text, 15, '0'), r.uk)
      ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
        acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key;
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
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 2, 2 $fn$;
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
