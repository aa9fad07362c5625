-- Schema version 4: shared holds (readers of a reader-writer lease, permits
-- of a counting semaphore) next to the exclusive rows; all-or-nothing sets;
-- lock delays and revocation; watch notifications; the database guard; and
-- the SQL API (functions and views with stable names derived from the lock
-- table's). SyncGuard's tables are not touched. The functions of versions 2
-- and 3 stay, for their code during a rolling upgrade (that code knows
-- nothing of shared holds, lock delays or the guard, like SyncGuard).

-- Shared holds: one row per hold. lim is 0 for a reader (any number, never
-- with an exclusive holder) and n > 0 for a permit of a semaphore of n.
-- fence is the key's fence counter at the grant for a reader (not
-- incremented: the state it reads under) and a fresh increment for a permit.
-- Live, as an exclusive row, while expires_at_ms + 1000 > server now.
CREATE TABLE IF NOT EXISTS {s} (
  lock_id TEXT PRIMARY KEY,
  key TEXT NOT NULL,
  lim INTEGER NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  acquired_at_ms BIGINT NOT NULL,
  fence BIGINT NOT NULL,
  holder TEXT
);
CREATE INDEX IF NOT EXISTS {idx_shared_key} ON {s} (key);
-- The fair queue (docs/fairness.md): one ticket per waiting caller, in
-- arrival order (seq, assigned under the key's advisory lock). A ticket
-- carries what its grant needs: the pre-generated lockId (the ticket's
-- identity: every attempt of one wait uses it, so retries keep their
-- place), fence key, TTL, lock delay, kind (lim NULL exclusive, 0 reader,
-- n permit), set_no (the tickets of one all-or-nothing set share it: the
-- seq of its first ticket), holder identity, and the waiting process's own
-- notify channel. Live while expires_at_ms > server now; the waiting
-- process refreshes it ({fn_qrefresh}), so a dead waiter's ticket blocks
-- its key at most its life (the enqueue's p_life) after its last refresh.
-- pglease's own table: SyncGuard does not queue (it polls).
CREATE TABLE IF NOT EXISTS {q} (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  key TEXT NOT NULL,
  lock_id TEXT NOT NULL UNIQUE,
  fence_key TEXT NOT NULL,
  lim INTEGER,
  set_no BIGINT,
  ttl_ms BIGINT NOT NULL,
  delay_ms BIGINT NOT NULL,
  holder TEXT,
  channel TEXT NOT NULL,
  enqueued_at_ms BIGINT NOT NULL,
  expires_at_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS {idx_queue_key} ON {q} (key, seq);
-- Per key, next to the holder identity: excl_wait_until_ms, set by an
-- exclusive acquire refused for any reason (live shared holds; an
-- exclusive holder or a delay, on a key readers or permits use: now +
-- 2 s, refreshed by the refused attempts; a waiting writer tries again
-- within 1 s to keep it), makes shared acquires wait (writer preference;
-- a writer that went away holds readers off for at most 2 s after its
-- last attempt; an exclusive grant lifts it, to 0, a local handoff and a
-- takeover of an expired lease keep it: it is another writer's, which
-- no release woke to mark the key again). NULL: no reader or permit has been
-- refused on the key, nor a writer because of them (a refused writer
-- then writes nothing); 0: a lapsed mark; lock_delay_ms is the grant's lock delay (valid while the
-- row's lock_id is the grant's); delay_until_ms, set by a revoke, keeps
-- the key from every acquire until then.
ALTER TABLE {h} ADD COLUMN IF NOT EXISTS excl_wait_until_ms BIGINT,
  ADD COLUMN IF NOT EXISTS lock_delay_ms BIGINT,
  ADD COLUMN IF NOT EXISTS delay_until_ms BIGINT;
-- revoked_lock_hash: hashKey of the lockId the key's last revoke deleted
-- (a hash: the lockId is its holder's secret), kept when the key is
-- granted again, so that the revoked holder's next extend, which finds
-- nothing, can tell a revoke from an expiry (the extend function's
-- o_revoked) though it missed the revoke's notification. Indexed (only
-- its non-NULL values) for that lookup by lockId.
ALTER TABLE {h} ADD COLUMN IF NOT EXISTS revoked_lock_hash TEXT;
DO $pglease$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_index AS i JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
      WHERE i.indrelid = '{h}'::regclass AND a.attname = 'revoked_lock_hash') THEN
    CREATE INDEX ON {h} (revoked_lock_hash) WHERE revoked_lock_hash IS NOT NULL;
  END IF;
END
$pglease$;

-- Notifies about key p_key: hashKey(p_key) when p_wake is 2, or 1 and a
-- session waits for the key (holds its waiter lock: the exclusive try
-- fails), on the key's wake channel, p_channel || '.' || hex digits 7 and
-- 8 of hashKey(p_key), the low byte of its first word (one of 256: a
-- waiting process LISTENs only to the wake channels of the keys it waits
-- for, so a release wakes the processes that wait for its key, not every
-- listener; the first word's low byte spreads sequential keys over the
-- 256, the last word's over a few dozen; p_channel itself
-- when it is longer than 60 bytes, which only a SQL caller's
-- pglease.notify_channel can be, as a wake channel would not fit
-- PostgreSQL's 63 bytes; a Manager takes wake-ups from either); 'w:' ||
-- hashKey(p_key) || ':' || p_event when p_event is not NULL and a session
-- watches the key (holds its watch lock), on p_channel itself. A try that
-- succeeds drops the lock at once. It runs on every grant and release:
-- the tries are plain expressions (no query each, as a PERFORM would be).
-- A caller without a channel (NULL: a Go Store with no NotifyChannel,
-- such as one on a caller's transaction) wakes nobody, but a watched
-- key's change is still told to its watchers, on the default channel
-- 'pglease_release' (the SQL API's and the Manager's default; a Manager
-- with another channel listens to this one for watch events too): every
-- change of a watched key reaches its watchers, whatever made it.
CREATE OR REPLACE FUNCTION {fn_notify}(p_channel text, p_key text, p_wake integer, p_event text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_h integer;
  v_ok boolean;
  v_hash text;
BEGIN
  v_h := hashtext(p_key);
  IF p_channel IS NULL THEN
    IF p_event IS NOT NULL THEN
      IF pg_try_advisory_lock({watch_class}, v_h) THEN
        v_ok := pg_advisory_unlock({watch_class}, v_h);
      ELSE
        PERFORM pg_notify('pglease_release', 'w:' || {fn_hash}(p_key) || ':' || p_event);
      END IF;
    END IF;
    RETURN;
  END IF;
  IF p_wake = 2 THEN
    v_hash := {fn_hash}(p_key);
    PERFORM pg_notify(CASE WHEN octet_length(p_channel) <= 60 THEN p_channel || '.' || substr(v_hash, 7, 2) ELSE p_channel END, v_hash);
  ELSIF p_wake = 1 THEN
    IF pg_try_advisory_lock({waiter_class}, v_h) THEN
      v_ok := pg_advisory_unlock({waiter_class}, v_h);
    ELSE
      v_hash := {fn_hash}(p_key);
      PERFORM pg_notify(CASE WHEN octet_length(p_channel) <= 60 THEN p_channel || '.' || substr(v_hash, 7, 2) ELSE p_channel END, v_hash);
    END IF;
  END IF;
  IF p_event IS NOT NULL THEN
    IF pg_try_advisory_lock({watch_class}, v_h) THEN
      v_ok := pg_advisory_unlock({watch_class}, v_h);
    ELSE
      PERFORM pg_notify(p_channel, 'w:' || {fn_hash}(p_key) || ':' || p_event);
    END IF;
  END IF;
END
$fn$;

-- Waits for a lock another transaction holds on key p_key, at most until
-- server clock time p_until (ms): p_what 0 is the key's transaction
-- advisory lock (SyncGuard's), 1 its lock row FOR NO KEY UPDATE, 2 FOR
-- UPDATE. false when the lock is still held then (lock_timeout, restored
-- after). The caller tried without waiting first, so this subtransaction
-- (the EXCEPTION block) runs only when another transaction holds the
-- lock: an acquire in flight for a moment, or a transaction left open
-- that holds the key, which must not make a batch wait on it.
CREATE OR REPLACE FUNCTION {fn_lockwait}(p_key text, p_what integer, p_until bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_left bigint := p_until - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  v_saved text := current_setting('lock_timeout');
  v_got boolean := false;
  v_void text;
BEGIN
  IF v_left <= 0 THEN
    RETURN false;
  END IF;
  v_void := set_config('lock_timeout', v_left::text || 'ms', true);
  BEGIN
    IF p_what = 0 THEN
      PERFORM pg_advisory_xact_lock(hashtext(p_key));
    ELSIF p_what = 1 THEN
      PERFORM 1 FROM {t} AS l WHERE l.key = p_key FOR NO KEY UPDATE;
    ELSE
      PERFORM 1 FROM {t} AS l WHERE l.key = p_key FOR UPDATE;
    END IF;
    v_got := true;
  EXCEPTION WHEN lock_not_available THEN
    v_got := false;
  END;
  v_void := set_config('lock_timeout', v_saved, true);
  RETURN v_got;
END
$fn$;

-- Whether key p_key can be granted now, under the caller's transaction
-- advisory lock of the key: p_limit NULL for an exclusive grant, 0 for a
-- reader, n > 0 for a permit of n. Reads the lock row without locking it
-- when no transaction has touched its version (xmax 0: no release, extend
-- or guard in flight), so an attempt refused by a live lease writes
-- nothing (a row lock gives the transaction an id, a WAL record and a
-- durable commit to wait for). Otherwise it locks the row FOR NO KEY
-- UPDATE, which waits for releases and extends in flight (not for
-- transactions that guard the lease: FOR KEY SHARE) and reads the row
-- they leave: a waiter whose attempt comes after a release looked for its
-- waiter lock waits for that release and finds the key free (no lost
-- wake-up). An expired row, about to be taken over, is locked FOR UPDATE:
-- that waits for the transactions that guard it, so their writes come
-- before the next grant's; the row is read again after, with the clock.
-- The key's shared rows are locked FOR SHARE in lock_id order (the order
-- of every statement that locks shared rows: releases and extends of
-- several holds lock them so too, and two orders could deadlock).
-- Status: 0 grantable, 1 held (c_retry: the server time from which to try
-- again; c_exp: the exclusive holder's expiry, or the latest shared one;
-- c_holder its identity; c_shared the live shared holds; c_limit, for a
-- shared attempt refused by shared holds, their smallest limit). c_row:
-- the key has a lock row (the caller holds its lock; a grant updates it
-- in place, else inserts one). An exclusive attempt refused for any
-- reason marks the key (excl_wait_until_ms = now + 2 s, written when the
-- mark has less than 1.8 s left), refused by an exclusive holder or a
-- delay only a key readers or permits use (its mark not NULL: a shared
-- attempt refused so sets a lapsed mark, 0, and c_limit -1, for the
-- caller to wake the key's waiters); refused because of shared holds it
-- is told to try again within 1 s, to keep its mark while it waits: the
-- mark of a writer that gave up or died lapses within 2 s of its last
-- attempt. Expired shared rows of the key are deleted.
-- With p_until (a server clock time, ms), {fn_check} takes the key's
-- advisory lock itself, and waits for another transaction's lock on the
-- key (advisory or row) only until then ({fn_lockwait}): a key still
-- locked is answered held (status 1, c_retry 1 s on, c_exp, c_holder and
-- c_shared as a snapshot shows them).
-- Its holder is busy with the key now (an acquire, release or extend in
-- flight, a guarded write of its lease not yet committed), or is a
-- transaction left open that holds it, which may last any time.
DROP FUNCTION IF EXISTS {fn_check}(text, integer);
CREATE OR REPLACE FUNCTION {fn_check}(p_key text, p_limit integer, p_until bigint,
  OUT c_status integer, OUT c_now bigint, OUT c_retry bigint, OUT c_exp bigint, OUT c_holder text, OUT c_shared integer, OUT c_limit integer,
  OUT c_row boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_exp bigint;
  v_id text;
  v_busy boolean;
  v_hid text;
  v_holder text;
  v_delay bigint;
  v_until bigint;
  v_wait bigint;
  v_probe boolean;
  v_all integer;
  v_n integer;
  v_min bigint;
  v_max bigint;
  v_lmin integer;
  v_lmax integer;
  v_sholder text;
BEGIN
  c_status := 0;
  <<checked>>
  BEGIN
  IF p_until IS NOT NULL AND NOT pg_try_advisory_xact_lock(hashtext(p_key)) AND NOT {fn_lockwait}(p_key, 0, p_until) THEN
    EXIT checked;
  END IF;
  -- One query for the lock row, the holder row and whether the key has
  -- shared rows. Its snapshot is taken under the caller's advisory lock,
  -- which every writer of holder rows and inserter of lock and shared rows
  -- holds, so none of them changes meanwhile; releases and extends may
  -- (a version they touch has its xmax set: then the row is locked and
  -- read again). A shared row a release is deleting is still seen, so the
  -- locking read below waits for that release (no lost wake-up).
  SELECT l.expires_at_ms, l.lock_id, l.xmax::text <> '0', h.lock_id, h.holder, h.lock_delay_ms, h.delay_until_ms, h.excl_wait_until_ms,
      EXISTS (SELECT 1 FROM {s} AS s WHERE s.key = p_key)
    INTO v_exp, v_id, v_busy, v_hid, v_holder, v_delay, v_until, v_wait, v_probe
    FROM (SELECT 1) AS x
    LEFT JOIN {t} AS l ON l.key = p_key
    LEFT JOIN {h} AS h ON h.key = p_key;
  -- Re-reads below see the same lockId or no row (grants, the only
  -- writers of lock_id, hold the advisory lock).
  IF v_busy THEN
    v_exp := NULL; v_id := NULL;
    IF p_until IS NULL THEN
      SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = p_key FOR NO KEY UPDATE;
    ELSE
      SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = p_key FOR NO KEY UPDATE SKIP LOCKED;
      IF NOT FOUND AND EXISTS (SELECT 1 FROM {t} AS l WHERE l.key = p_key) THEN
        IF NOT {fn_lockwait}(p_key, 1, p_until) THEN
          EXIT checked;
        END IF;
        SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = p_key;
      END IF;
    END IF;
  END IF;
  IF v_hid IS DISTINCT FROM v_id THEN
    v_holder := NULL;
    v_delay := NULL;
  END IF;
  c_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  IF v_exp IS NOT NULL AND v_exp + greatest(1000, coalesce(v_delay, 0)) <= c_now THEN
    -- Expired: lock it and read it again (an extend in flight may have
    -- made it live).
    v_exp := NULL; v_id := NULL;
    IF p_until IS NULL THEN
      SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = p_key FOR UPDATE;
    ELSE
      SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = p_key FOR UPDATE SKIP LOCKED;
      IF NOT FOUND AND EXISTS (SELECT 1 FROM {t} AS l WHERE l.key = p_key) THEN
        IF NOT {fn_lockwait}(p_key, 2, p_until) THEN
          EXIT checked;
        END IF;
        SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = p_key;
      END IF;
    END IF;
    c_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  END IF;
  c_row := v_id IS NOT NULL;
  IF v_exp IS NOT NULL AND v_exp + greatest(1000, coalesce(v_delay, 0)) > c_now THEN
    c_status := 1; c_exp := v_exp; c_holder := v_holder; c_retry := v_exp + greatest(1000, coalesce(v_delay, 0));
  ELSIF v_until > c_now THEN
    c_status := 1; c_retry := v_until;
  END IF;
  IF c_status = 1 THEN
    IF p_limit IS NULL AND v_wait < c_now + 1800 THEN
      -- A writer refused by an exclusive holder or a delay marks a key
      -- that readers or permits use (a mark, lapsed or not, is there:
      -- see below) too (writer preference), refreshing a mark with less
      -- than 1.8 s left. A key they never used keeps no mark, and a
      -- refused attempt of it writes nothing.
      INSERT INTO {h} AS h (key, lock_id, holder, excl_wait_until_ms) VALUES (p_key, '', '', c_now + 2000)
        ON CONFLICT (key) DO UPDATE SET excl_wait_until_ms = EXCLUDED.excl_wait_until_ms;
    ELSIF p_limit IS NOT NULL AND v_wait IS NULL THEN
      -- The first shared attempt of the key refused by a writer or a
      -- delay: a lapsed mark (0) tells writers the key is used by
      -- readers or permits, and c_limit -1 asks the caller to wake the
      -- key's waiters, so that a writer already waiting marks it.
      INSERT INTO {h} AS h (key, lock_id, holder, excl_wait_until_ms) VALUES (p_key, '', '', 0)
        ON CONFLICT (key) DO UPDATE SET excl_wait_until_ms = 0;
      c_limit := -1;
    END IF;
    RETURN;
  END IF;
  IF p_limit IS NOT NULL AND v_wait > c_now THEN
    c_status := 1; c_retry := v_wait;
    RETURN;
  END IF;
  -- Most keys have no shared row.
  IF NOT v_probe THEN
    RETURN;
  END IF;
  SELECT count(*), count(*) FILTER (WHERE x.e + 1000 > c_now),
      min(x.e) FILTER (WHERE x.e + 1000 > c_now), max(x.e) FILTER (WHERE x.e + 1000 > c_now),
      min(x.lim) FILTER (WHERE x.e + 1000 > c_now), max(x.lim) FILTER (WHERE x.e + 1000 > c_now),
      (array_agg(x.holder ORDER BY x.e DESC) FILTER (WHERE x.e + 1000 > c_now))[1]
    INTO v_all, v_n, v_min, v_max, v_lmin, v_lmax, v_sholder
    FROM (SELECT s.expires_at_ms AS e, s.lim, s.holder FROM {s} AS s WHERE s.key = p_key ORDER BY s.lock_id FOR SHARE) AS x;
  IF v_all > v_n THEN
    DELETE FROM {s} AS s WHERE s.key = p_key AND s.expires_at_ms + 1000 <= c_now;
  END IF;
  IF v_n = 0 THEN
    RETURN;
  END IF;
  c_shared := v_n;
  IF p_limit IS NULL THEN
    c_status := 1; c_exp := v_max; c_holder := v_sholder; c_retry := least(v_max + 1000, c_now + 1000);
    IF v_wait IS NULL OR v_wait < c_now + 1800 THEN
      INSERT INTO {h} AS h (key, lock_id, holder, excl_wait_until_ms) VALUES (p_key, '', '', c_now + 2000)
        ON CONFLICT (key) DO UPDATE SET excl_wait_until_ms = EXCLUDED.excl_wait_until_ms;
    END IF;
    RETURN;
  END IF;
  -- Readers and permits never hold a key together: a reader waits for
  -- the permits to go, a permit for the readers. A permit is granted
  -- while the live permits are fewer than the smallest limit among them
  -- and the caller's (a limit changed in a live fleet: a raise applies
  -- once the holders with the old limit are gone, a lowering as soon as
  -- the permits are fewer than it; never more permits than the smallest
  -- live limit). c_limit: that smallest live limit (0: readers).
  IF p_limit = 0 AND v_lmax > 0 THEN
    c_status := 1; c_exp := v_max; c_holder := v_sholder; c_retry := v_max + 1000; c_limit := v_lmin;
  ELSIF p_limit > 0 AND v_n >= least(p_limit, v_lmin) THEN
    c_status := 1; c_exp := v_min; c_holder := v_sholder; c_retry := v_min + 1000; c_limit := v_lmin;
    IF v_lmin = 0 THEN
      c_exp := v_max; c_retry := v_max + 1000;
    END IF;
  END IF;
  RETURN;
  END checked;
  -- Locked by another transaction past p_until: held, to try again within
  -- a second; what a snapshot shows (a live exclusive lease, live shared
  -- holds) is told as for any held key.
  c_status := 1; c_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint; c_retry := c_now + 1000;
  SELECT CASE WHEN l.expires_at_ms + 1000 > c_now THEN l.expires_at_ms END,
      CASE WHEN l.expires_at_ms + 1000 > c_now AND h.lock_id = l.lock_id THEN h.holder END,
      (SELECT nullif(count(*), 0)::integer FROM {s} AS s WHERE s.key = p_key AND s.expires_at_ms + 1000 > c_now)
    INTO c_exp, c_holder, c_shared
    FROM (SELECT 1) AS x
    LEFT JOIN {t} AS l ON l.key = p_key
    LEFT JOIN {h} AS h ON h.key = p_key;
END
$fn$;

-- Grants key p_key exclusively to p_lock_id at server time p_now (the
-- caller checked it with {fn_check}, and holds the lock row's lock when
-- p_row, the key having one): fence counter incremented (NULL, nothing
-- written, at FENCE MAX), lock row updated in place (p_row) or inserted,
-- holder row (identity and lock delay tied to the grant's lockId,
-- exclusive-waiting mark lapsed, except by a takeover of an expired
-- lease (p_row): writers that waited with the grantee, woken by no
-- release, keep theirs until their next attempt; written when there is
-- a holder or a delay, else only the mark lapsed), and a watch notification ('g:' fence). Plain updates, not
-- upserts: an upsert that finds its row locks it first (one more WAL
-- record) and runs a speculative insertion's checks. Lock and shared
-- rows appear only under the key's advisory lock, which the caller
-- holds, so an insert cannot meet a row.
CREATE OR REPLACE FUNCTION {fn_grant}(p_key text, p_fence_key text, p_lock_id text, p_ttl bigint, p_delay bigint, p_holder text, p_channel text, p_now bigint, p_row boolean)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_fence bigint;
BEGIN
  UPDATE {f} AS c SET fence = c.fence + 1 WHERE c.fence_key = p_fence_key AND c.fence < 900000000000000
    RETURNING c.fence INTO v_fence;
  IF v_fence IS NULL THEN
    -- The key's first grant, or its counter at FENCE MAX.
    INSERT INTO {f} AS c (fence_key, fence, key_debug) VALUES (p_fence_key, 1, p_key)
      ON CONFLICT (fence_key) DO UPDATE SET fence = c.fence + 1 WHERE c.fence < 900000000000000
      RETURNING c.fence INTO v_fence;
    IF v_fence IS NULL THEN
      RETURN NULL;
    END IF;
  END IF;
  IF p_row THEN
    UPDATE {t} AS l SET lock_id = p_lock_id, expires_at_ms = p_now + p_ttl, acquired_at_ms = p_now,
      fence = lpad(v_fence::text, 15, '0'), user_key = p_key
      WHERE l.key = p_key;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'pglease: the lock row went away under its row lock' USING ERRCODE = 'internal_error';
    END IF;
  ELSE
    INSERT INTO {t} (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
      VALUES (p_key, p_lock_id, p_now + p_ttl, p_now, lpad(v_fence::text, 15, '0'), p_key);
  END IF;
  IF p_holder IS NOT NULL OR p_delay > 0 THEN
    UPDATE {h} AS h SET lock_id = p_lock_id, holder = coalesce(p_holder, ''), lock_delay_ms = nullif(p_delay, 0),
        excl_wait_until_ms = CASE WHEN h.excl_wait_until_ms > 0 AND NOT p_row THEN 0 ELSE h.excl_wait_until_ms END
      WHERE h.key = p_key;
    IF NOT FOUND THEN
      INSERT INTO {h} (key, lock_id, holder, lock_delay_ms) VALUES (p_key, p_lock_id, coalesce(p_holder, ''), nullif(p_delay, 0));
    END IF;
  ELSIF NOT p_row THEN
    UPDATE {h} AS h SET excl_wait_until_ms = 0 WHERE h.key = p_key AND h.excl_wait_until_ms > 0;
  END IF;
  PERFORM {fn_notify}(p_channel, p_key, 0, 'g:' || lpad(v_fence::text, 15, '0'));
  RETURN v_fence;
END
$fn$;

-- Acquire N keys exclusively in one statement, in (hashtext, key) order:
-- per key SyncGuard's advisory lock, {fn_check}, {fn_grant}. As version 3's,
-- plus: refused while live shared holds exist; a takeover after expiry
-- waits until expires_at + max(1 s, the grant's lock delay), and nothing is
-- granted before a revoke's delay_until; o_retry_ms is the server time from
-- which to try again; o_shared counts the live shared holds that refused
-- the key; watchers are notified. Status: 0 acquired, 1 locked, 2 fence
-- overflow. The statement waits for locks other transactions hold on its
-- keys 100 ms in all ({fn_check}'s p_until): a key still locked by
-- another transaction then is answered locked (o_retry_ms 1 s on), and
-- the other keys of the batch are answered as usual. p_yield (NULL: no
-- item): item i yields to its key's fair queue when p_yield[i] is true
-- (a try of a Manager with FairQueue, or {api_acquire}: callers that
-- never queue): a key free but with a live ticket of the queue table is
-- answered locked, with no expiry, holder or retry time (the queue's
-- waiters go first; the check is made under the key's advisory lock,
-- which every enqueue takes). Other callers (pg.Store, Managers without
-- the queue) pass NULL and never read the queue; SyncGuard's own SQL does
-- not call these functions.
DROP FUNCTION IF EXISTS {fn_acquire4}(text[], text[], text[], bigint[], bigint[], text, text);
CREATE OR REPLACE FUNCTION {fn_acquire4}(p_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_delays bigint[], p_holder text, p_channel text,
  p_yield boolean[] DEFAULT NULL)
RETURNS TABLE (o_idx integer, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint, o_now_ms bigint, o_retry_ms bigint, o_holder text, o_shared integer)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  c record;
  v_order integer[];
  v_i integer;
  v_k text;
  v_until bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 100;
BEGIN
  -- A fence handed out and lost in a crash would be handed out again.
  IF current_setting('synchronous_commit') <> 'on' THEN
    PERFORM set_config('synchronous_commit', 'on', true);
  END IF;
  -- The items' order; a single item needs no query (plain expressions
  -- below, array parameters are subscripted in constant time).
  IF cardinality(p_keys) = 1 THEN
    v_order := ARRAY[1];
  ELSE
    v_order := ARRAY(SELECT u.i::integer FROM unnest(p_keys) WITH ORDINALITY AS u(k, i) ORDER BY hashtext(u.k), u.k, u.i);
  END IF;
  FOREACH v_i IN ARRAY v_order LOOP
    o_idx := v_i; v_k := p_keys[v_i];
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL; o_retry_ms := NULL; o_holder := NULL; o_shared := NULL;
    -- SyncGuard's advisory lock, taken by {fn_check}.
    c := {fn_check}(v_k, NULL, v_until);
    o_now_ms := c.c_now;
    IF c.c_status <> 0 THEN
      o_status := c.c_status; o_expires_ms := c.c_exp; o_retry_ms := c.c_retry; o_holder := c.c_holder; o_shared := c.c_shared;
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF p_yield[v_i] THEN
      IF EXISTS (SELECT 1 FROM {q} AS q WHERE q.key = v_k AND q.expires_at_ms > c.c_now) THEN
        o_status := 1;
        RETURN NEXT;
        CONTINUE;
      END IF;
    END IF;
    o_fence := {fn_grant}(v_k, p_fence_keys[v_i], p_lock_ids[v_i], p_ttls[v_i], p_delays[v_i], p_holder, p_channel, c.c_now, c.c_row);
    IF o_fence IS NULL THEN
      o_status := 2;
    ELSE
      o_status := 0; o_acquired_ms := c.c_now; o_expires_ms := c.c_now + p_ttls[v_i];
    END IF;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Acquire N shared holds in one statement, in (hashtext, key) order: per
-- key the advisory lock, then {fn_check} with the item's limit (0: reader).
-- A reader's fence is the key's fence counter (0 when it was never
-- granted), not incremented; a permit's is a fresh increment. Refused while
-- a live exclusive row exists, while an exclusive acquire waits (the mark),
-- a reader while permits are held, a permit while readers are held or
-- when it would reach the smallest limit among the live permits and its
-- own (o_limit: that smallest live limit). Status: 0 acquired, 1 locked,
-- 2 fence overflow. p_yield: as {fn_acquire4}'s (a reader or permit that
-- yields is refused while any live ticket waits for its key).
DROP FUNCTION IF EXISTS {fn_acquire_shared}(text[], text[], text[], bigint[], integer[], text, text);
CREATE OR REPLACE FUNCTION {fn_acquire_shared}(p_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_limits integer[], p_holder text, p_channel text,
  p_yield boolean[] DEFAULT NULL)
RETURNS TABLE (o_idx integer, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint, o_now_ms bigint, o_retry_ms bigint, o_holder text, o_shared integer, o_limit integer)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  c record;
  v_fence bigint;
  v_until bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 100;
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  FOR r IN
    SELECT u.k, u.fk, u.id, u.ttl, u.lim, u.i::integer AS i
    FROM unnest(p_keys, p_fence_keys, p_lock_ids, p_ttls, p_limits) WITH ORDINALITY AS u(k, fk, id, ttl, lim, i)
    ORDER BY hashtext(u.k), u.k, u.i
  LOOP
    o_idx := r.i;
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL; o_retry_ms := NULL; o_holder := NULL; o_shared := NULL; o_limit := NULL;
    c := {fn_check}(r.k, r.lim, v_until); -- takes the advisory lock, as {fn_acquire4}
    o_now_ms := c.c_now;
    IF c.c_limit = -1 THEN
      PERFORM {fn_notify}(p_channel, r.k, 1, NULL);
      c.c_limit := NULL;
    END IF;
    IF c.c_status <> 0 THEN
      o_status := c.c_status; o_expires_ms := c.c_exp; o_retry_ms := c.c_retry; o_holder := c.c_holder; o_shared := c.c_shared; o_limit := c.c_limit;
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF p_yield[r.i] THEN
      IF EXISTS (SELECT 1 FROM {q} AS q WHERE q.key = r.k AND q.expires_at_ms > c.c_now) THEN
        o_status := 1;
        RETURN NEXT;
        CONTINUE;
      END IF;
    END IF;
    v_fence := NULL;
    IF r.lim = 0 THEN
      SELECT fc.fence INTO v_fence FROM {f} AS fc WHERE fc.fence_key = r.fk;
      v_fence := coalesce(v_fence, 0);
    ELSE
      INSERT INTO {f} AS fc (fence_key, fence, key_debug) VALUES (r.fk, 1, r.k)
        ON CONFLICT (fence_key) DO UPDATE SET fence = fc.fence + 1 WHERE fc.fence < 900000000000000
        RETURNING fc.fence INTO v_fence;
      IF v_fence IS NULL THEN
        o_status := 2;
        RETURN NEXT;
        CONTINUE;
      END IF;
    END IF;
    INSERT INTO {s} (lock_id, key, lim, expires_at_ms, acquired_at_ms, fence, holder)
      VALUES (r.id, r.k, r.lim, c.c_now + r.ttl, c.c_now, v_fence, p_holder);
    PERFORM {fn_notify}(p_channel, r.k, 0, 's:' || lpad(v_fence::text, 15, '0'));
    o_status := 0; o_fence := v_fence; o_acquired_ms := c.c_now; o_expires_ms := c.c_now + r.ttl;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Acquire sets of keys, each all or nothing, in one statement. p_sets[i]
-- is item i's set (1 …). Phase 1, over every item in (hashtext, key) order:
-- the advisory lock, {fn_check}, and the fence counter row locked and
-- checked. A key in more than one set goes to the first set only (later
-- ones: held). A set is granted only when all its items can be; phase 2,
-- in the same order, grants the granted sets' items. Status: 0 acquired,
-- 1 held, 2 fence overflow (nothing granted for its set), 4 free but its
-- set was not granted (another item was refused). p_yield: as
-- {fn_acquire4}'s (an item that yields is held while its key has a live
-- ticket, and its set is not granted).
DROP FUNCTION IF EXISTS {fn_acquire_sets}(integer[], text[], text[], text[], bigint[], bigint[], text, text);
CREATE OR REPLACE FUNCTION {fn_acquire_sets}(p_sets integer[], p_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_delays bigint[], p_holder text, p_channel text,
  p_yield boolean[] DEFAULT NULL)
RETURNS TABLE (o_idx integer, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint, o_now_ms bigint, o_retry_ms bigint, o_holder text, o_shared integer)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  c record;
  v_n integer := coalesce(array_length(p_keys, 1), 0);
  v_sets integer := coalesce((SELECT max(x) FROM unnest(p_sets) AS x), 0);
  v_ok boolean[];
  v_status integer[];
  v_now bigint[];
  v_retry bigint[];
  v_exp bigint[];
  v_holder text[];
  v_shared integer[];
  v_row boolean[];
  v_fence bigint;
  v_queued boolean;
  v_until bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 100;
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  v_ok := array_fill(true, ARRAY[v_sets]);
  v_row := array_fill(false, ARRAY[v_n]);
  v_status := array_fill(NULL::integer, ARRAY[v_n]);
  v_now := array_fill(NULL::bigint, ARRAY[v_n]);
  v_retry := v_now; v_exp := v_now;
  v_holder := array_fill(NULL::text, ARRAY[v_n]);
  v_shared := v_status;
  FOR r IN
    SELECT u.k, u.fk, u.i::integer AS i, u.st,
      row_number() OVER (PARTITION BY u.k ORDER BY u.st, u.i) AS nth
    FROM unnest(p_sets, p_keys, p_fence_keys) WITH ORDINALITY AS u(st, k, fk, i)
    ORDER BY hashtext(u.k), u.k, u.i
  LOOP
    c := {fn_check}(r.k, NULL, v_until); -- takes the advisory lock, as {fn_acquire4}
    v_now[r.i] := c.c_now;
    v_row[r.i] := c.c_row;
    v_queued := false;
    IF c.c_status = 0 AND r.nth = 1 AND p_yield[r.i] THEN
      v_queued := EXISTS (SELECT 1 FROM {q} AS q WHERE q.key = r.k AND q.expires_at_ms > c.c_now);
    END IF;
    IF c.c_status = 0 AND r.nth > 1 THEN
      v_status[r.i] := 1;
    ELSIF c.c_status = 0 AND v_queued THEN
      v_status[r.i] := 1;
    ELSIF c.c_status = 0 THEN
      v_fence := NULL;
      SELECT fc.fence INTO v_fence FROM {f} AS fc WHERE fc.fence_key = r.fk FOR UPDATE;
      v_status[r.i] := CASE WHEN v_fence >= 900000000000000 THEN 2 ELSE 0 END;
    ELSE
      v_status[r.i] := c.c_status; v_retry[r.i] := c.c_retry; v_exp[r.i] := c.c_exp; v_holder[r.i] := c.c_holder; v_shared[r.i] := c.c_shared;
    END IF;
    IF v_status[r.i] <> 0 THEN
      v_ok[r.st] := false;
    END IF;
  END LOOP;
  FOR r IN
    SELECT u.k, u.fk, u.id, u.ttl, u.d, u.i::integer AS i, u.st
    FROM unnest(p_sets, p_keys, p_fence_keys, p_lock_ids, p_ttls, p_delays) WITH ORDINALITY AS u(st, k, fk, id, ttl, d, i)
    ORDER BY hashtext(u.k), u.k, u.i
  LOOP
    o_idx := r.i; o_now_ms := v_now[r.i];
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL; o_retry_ms := NULL; o_holder := NULL; o_shared := NULL;
    IF NOT v_ok[r.st] THEN
      o_status := CASE WHEN v_status[r.i] = 0 THEN 4 ELSE v_status[r.i] END;
      o_retry_ms := v_retry[r.i]; o_expires_ms := v_exp[r.i]; o_holder := v_holder[r.i]; o_shared := v_shared[r.i];
      RETURN NEXT;
      CONTINUE;
    END IF;
    o_fence := {fn_grant}(r.k, r.fk, r.id, r.ttl, r.d, p_holder, p_channel, v_now[r.i], v_row[r.i]);
    IF o_fence IS NULL THEN
      -- Checked in phase 1 under the counter's row lock: cannot happen.
      RAISE EXCEPTION 'pglease: fence counter changed under its row lock' USING ERRCODE = 'internal_error';
    END IF;
    o_status := 0; o_acquired_ms := v_now[r.i]; o_expires_ms := v_now[r.i] + r.ttl;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Release N lockIds, exclusive or shared, in one statement: lock their
-- rows in (hashtext, key) order, the exclusive row before the shared ones of
-- a key (the acquire functions' order; shared ones by lock_id), read the
-- server clock, then delete each row still unexpired (expires_at_ms >
-- now). A single lockId's row is deleted without a lock taken first. Each release notifies
-- (p_wake, as {fn_notify}: 0 never, 1 when waited for, 2 always) and
-- watchers ('r:' fence for an exclusive row, 'u:' fence for a shared one).
-- p_async: commit without waiting for the WAL flush (a lost release runs
-- to its expiry, which is safe), unless the transaction has written
-- before (a caller's transaction, whose own writes must stay durable: the
-- caller passes false for its transactions when it knows them).
CREATE OR REPLACE FUNCTION {fn_release4}(p_lock_ids text[], p_channel text, p_wake integer, p_async boolean)
RETURNS TABLE (o_idx integer, o_ok boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_i integer;
  v_now bigint;
  v_k text;
  v_fence text;
  v_ev text;
  v_void text;
  v_exp bigint;
BEGIN
  IF p_async AND pg_current_xact_id_if_assigned() IS NULL THEN
    v_void := set_config('synchronous_commit', 'off', true);
  END IF;
  IF cardinality(p_lock_ids) = 1 THEN
    -- One row, exclusive or shared: no order to keep, and no lock taken
    -- before the delete (one WAL record less). The delete's WHERE is
    -- read again on the row's latest version after waiting for an extend
    -- or a grant in flight, reading the clock then; a row that expired
    -- while the delete waited for a transaction that left it unchanged
    -- (one guarding the lease) is deleted but not released (o_ok false,
    -- as when the clock is read after a row lock).
    o_idx := 1;
    v_k := NULL;
    DELETE FROM {t} AS l WHERE l.lock_id = p_lock_ids[1] AND l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
      RETURNING l.user_key, l.fence, l.expires_at_ms INTO v_k, v_fence, v_exp;
    v_ev := 'r:';
    IF v_k IS NULL THEN
      DELETE FROM {s} AS s WHERE s.lock_id = p_lock_ids[1] AND s.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
        RETURNING s.key, lpad(s.fence::text, 15, '0'), s.expires_at_ms INTO v_k, v_fence, v_exp;
      v_ev := 'u:';
    END IF;
    o_ok := v_k IS NOT NULL AND v_exp > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF v_k IS NOT NULL THEN
      PERFORM {fn_notify}(p_channel, v_k, p_wake, v_ev || v_fence);
    END IF;
    RETURN NEXT;
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM {s} AS s WHERE s.lock_id = ANY (p_lock_ids)) THEN
    FOR r IN
      SELECT x.k, x.t FROM (SELECT l.key AS k, 0 AS t FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids)
        UNION SELECT s.key, 1 FROM {s} AS s WHERE s.lock_id = ANY (p_lock_ids)) AS x
      ORDER BY hashtext(x.k), x.k, x.t
    LOOP
      IF r.t = 0 THEN
        PERFORM 1 FROM {t} AS l WHERE l.key = r.k FOR UPDATE;
      ELSE
        PERFORM 1 FROM {s} AS s WHERE s.key = r.k AND s.lock_id = ANY (p_lock_ids) ORDER BY s.lock_id FOR UPDATE;
      END IF;
    END LOOP;
  ELSE
    PERFORM 1 FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids) ORDER BY hashtext(l.key), l.key FOR UPDATE;
  END IF;
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  FOR v_i IN 1 .. coalesce(cardinality(p_lock_ids), 0) LOOP
    o_idx := v_i;
    v_k := NULL;
    DELETE FROM {t} AS l WHERE l.lock_id = p_lock_ids[v_i] AND l.expires_at_ms > v_now RETURNING l.user_key, l.fence INTO v_k, v_fence;
    v_ev := 'r:';
    IF v_k IS NULL THEN
      DELETE FROM {s} AS s WHERE s.lock_id = p_lock_ids[v_i] AND s.expires_at_ms > v_now
        RETURNING s.key, lpad(s.fence::text, 15, '0') INTO v_k, v_fence;
      v_ev := 'u:';
    END IF;
    o_ok := v_k IS NOT NULL;
    IF o_ok THEN
      PERFORM {fn_notify}(p_channel, v_k, p_wake, v_ev || v_fence);
    END IF;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Extend N lockIds, exclusive or shared, in one statement: rows locked in
-- the release function's order, FOR NO KEY UPDATE (a transaction guarding
-- the lease, FOR KEY SHARE, does not block its heartbeat); new expiry =
-- server now + ttl, only for rows with expires_at_ms > now (no revival).
-- Durable, as version 2's. o_revoked: not extended because a revoke
-- deleted the lease (its lockId's hash is the key's revoked_lock_hash).
CREATE OR REPLACE FUNCTION {fn_extend4}(p_lock_ids text[], p_ttls bigint[])
RETURNS TABLE (o_idx integer, o_expires_ms bigint, o_revoked boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_i integer;
  v_now bigint;
BEGIN
  IF current_setting('synchronous_commit') <> 'on' THEN
    PERFORM set_config('synchronous_commit', 'on', true);
  END IF;
  IF cardinality(p_lock_ids) = 1 THEN
    -- One row to lock, exclusive or shared: no order to keep.
    PERFORM 1 FROM {t} AS l WHERE l.lock_id = p_lock_ids[1] FOR NO KEY UPDATE;
    IF NOT FOUND THEN
      PERFORM 1 FROM {s} AS s WHERE s.lock_id = p_lock_ids[1] FOR NO KEY UPDATE;
    END IF;
  ELSIF EXISTS (SELECT 1 FROM {s} AS s WHERE s.lock_id = ANY (p_lock_ids)) THEN
    FOR r IN
      SELECT x.k, x.t FROM (SELECT l.key AS k, 0 AS t FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids)
        UNION SELECT s.key, 1 FROM {s} AS s WHERE s.lock_id = ANY (p_lock_ids)) AS x
      ORDER BY hashtext(x.k), x.k, x.t
    LOOP
      IF r.t = 0 THEN
        PERFORM 1 FROM {t} AS l WHERE l.key = r.k FOR NO KEY UPDATE;
      ELSE
        PERFORM 1 FROM {s} AS s WHERE s.key = r.k AND s.lock_id = ANY (p_lock_ids) ORDER BY s.lock_id FOR NO KEY UPDATE;
      END IF;
    END LOOP;
  ELSE
    PERFORM 1 FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids) ORDER BY hashtext(l.key), l.key FOR NO KEY UPDATE;
  END IF;
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  FOR v_i IN 1 .. coalesce(cardinality(p_lock_ids), 0) LOOP
    o_idx := v_i;
    o_expires_ms := NULL;
    UPDATE {t} AS l SET expires_at_ms = v_now + p_ttls[v_i] WHERE l.lock_id = p_lock_ids[v_i] AND l.expires_at_ms > v_now
      RETURNING l.expires_at_ms INTO o_expires_ms;
    IF o_expires_ms IS NULL THEN
      UPDATE {s} AS s SET expires_at_ms = v_now + p_ttls[v_i] WHERE s.lock_id = p_lock_ids[v_i] AND s.expires_at_ms > v_now
        RETURNING s.expires_at_ms INTO o_expires_ms;
    END IF;
    o_revoked := o_expires_ms IS NULL
      AND EXISTS (SELECT 1 FROM {h} AS h WHERE h.revoked_lock_hash = {fn_hash}(p_lock_ids[v_i]));
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Hand N keys over in one statement (version 2's, plus: shared holds, lock
-- delays and watchers). For each item, release the exclusive lockId
-- p_old_ids[i] (the caller's lock on p_keys[i]) and grant p_keys[i] to
-- p_lock_ids[i]: in place when the old row is still live and holds the old
-- lockId (o_released), under the acquire rule ({fn_check}) otherwise. A
-- released key that could not be granted (status 2) is notified on
-- p_channel (when not NULL), as version 2's does.
--
-- The in-place grant is one conditional UPDATE of the lock row, without
-- locking it first (a row lock is one more WAL record): its WHERE, read
-- again on the row's latest version after waiting for a release or an
-- extend in flight, reads the server clock then. The fence counter, which
-- only grants of the key write and they all hold the key's advisory lock,
-- is read before and incremented after, so the UPDATE that finds nothing
-- leaves no gap. An old lease that expires while the UPDATE waits for a
-- transaction guarding it (which ends without changing the row) is still
-- handed over in place: its holder released it, and no other grant of
-- the key can come between (the caller holds the key's advisory lock).
-- A key whose advisory lock another transaction keeps past the bounded
-- wait of {fn_acquire4} is released (o_released) and answered held.
CREATE OR REPLACE FUNCTION {fn_handoff4}(p_old_ids text[], p_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_delays bigint[], p_holder text, p_channel text)
RETURNS TABLE (o_idx integer, o_released boolean, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint, o_now_ms bigint, o_retry_ms bigint, o_holder text, o_shared integer)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  c record;
  v_order integer[];
  v_i integer;
  v_k text;
  v_fc bigint;
  v_fence text;
  v_until bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 100;
BEGIN
  IF current_setting('synchronous_commit') <> 'on' THEN
    PERFORM set_config('synchronous_commit', 'on', true);
  END IF;
  -- As in {fn_acquire4}.
  IF cardinality(p_keys) = 1 THEN
    v_order := ARRAY[1];
  ELSE
    v_order := ARRAY(SELECT u.i::integer FROM unnest(p_keys) WITH ORDINALITY AS u(k, i) ORDER BY hashtext(u.k), u.k, u.i);
  END IF;
  FOREACH v_i IN ARRAY v_order LOOP
    o_idx := v_i; v_k := p_keys[v_i];
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL; o_retry_ms := NULL; o_holder := NULL; o_shared := NULL;
    IF NOT pg_try_advisory_xact_lock(hashtext(v_k)) AND NOT {fn_lockwait}(v_k, 0, v_until) THEN
      -- Another transaction keeps the key's lock past the statement's
      -- bounded wait (as {fn_acquire4}): release the old lease without
      -- its lock, as {fn_release4} does, and answer the grant held.
      DELETE FROM {t} AS l WHERE l.key = v_k AND l.lock_id = p_old_ids[v_i] AND l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
        RETURNING l.fence INTO v_fence;
      o_released := FOUND;
      IF o_released THEN
        PERFORM {fn_notify}(p_channel, v_k, 2, 'r:' || v_fence);
      END IF;
      o_now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
      o_status := 1; o_retry_ms := o_now_ms + 1000;
      RETURN NEXT;
      CONTINUE;
    END IF;
    v_fc := NULL;
    SELECT fc.fence INTO v_fc FROM {f} AS fc WHERE fc.fence_key = p_fence_keys[v_i];
    o_now_ms := NULL;
    IF coalesce(v_fc, 0) < 900000000000000 THEN
      UPDATE {t} AS l SET lock_id = p_lock_ids[v_i], (acquired_at_ms, expires_at_ms) = (SELECT z.n, z.n + p_ttls[v_i]
          FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS n) AS z),
        fence = lpad((coalesce(v_fc, 0) + 1)::text, 15, '0'), user_key = v_k
        WHERE l.key = v_k AND l.lock_id = p_old_ids[v_i] AND l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
        RETURNING l.acquired_at_ms INTO o_now_ms;
    ELSE
      -- The counter is at FENCE MAX: release the old lease, grant nothing.
      DELETE FROM {t} AS l WHERE l.key = v_k AND l.lock_id = p_old_ids[v_i] AND l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
        RETURNING l.fence INTO v_fence;
      o_released := FOUND;
      IF o_released THEN
        PERFORM {fn_notify}(p_channel, v_k, 2, 'r:' || v_fence);
        o_now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        o_status := 2;
        RETURN NEXT;
        CONTINUE;
      END IF;
    END IF;
    o_released := o_now_ms IS NOT NULL;
    IF o_released THEN
      o_fence := coalesce(v_fc, 0) + 1;
      IF v_fc IS NULL THEN
        -- A counter gone under a live lease (deleted by hand).
        INSERT INTO {f} (fence_key, fence, key_debug) VALUES (p_fence_keys[v_i], o_fence, v_k);
      ELSE
        UPDATE {f} AS fc SET fence = o_fence WHERE fc.fence_key = p_fence_keys[v_i];
      END IF;
      IF p_holder IS NOT NULL OR p_delays[v_i] > 0 THEN
        UPDATE {h} AS h SET lock_id = p_lock_ids[v_i], holder = coalesce(p_holder, ''), lock_delay_ms = nullif(p_delays[v_i], 0)
          WHERE h.key = v_k;
        IF NOT FOUND THEN
          INSERT INTO {h} (key, lock_id, holder, lock_delay_ms) VALUES (v_k, p_lock_ids[v_i], coalesce(p_holder, ''), nullif(p_delays[v_i], 0));
        END IF;
      END IF;
      -- Watchers hear what happened: the old lease's release (its fence
      -- is the counter's before this grant), then the grant.
      IF v_fc IS NOT NULL THEN
        PERFORM {fn_notify}(p_channel, v_k, 0, 'r:' || lpad(v_fc::text, 15, '0'));
      END IF;
      PERFORM {fn_notify}(p_channel, v_k, 0, 'g:' || lpad(o_fence::text, 15, '0'));
      o_status := 0; o_acquired_ms := o_now_ms; o_expires_ms := o_now_ms + p_ttls[v_i];
      RETURN NEXT;
      CONTINUE;
    END IF;
    c := {fn_check}(v_k, NULL, NULL);
    o_now_ms := c.c_now;
    IF c.c_status <> 0 THEN
      o_status := c.c_status; o_expires_ms := c.c_exp; o_retry_ms := c.c_retry; o_holder := c.c_holder; o_shared := c.c_shared;
      RETURN NEXT;
      CONTINUE;
    END IF;
    o_fence := {fn_grant}(v_k, p_fence_keys[v_i], p_lock_ids[v_i], p_ttls[v_i], p_delays[v_i], p_holder, p_channel, o_now_ms, c.c_row);
    IF o_fence IS NULL THEN
      o_status := 2;
    ELSE
      o_status := 0; o_acquired_ms := o_now_ms; o_expires_ms := o_now_ms + p_ttls[v_i];
    END IF;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- One handoff, as {fn_handoff4} with one item, in a lighter call: plain
-- arguments in, one row out (a hot key's section is one handoff, and the
-- arrays and the set-returning call were most of what its statement cost
-- beyond its writes). The common case runs here, statement for statement
-- as in {fn_handoff4}: the key's advisory lock taken at once, its fence
-- counter below FENCE MAX, the old lease live and taken over in place;
-- watchers are told of the release and the grant. Every other case (the
-- lock held by another transaction, no counter or one at FENCE MAX, the
-- old lease gone) is answered by {fn_handoff4} itself, which finds the
-- UPDATE here changed nothing. Durable.
CREATE OR REPLACE FUNCTION {fn_handoff1}(p_old_id text, p_key text, p_fence_key text, p_lock_id text, p_ttl bigint, p_delay bigint, p_holder text, p_channel text,
  OUT o_released boolean, OUT o_status integer, OUT o_fence bigint, OUT o_acquired_ms bigint, OUT o_expires_ms bigint, OUT o_now_ms bigint,
  OUT o_retry_ms bigint, OUT o_holder text, OUT o_shared integer)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_fc bigint;
  v_h integer := hashtext(p_key);
  v_ok boolean;
BEGIN
  IF current_setting('synchronous_commit') <> 'on' THEN
    PERFORM set_config('synchronous_commit', 'on', true);
  END IF;
  IF pg_try_advisory_xact_lock(v_h) THEN
    SELECT fc.fence INTO v_fc FROM {f} AS fc WHERE fc.fence_key = p_fence_key;
    IF v_fc < 900000000000000 THEN
      UPDATE {t} AS l SET lock_id = p_lock_id, (acquired_at_ms, expires_at_ms) = (SELECT z.n, z.n + p_ttl
          FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS n) AS z),
        fence = lpad((v_fc + 1)::text, 15, '0'), user_key = p_key
        WHERE l.key = p_key AND l.lock_id = p_old_id AND l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
        RETURNING l.acquired_at_ms INTO o_now_ms;
      IF FOUND THEN
        o_fence := v_fc + 1;
        UPDATE {f} AS fc SET fence = o_fence WHERE fc.fence_key = p_fence_key;
        IF p_holder IS NOT NULL OR p_delay > 0 THEN
          UPDATE {h} AS h SET lock_id = p_lock_id, holder = coalesce(p_holder, ''), lock_delay_ms = nullif(p_delay, 0)
            WHERE h.key = p_key;
          IF NOT FOUND THEN
            INSERT INTO {h} (key, lock_id, holder, lock_delay_ms) VALUES (p_key, p_lock_id, coalesce(p_holder, ''), nullif(p_delay, 0));
          END IF;
        END IF;
        -- {fn_notify}'s watcher check, made once for both events.
        IF pg_try_advisory_lock({watch_class}, v_h) THEN
          v_ok := pg_advisory_unlock({watch_class}, v_h);
        ELSE
          PERFORM {fn_notify}(p_channel, p_key, 0, 'r:' || lpad(v_fc::text, 15, '0'));
          PERFORM {fn_notify}(p_channel, p_key, 0, 'g:' || lpad(o_fence::text, 15, '0'));
        END IF;
        o_released := true; o_status := 0; o_acquired_ms := o_now_ms; o_expires_ms := o_now_ms + p_ttl;
        RETURN;
      END IF;
    END IF;
  END IF;
  SELECT r.o_released, r.o_status, r.o_fence, r.o_acquired_ms, r.o_expires_ms, r.o_now_ms, r.o_retry_ms, r.o_holder, r.o_shared
    INTO o_released, o_status, o_fence, o_acquired_ms, o_expires_ms, o_now_ms, o_retry_ms, o_holder, o_shared
    FROM {fn_handoff4}(ARRAY[p_old_id], ARRAY[p_key], ARRAY[p_fence_key], ARRAY[p_lock_id], ARRAY[p_ttl], ARRAY[p_delay], p_holder, p_channel) AS r;
END
$fn$;

-- Revoke N items in one statement, in (hashtext, key) order: under the
-- key's advisory lock, delete the live holds of p_keys[i] whatever their
-- lockIds: every one (the exclusive lease, readers, permits) when
-- p_holds[i] is NULL, else only the hold whose lockId has that hashKey (24
-- hex digits, the lock_id_hash of the leases view) or grant id (64 hex
-- digits, pg.GrantID). The rows are locked first (the exclusive one FOR
-- UPDATE: that waits for transactions that guard the lease), then the
-- clock read: a hold is live while expires_at_ms + 1000 > now. A hold that
-- is not live is left in place, and so is an expired lease's lock delay
-- (the acquire functions refuse the key until its expires_at_ms + max(1 s,
-- the delay)): a revoke never frees a key earlier than its expiry would.
-- For each hold deleted, with a channel, its holder is told ('r:' ||
-- hashKey(key) || ':' || hashKey(lockId)), the key's waiters are woken
-- (waited only) and watchers told ('v:' fence for the exclusive lease, 'u:'
-- fence for a shared hold). When something was deleted, the key is kept
-- from every acquire until now + the delay (p_delays[i] when > 0, else the
-- revoked exclusive grant's lock delay; none when both are 0). o_revoked
-- counts the holds deleted (o_exclusive: the exclusive lease among them,
-- first in o_lock_hashes and o_fences); o_delay_until_ms is when a lock
-- delay in force after the revoke ends (the revoke's, an earlier one, or
-- that of an expired lease left in place), NULL when none is. Durable.
CREATE OR REPLACE FUNCTION {fn_revoke}(p_keys text[], p_delays bigint[], p_holds text[], p_channel text)
RETURNS TABLE (o_idx integer, o_revoked integer, o_exclusive boolean, o_lock_hashes text[], o_fences bigint[], o_delay_until_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  s record;
  v_id text;
  v_exp bigint;
  v_fence text;
  v_now bigint;
  v_delay bigint;
  v_hid text;
  v_ldelay bigint;
  v_until bigint;
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  FOR r IN
    SELECT u.k, u.d, u.h, u.i::integer AS i FROM unnest(p_keys, p_delays, p_holds) WITH ORDINALITY AS u(k, d, h, i)
    ORDER BY hashtext(u.k), u.k, u.i
  LOOP
    o_idx := r.i;
    o_revoked := 0; o_exclusive := false; o_lock_hashes := ARRAY[]::text[]; o_fences := ARRAY[]::bigint[]; o_delay_until_ms := NULL;
    PERFORM pg_advisory_xact_lock(hashtext(r.k));
    v_id := NULL; v_exp := NULL; v_fence := NULL;
    SELECT l.lock_id, l.expires_at_ms, l.fence INTO v_id, v_exp, v_fence FROM {t} AS l WHERE l.key = r.k FOR UPDATE;
    PERFORM 1 FROM {s} AS x WHERE x.key = r.k ORDER BY x.lock_id FOR UPDATE;
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_hid := NULL; v_ldelay := NULL; v_until := NULL;
    SELECT h.lock_id, h.lock_delay_ms, h.delay_until_ms INTO v_hid, v_ldelay, v_until FROM {h} AS h WHERE h.key = r.k;
    IF v_hid IS DISTINCT FROM v_id THEN
      v_ldelay := NULL;
    END IF;
    IF v_id IS NOT NULL AND v_exp + 1000 > v_now AND (r.h IS NULL OR r.h IN ({fn_hash}(v_id),
        encode(sha256(convert_to('pglease grant v1', 'UTF8') || '\x00'::bytea || convert_to(v_id, 'UTF8')), 'hex'))) THEN
      DELETE FROM {t} AS l WHERE l.key = r.k;
      o_revoked := 1; o_exclusive := true;
      o_lock_hashes := ARRAY[{fn_hash}(v_id)];
      o_fences := ARRAY[CASE WHEN v_fence ~ '^[0-9]{1,18}$' THEN v_fence::bigint END];
      -- Remembered for the revoked holder's next extend (o_revoked).
      INSERT INTO {h} AS h (key, lock_id, holder, revoked_lock_hash) VALUES (r.k, '', '', {fn_hash}(v_id))
        ON CONFLICT (key) DO UPDATE SET revoked_lock_hash = EXCLUDED.revoked_lock_hash;
      IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, 'r:' || {fn_hash}(r.k) || ':' || {fn_hash}(v_id));
      END IF;
      PERFORM {fn_notify}(p_channel, r.k, 1, 'v:' || v_fence);
    ELSIF v_id IS NOT NULL AND v_exp + 1000 <= v_now AND v_exp + greatest(1000, coalesce(v_ldelay, 0)) > v_now THEN
      -- An expired lease still inside its lock delay: left in place.
      v_until := greatest(v_until, v_exp + v_ldelay);
    END IF;
    FOR s IN
      DELETE FROM {s} AS x WHERE x.key = r.k AND x.expires_at_ms + 1000 > v_now
        AND (r.h IS NULL OR r.h IN ({fn_hash}(x.lock_id),
          encode(sha256(convert_to('pglease grant v1', 'UTF8') || '\x00'::bytea || convert_to(x.lock_id, 'UTF8')), 'hex')))
      RETURNING x.lock_id, x.fence
    LOOP
      o_revoked := o_revoked + 1;
      o_lock_hashes := o_lock_hashes || {fn_hash}(s.lock_id);
      o_fences := o_fences || s.fence;
      IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, 'r:' || {fn_hash}(r.k) || ':' || {fn_hash}(s.lock_id));
      END IF;
      PERFORM {fn_notify}(p_channel, r.k, 1, 'u:' || lpad(s.fence::text, 15, '0'));
    END LOOP;
    IF o_revoked > 0 THEN
      v_delay := nullif(r.d, 0);
      IF v_delay IS NULL AND o_exclusive THEN
        v_delay := v_ldelay;
      END IF;
      IF v_delay > 0 THEN
        v_until := greatest(v_until, v_now + v_delay);
        INSERT INTO {h} AS h (key, lock_id, holder, delay_until_ms) VALUES (r.k, '', '', v_until)
          ON CONFLICT (key) DO UPDATE SET delay_until_ms = EXCLUDED.delay_until_ms;
      END IF;
    END IF;
    IF v_until > v_now THEN
      o_delay_until_ms := v_until;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- The state of N keys, read when no change of them is in flight: per key
-- in (hashtext, key) order, the advisory lock shared (held by acquires,
-- handoffs and revokes), the exclusive and shared rows FOR KEY SHARE
-- (locked by releases); then, with a new snapshot, the rows. A watcher
-- that registered its watch lock and then reads this misses no final
-- state: a change that did not see its lock commits before the read. It
-- never waits: a key whose lock or rows another transaction holds (a
-- takeover waiting for a writer that guards the lease can hold them for
-- seconds) is answered busy (o_now_ms NULL, nothing else), and the caller
-- reads it again later, so that one key's wait does not hold up the
-- others' reads.
CREATE OR REPLACE FUNCTION {fn_snapshot}(p_keys text[])
RETURNS TABLE (o_idx integer, o_now_ms bigint, o_lock_hash text, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint,
  o_holder text, o_lock_delay_ms bigint, o_shared integer, o_limit integer, o_shared_expires_ms bigint, o_counter bigint,
  o_delay_until_ms bigint, o_excl_wait_until_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_id text;
  v_fence text;
  v_busy boolean[];
  v_n integer;
BEGIN
  v_busy := array_fill(false, ARRAY[coalesce(cardinality(p_keys), 0)]);
  FOR r IN SELECT u.k, u.i::integer AS i FROM unnest(p_keys) WITH ORDINALITY AS u(k, i) ORDER BY hashtext(u.k), u.k, u.i LOOP
    IF NOT pg_try_advisory_xact_lock_shared(hashtext(r.k)) THEN
      v_busy[r.i] := true;
      CONTINUE;
    END IF;
    -- SKIP LOCKED skips a row locked in a conflicting mode (a release's
    -- delete in flight, or waiting): the key is busy when it skipped one.
    PERFORM 1 FROM {t} AS l WHERE l.key = r.k FOR KEY SHARE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM {t} AS l WHERE l.key = r.k) THEN
      v_busy[r.i] := true;
      CONTINUE;
    END IF;
    SELECT count(*) INTO v_n FROM (SELECT 1 FROM {s} AS s WHERE s.key = r.k ORDER BY s.lock_id FOR KEY SHARE SKIP LOCKED) AS x;
    IF v_n < (SELECT count(*) FROM {s} AS s WHERE s.key = r.k) THEN
      v_busy[r.i] := true;
    END IF;
  END LOOP;
  FOR r IN SELECT u.k, u.i::integer AS i FROM unnest(p_keys) WITH ORDINALITY AS u(k, i) ORDER BY u.i LOOP
    o_idx := r.i;
    IF v_busy[r.i] THEN
      o_now_ms := NULL; o_lock_hash := NULL; o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL;
      o_holder := NULL; o_lock_delay_ms := NULL; o_shared := NULL; o_limit := NULL; o_shared_expires_ms := NULL;
      o_counter := NULL; o_delay_until_ms := NULL; o_excl_wait_until_ms := NULL;
      RETURN NEXT;
      CONTINUE;
    END IF;
    o_now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_id := NULL; v_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL;
    SELECT l.lock_id, l.fence, l.acquired_at_ms, l.expires_at_ms INTO v_id, v_fence, o_acquired_ms, o_expires_ms
      FROM {t} AS l WHERE l.key = r.k;
    o_lock_hash := CASE WHEN v_id IS NOT NULL THEN {fn_hash}(v_id) END;
    o_fence := CASE WHEN v_fence ~ '^[0-9]{1,18}$' THEN v_fence::bigint END;
    o_holder := NULL; o_lock_delay_ms := NULL; o_delay_until_ms := NULL; o_excl_wait_until_ms := NULL;
    SELECT CASE WHEN h.lock_id = v_id THEN h.holder END, CASE WHEN h.lock_id = v_id THEN h.lock_delay_ms END, h.delay_until_ms, h.excl_wait_until_ms
      INTO o_holder, o_lock_delay_ms, o_delay_until_ms, o_excl_wait_until_ms FROM {h} AS h WHERE h.key = r.k;
    SELECT count(*), min(s.lim), max(s.expires_at_ms) INTO o_shared, o_limit, o_shared_expires_ms
      FROM {s} AS s WHERE s.key = r.k AND s.expires_at_ms + 1000 > o_now_ms;
    o_counter := NULL;
    SELECT fc.fence INTO o_counter FROM {f} AS fc WHERE fc.fence_key = 'fence:' || r.k;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- The database guard. The trigger function: a row of a guarded table
-- (BEFORE INSERT/UPDATE/DELETE, FOR EACH ROW; TG_ARGV[0] the key column)
-- may be written only by a transaction that holds a live exclusive lease of
-- the row's key (its old and new key, when an update changes it): a lease
-- whose lockId is in the transaction's pglease.lock_ids (comma-separated;
-- the Guard calls add to it) or follows from a guard proof in its
-- pglease.lock_proofs (comma-separated, 76 hex digits each: c || p, the
-- lockId being c || sha256(p)[:10]; pglease's own lockIds have one), and
-- whose expires_at_ms is after the server's clock. A strict guard
-- (TG_ARGV[1] = 'strict') ignores pglease.lock_ids: a lockId read from the
-- lock table does not pass it, only the proof, which the table does not
-- hold. A second trigger ({guard_trigger}_truncate, BEFORE TRUNCATE, FOR
-- EACH STATEMENT, the same function) refuses TRUNCATE, which fires no row
-- trigger and would remove every key's rows. The lease's row is locked FOR KEY SHARE until the transaction ends,
-- so a takeover waits for its commit. Otherwise SQLSTATE PGL10. SECURITY
-- DEFINER (the writer needs no privilege on the lock table), search_path
-- pinned to pg_catalog, pg_temp, every other name schema-qualified when it
-- is created. The installer ({lock}_guard) and remover ({lock}_unguard):
-- SECURITY INVOKER (installing needs the guarded table's ownership).
DO $pglease$
DECLARE
  v_schema text;
  v_lock text;
  v_fence text;
  v_holders text;
  v_shared text;
  v_hash text;
  v_fn text;
BEGIN
  SELECT n.nspname, format('%I.%I', n.nspname, c.relname) INTO v_schema, v_lock
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('{t}');
  SELECT format('%I.%I', n.nspname, c.relname) INTO v_fence
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('{f}');
  SELECT format('%I.%I', n.nspname, c.relname) INTO v_holders
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('{h}');
  SELECT format('%I.%I', n.nspname, c.relname) INTO v_shared
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('{s}');
  SELECT format('%I.%I', n.nspname, p.proname) INTO v_hash
    FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE p.oid = to_regprocedure('{fn_hash}(text)');
  v_fn := format('%I.%I', v_schema, '{fn_guard_trigger}');
  EXECUTE replace(replace(replace($body$
CREATE OR REPLACE FUNCTION @fn@() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_ids text[];
  v_proofs text[] := string_to_array(nullif(current_setting('pglease.lock_proofs', true), ''), ',');
  v_strict boolean;
  v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  v_old text;
  v_new text;
  v_key text;
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    RAISE EXCEPTION USING ERRCODE = 'PGL10', MESSAGE = 'pglease: TRUNCATE of a guarded table is refused',
      DETAIL = 'table ' || quote_ident(TG_TABLE_SCHEMA) || '.' || quote_ident(TG_TABLE_NAME),
      HINT = 'TRUNCATE removes every key''s rows at once: delete them under their keys'' leases, or, as the table''s owner, remove the guard first (Migrator.Unguard, or the lock table''s _unguard function)';
  END IF;
  v_strict := TG_NARGS > 1 AND TG_ARGV[1] = 'strict';
  IF NOT v_strict THEN
    v_ids := string_to_array(nullif(current_setting('pglease.lock_ids', true), ''), ',');
  END IF;
  IF v_proofs IS NOT NULL THEN
    v_ids := coalesce(v_ids, '{}'::text[]) || ARRAY(
      SELECT rtrim(translate(encode(substr(x.b, 1, 6) || substr(sha256(substr(x.b, 7)), 1, 10), 'base64'), '+/', '-_'), '=')
      FROM (SELECT decode(p, 'hex') AS b FROM unnest(v_proofs) AS p WHERE p ~ '^[0-9a-f]{76}$') AS x);
  END IF;
  IF TG_OP <> 'INSERT' THEN
    v_old := to_jsonb(OLD) ->> TG_ARGV[0];
  END IF;
  IF TG_OP <> 'DELETE' THEN
    v_new := to_jsonb(NEW) ->> TG_ARGV[0];
  END IF;
  FOR v_i IN 1..2 LOOP
    CONTINUE WHEN v_i = 1 AND TG_OP = 'INSERT';
    CONTINUE WHEN v_i = 2 AND (TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND v_new IS NOT DISTINCT FROM v_old));
    v_key := CASE v_i WHEN 1 THEN v_old ELSE v_new END;
    IF v_key IS NOT NULL AND v_ids IS NOT NULL THEN
      PERFORM 1 FROM @lock@ AS l WHERE l.key = v_key AND l.lock_id = ANY (v_ids) AND l.expires_at_ms > v_now FOR KEY SHARE;
      CONTINUE WHEN FOUND;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PGL10', MESSAGE = 'pglease: this transaction holds no live lease of the row''s key',
      DETAIL = 'table ' || quote_ident(TG_TABLE_SCHEMA) || '.' || quote_ident(TG_TABLE_NAME) || ', key column ' || quote_ident(TG_ARGV[0])
        || CASE WHEN v_key IS NULL THEN ' is NULL' ELSE ', key hash ' || @hash@(v_key) END,
      HINT = CASE WHEN v_strict THEN 'this guard is strict: guard the transaction with the key''s lease first ((*manager.Lock).Guard, pg.Store.Guard with a lease this process acquired, or the SQL API acquire''s guard_proof in pglease.lock_proofs); a lock_id in pglease.lock_ids does not pass'
        ELSE 'guard the transaction with the key''s lease first ((*manager.Lock).Guard, pg.Store.Guard, or SELECT set_config(''pglease.lock_ids'', lock_id, true) after locking the lease)' END;
  END LOOP;
  IF TG_OP = 'DELETE' THEN
    RETURN OLD;
  END IF;
  RETURN NEW;
END
$fn$;
$body$, '@fn@', v_fn), '@lock@', v_lock), '@hash@', v_hash);
  EXECUTE replace(replace(replace(replace(replace(replace($body$
CREATE OR REPLACE FUNCTION {api_guard}(tbl regclass, key_column name, strict boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  IF tbl IS NULL OR key_column IS NULL OR strict IS NULL THEN
    RAISE EXCEPTION 'pglease: guard: the table, the key column and strict must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Serialized with the migrations and with other installs (DROP and
  -- CREATE TRIGGER would race).
  PERFORM pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
  IF tbl IN (to_regclass('@lock@'), to_regclass('@fence@'), to_regclass('@holders@'), to_regclass('@shared@')) THEN
    RAISE EXCEPTION 'pglease: guard: % is one of pglease''s own tables', tbl USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_attribute AS a WHERE a.attrelid = tbl AND a.attname = key_column AND a.attnum > 0 AND NOT a.attisdropped) THEN
    RAISE EXCEPTION 'pglease: guard: table % has no column %', tbl, quote_ident(key_column) USING ERRCODE = 'undefined_column';
  END IF;
  -- tgtype 31 = ROW | BEFORE | INSERT | DELETE | UPDATE; tgargs = the key
  -- column and, for a strict guard, 'strict', each NUL-terminated.
  IF NOT EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = tbl AND t.tgname = '{guard_trigger}'
      AND t.tgfoid = to_regprocedure('@fn@()') AND t.tgtype = 31 AND t.tgenabled = 'O'
      AND t.tgargs = convert_to(key_column::text, 'UTF8') || '\x00'::bytea
        || CASE WHEN strict THEN convert_to('strict', 'UTF8') || '\x00'::bytea ELSE ''::bytea END) THEN
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', '{guard_trigger}', tbl);
    EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L%s)',
      '{guard_trigger}', tbl, '@fn@', key_column, CASE WHEN strict THEN ', ''strict''' ELSE '' END);
  END IF;
  -- tgtype 34 = BEFORE | TRUNCATE (statement level).
  IF NOT EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = tbl AND t.tgname = '{guard_trigger}_truncate'
      AND t.tgfoid = to_regprocedure('@fn@()') AND t.tgtype = 34 AND t.tgenabled = 'O') THEN
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', '{guard_trigger}_truncate', tbl);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()',
      '{guard_trigger}_truncate', tbl, '@fn@');
  END IF;
END
$fn$;
$body$, '@fn@', v_fn), '@lock@', v_lock), '@fence@', v_fence), '@holders@', v_holders), '@shared@', v_shared), '@hash@', v_hash);
END
$pglease$;
CREATE OR REPLACE FUNCTION {api_guard}(tbl regclass, key_column name) RETURNS void
LANGUAGE sql VOLATILE AS $fn$
  SELECT {api_guard}($1, $2, false)
$fn$;
CREATE OR REPLACE FUNCTION {api_unguard}(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  IF tbl IS NULL THEN
    RAISE EXCEPTION 'pglease: unguard: the table must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', '{guard_trigger}', tbl);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', '{guard_trigger}_truncate', tbl);
END
$fn$;

-- The SQL API: stable names derived from the lock table's, for SQL
-- callers (psql, other services) next to pglease processes on the same
-- tables. Keys are normalized to NFC (the server's tables) and must be 1 to
-- 512 bytes; TTLs are milliseconds. Grants record the holder
-- "application_name[pid]@sql". Releases and revokes notify the channel in
-- the session setting pglease.notify_channel ('pglease_release' when unset:
-- manager.DefaultNotifyChannel).

-- Take key for ttl_ms: the grant's lock_id (a bearer secret), fence,
-- expiry and guard proof, or a NULL lock_id, fence and guard_proof when
-- the key is held (expires_at_ms is then the holder's expiry, NULL for
-- shared holds or a delay). The lock_id is c || sha256(p)[:10] (c 6 random
-- bytes, p 32), and guard_proof is hex(c || p): what the strict database
-- guard accepts in pglease.lock_proofs, and what the lock table does not
-- hold. A refused call marks a key that readers or permits use as waited
-- for by a writer for 2 s (no new reader or permit meanwhile); a caller
-- that waits keeps the mark by calling again within 1 s. It never queues,
-- and yields to the key's fair queue as a Manager's try does (p_yield): a
-- key free but waited for by a live ticket is held (expires_at_ms NULL).
CREATE OR REPLACE FUNCTION {api_acquire}(key text, ttl_ms bigint, OUT lock_id text, OUT fence bigint, OUT expires_at_ms bigint,
  OUT guard_proof text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_k text := normalize($1, NFC);
  v_c bytea := substr(uuid_send(gen_random_uuid()), 1, 6);
  v_p bytea := uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid());
  v_id text := rtrim(translate(encode(v_c || substr(sha256(v_p), 1, 10), 'base64'), '+/', '-_'), '=');
  r record;
BEGIN
  IF v_k IS NULL OR v_k = '' OR octet_length(v_k) > 512 THEN
    RAISE EXCEPTION 'pglease: the key must be 1 to 512 bytes after NFC normalization' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF $2 IS NULL OR $2 <= 0 OR $2 > 9007199254740991 - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 86400000 THEN
    RAISE EXCEPTION 'pglease: ttl_ms must be positive (and the expiry below 2^53 ms)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO r FROM {fn_acquire4}(ARRAY[v_k], ARRAY['fence:' || v_k], ARRAY[v_id], ARRAY[$2], ARRAY[0::bigint],
    format('%s[%s]@sql', coalesce(nullif(current_setting('application_name', true), ''), session_user::text), pg_backend_pid()),
    coalesce(nullif(current_setting('pglease.notify_channel', true), ''), 'pglease_release'), ARRAY[true]);
  IF r.o_status = 2 THEN
    RAISE EXCEPTION 'pglease: fence counter overflow: the key''s fence would exceed 900000000000000; no lock granted' USING ERRCODE = 'numeric_value_out_of_range';
  END IF;
  IF r.o_status = 0 THEN
    lock_id := v_id; fence := r.o_fence; guard_proof := encode(v_c || v_p, 'hex');
  END IF;
  expires_at_ms := r.o_expires_ms;
END
$fn$;

-- Release the lease lock_id holds (exclusive or shared): true when it was
-- held; wakes the sessions waiting for its key, as a Manager's release.
CREATE OR REPLACE FUNCTION {api_release}(lock_id text) RETURNS boolean
LANGUAGE sql VOLATILE AS $fn$
  SELECT coalesce((SELECT r.o_ok FROM {fn_release4}(ARRAY[$1],
    coalesce(nullif(current_setting('pglease.notify_channel', true), ''), 'pglease_release'), 1, true) AS r), false)
$fn$;

-- Extend the lease lock_id holds to server now + ttl_ms: its new
-- expires_at_ms, or NULL when it is no longer held.
CREATE OR REPLACE FUNCTION {api_extend}(lock_id text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v bigint;
BEGIN
  IF $2 IS NULL OR $2 <= 0 OR $2 > 9007199254740991 - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 86400000 THEN
    RAISE EXCEPTION 'pglease: ttl_ms must be positive (and the expiry below 2^53 ms)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT r.o_expires_ms INTO v FROM {fn_extend4}(ARRAY[$1], ARRAY[$2]) AS r;
  RETURN v;
END
$fn$;

-- The key's exclusive lease (held: live for acquirers, expires_at_ms + 1 s
-- after the server's clock) and its live shared holds. Read-only.
CREATE OR REPLACE FUNCTION {api_status}(key text, OUT held boolean, OUT fence bigint, OUT expires_at_ms bigint, OUT holder text, OUT shared integer)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  v_k text := normalize($1, NFC);
  v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
  SELECT true, CASE WHEN l.fence ~ '^[0-9]{1,18}$' THEN l.fence::bigint END, l.expires_at_ms, h.holder
    INTO held, fence, expires_at_ms, holder
    FROM {t} AS l LEFT JOIN {h} AS h ON h.key = l.key AND h.lock_id = l.lock_id
    WHERE l.key = v_k AND l.expires_at_ms + 1000 > v_now;
  held := coalesce(held, false);
  SELECT count(*) INTO shared FROM {s} AS s WHERE s.key = v_k AND s.expires_at_ms + 1000 > v_now;
END
$fn$;

-- Revoke the key's live holds, whatever their lockIds: every one (its
-- exclusive lease, or its readers or semaphore permits) when hold is NULL,
-- else only the hold whose lockId has that hash (lock_id_hash of the
-- leases view) or grant id (pg.GrantID, (*manager.Lock).GrantID). Each
-- revoked holder's Manager ends the lock with CodeRevoked. revoked counts
-- the holds deleted (0: none was live, nothing changed; an expired lease
-- is left in place with its lock delay). With delay_ms > 0 (or the revoked
-- lease's lock delay) the key stays free of grants until then.
-- not_before_ms is when a lock delay in force after the revoke ends (NULL:
-- none, the key is free for acquirers unless still held).
CREATE OR REPLACE FUNCTION {api_revoke}(key text, delay_ms bigint DEFAULT 0, hold text DEFAULT NULL, OUT revoked integer, OUT not_before_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_k text := normalize($1, NFC);
BEGIN
  IF v_k IS NULL OR v_k = '' OR octet_length(v_k) > 512 THEN
    RAISE EXCEPTION 'pglease: the key must be 1 to 512 bytes after NFC normalization' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF $2 IS NULL OR $2 < 0 OR $2 > 9007199254740991 - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 86400000 THEN
    RAISE EXCEPTION 'pglease: delay_ms must not be negative (and the delay''s end below 2^53 ms)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF $3 IS NOT NULL AND $3 !~ '^([0-9a-f]{24}|[0-9a-f]{64})$' THEN
    RAISE EXCEPTION 'pglease: hold must be NULL (every hold), a lock_id_hash (24 hex digits) or a grant id (64 hex digits)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT r.o_revoked, r.o_delay_until_ms INTO revoked, not_before_ms FROM {fn_revoke}(ARRAY[v_k], ARRAY[$2], ARRAY[$3],
    coalesce(nullif(current_setting('pglease.notify_channel', true), ''), 'pglease_release')) AS r;
END
$fn$;

-- Ask the key's live holders to release it, without taking anything:
-- every one (its exclusive lease, or its readers or permits) when hold is
-- NULL, else only the hold named (as {api_revoke} names it). One
-- notification ('q:' || hashKey(key), then ':' || hold when one is
-- named); each holder's Manager closes the lock's ReleaseRequested
-- channel, and the holder decides. Returns how many live holds were
-- asked: 0 sends nothing (nobody holds the key, or not the hold named).
CREATE OR REPLACE FUNCTION {api_request_release}(key text, hold text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_k text := normalize($1, NFC);
  v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  v_n integer;
BEGIN
  IF v_k IS NULL OR v_k = '' OR octet_length(v_k) > 512 THEN
    RAISE EXCEPTION 'pglease: the key must be 1 to 512 bytes after NFC normalization' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF $2 IS NOT NULL AND $2 !~ '^([0-9a-f]{24}|[0-9a-f]{64})$' THEN
    RAISE EXCEPTION 'pglease: hold must be NULL (every hold), a lock_id_hash (24 hex digits) or a grant id (64 hex digits)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT count(*) INTO v_n FROM (SELECT l.lock_id FROM {t} AS l WHERE l.key = v_k AND l.expires_at_ms > v_now
      UNION ALL SELECT s.lock_id FROM {s} AS s WHERE s.key = v_k AND s.expires_at_ms > v_now) AS x
    WHERE $2 IS NULL OR $2 IN ({fn_hash}(x.lock_id),
      encode(sha256(convert_to('pglease grant v1', 'UTF8') || '\x00'::bytea || convert_to(x.lock_id, 'UTF8')), 'hex'));
  IF v_n > 0 THEN
    PERFORM pg_notify(coalesce(nullif(current_setting('pglease.notify_channel', true), ''), 'pglease_release'),
      'q:' || {fn_hash}(v_k) || coalesce(':' || $2, ''));
  END IF;
  RETURN v_n;
END
$fn$;

-- Every lease of the lock table, exclusive and shared, without its lockId
-- (lock_id_hash is pglease.HashKey of it): live by SyncGuard's rule.
CREATE OR REPLACE VIEW {v_leases} AS
  SELECT l.key, 'exclusive'::text AS mode, NULL::integer AS lim, h.holder,
    CASE WHEN l.fence ~ '^[0-9]{1,18}$' THEN l.fence::bigint END AS fence,
    to_timestamp(l.acquired_at_ms / 1000.0) AS acquired_at, to_timestamp(l.expires_at_ms / 1000.0) AS expires_at,
    l.expires_at_ms + 1000 > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS live,
    {fn_hash}(l.lock_id) AS lock_id_hash
  FROM {t} AS l LEFT JOIN {h} AS h ON h.key = l.key AND h.lock_id = l.lock_id
  UNION ALL
  SELECT s.key, CASE WHEN s.lim = 0 THEN 'reader' ELSE 'permit' END, nullif(s.lim, 0), s.holder, s.fence,
    to_timestamp(s.acquired_at_ms / 1000.0), to_timestamp(s.expires_at_ms / 1000.0),
    s.expires_at_ms + 1000 > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    {fn_hash}(s.lock_id)
  FROM {s} AS s;

-- The sessions that wait for (Managers' waiter locks) or watch a key of the
-- lock table (keys with an exclusive or shared row; a waiter lock names the
-- key by hashtext, so a collision can show a session under another key),
-- and the fair queue's live tickets (kind 'queued', in order: position 1
-- is the head; since, holder identity, mode, and the hashKey of the
-- ticket's lockId, never the lockId; no session).
CREATE OR REPLACE VIEW {v_waiters} AS
  SELECT k.key, CASE WHEN p.classid = {waiter_class}::oid THEN 'wait' ELSE 'watch' END AS kind,
    p.pid, a.application_name, a.usename,
    NULL::bigint AS position, NULL::timestamptz AS since, NULL::text AS holder, NULL::text AS mode, NULL::text AS lock_id_hash
  FROM pg_locks AS p
  JOIN (SELECT l.key FROM {t} AS l UNION SELECT s.key FROM {s} AS s) AS k ON p.objid = hashtext(k.key)::oid
  LEFT JOIN pg_stat_activity AS a ON a.pid = p.pid
  WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.granted
    AND p.classid IN ({waiter_class}::oid, {watch_class}::oid)
    AND p.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  UNION ALL
  SELECT q.key, 'queued', NULL::integer, NULL::text, NULL::name,
    row_number() OVER (PARTITION BY q.key ORDER BY q.seq), to_timestamp(q.enqueued_at_ms / 1000.0), q.holder,
    CASE WHEN q.set_no IS NOT NULL THEN 'set' WHEN q.lim IS NULL THEN 'exclusive' WHEN q.lim = 0 THEN 'reader' ELSE 'permit' END,
    {fn_hash}(q.lock_id)
  FROM {q} AS q
  WHERE q.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;

-- Every advisory lock of the database, with its session: key for the
-- one-bigint form, key1 and key2 for the two-integer form, and kind
-- 'pglease waiter' / 'pglease watcher' for a Manager's waiter and watch
-- locks. One view per schema, shared by every lock table in it.
CREATE OR REPLACE VIEW {v_advisory} AS
  SELECT p.pid, p.mode, p.granted,
    CASE WHEN p.objsubid = 1 THEN (p.classid::bigint << 32) | p.objid::bigint END AS key,
    CASE WHEN p.objsubid = 2 THEN (p.classid::bigint - CASE WHEN p.classid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer END AS key1,
    CASE WHEN p.objsubid = 2 THEN (p.objid::bigint - CASE WHEN p.objid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::integer END AS key2,
    CASE WHEN p.objsubid = 2 AND p.classid = {waiter_class}::oid THEN 'pglease waiter'
      WHEN p.objsubid = 2 AND p.classid = {watch_class}::oid THEN 'pglease watcher' END AS kind,
    a.application_name, a.usename, a.state, a.xact_start
  FROM pg_locks AS p LEFT JOIN pg_stat_activity AS a ON a.pid = p.pid
  WHERE p.locktype = 'advisory' AND p.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());

-- Serves key p_key's queue, under the key's advisory lock (the caller
-- holds it): drops its expired tickets, then grants the head ticket when
-- {fn_check} allows (exclusive: {fn_grant}; reader or permit: the shared
-- insert of {fn_acquire_shared}), and the tickets after it while they are
-- of the head's kind and can be granted (readers in a row; permits while
-- the semaphore has room); an exclusive head goes alone. Each grant
-- deletes its ticket, makes the commit durable and notifies the ticket's
-- channel only: 'q:' || hashKey(key) || ':' || hashKey(lockId) || ':' ||
-- fence || ':' || expires_at_ms. A head that is a set's ticket is not
-- granted here (its other keys are not locked): it is told its turn
-- ('…:0:0') and the key stays free for it (no ticket behind it may go).
-- A notice for channel p_self (the caller's own queue channel, NULL for
-- none) is not sent: it is added to the transaction's setting
-- pglease.qturns (payloads, space-separated), for the caller to return in
-- its result, so a grant to a waiter of the releasing process needs no
-- notification. With synchronous standbys named
-- (synchronous_standby_names), a grant's notice to another channel ends
-- in ':s': PostgreSQL delivers it even when the commit's wait for the
-- standby is cancelled (the grant then on the primary alone), so its
-- process must confirm the grant with a commit of its own, which waits
-- for the standby, before trusting it. Returns the number of grants.
CREATE OR REPLACE FUNCTION {fn_qserve}(p_key text, p_channel text, p_until bigint, p_self text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  q record;
  c record;
  v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  v_fence bigint;
  v_n integer := 0;
  v_first boolean := true;
  v_kind integer;
  v_this integer;
  v_void text;
  v_chs text[] := ARRAY[]::text[];
  v_msgs text[] := ARRAY[]::text[];
BEGIN
  DELETE FROM {q} AS x WHERE x.key = p_key AND x.expires_at_ms <= v_now;
  FOR q IN SELECT x.* FROM {q} AS x WHERE x.key = p_key ORDER BY x.seq LOOP
    IF q.set_no IS NOT NULL THEN
      IF v_first THEN
        v_chs := v_chs || q.channel; v_msgs := v_msgs || ('q:' || {fn_hash}(p_key) || ':' || {fn_hash}(q.lock_id) || ':0:0');
      END IF;
      EXIT;
    END IF;
    v_this := CASE WHEN q.lim IS NULL THEN -1 WHEN q.lim = 0 THEN 0 ELSE 1 END;
    IF v_first THEN
      v_kind := v_this;
    ELSIF v_kind = -1 OR v_kind <> v_this THEN
      EXIT;
    END IF;
    v_first := false;
    c := {fn_check}(p_key, q.lim, p_until);
    IF c.c_status <> 0 THEN
      EXIT;
    END IF;
    IF q.lim IS NULL THEN
      v_fence := {fn_grant}(p_key, q.fence_key, q.lock_id, q.ttl_ms, q.delay_ms, q.holder, p_channel, c.c_now, c.c_row);
    ELSIF q.lim = 0 THEN
      SELECT fc.fence INTO v_fence FROM {f} AS fc WHERE fc.fence_key = q.fence_key;
      v_fence := coalesce(v_fence, 0);
    ELSE
      v_fence := NULL;
      INSERT INTO {f} AS fc (fence_key, fence, key_debug) VALUES (q.fence_key, 1, p_key)
        ON CONFLICT (fence_key) DO UPDATE SET fence = fc.fence + 1 WHERE fc.fence < 900000000000000
        RETURNING fc.fence INTO v_fence;
    END IF;
    IF v_fence IS NULL THEN
      -- FENCE MAX: the ticket's own attempt reports it.
      v_chs := v_chs || q.channel; v_msgs := v_msgs || ('q:' || {fn_hash}(p_key) || ':' || {fn_hash}(q.lock_id) || ':0:0');
      EXIT;
    END IF;
    IF q.lim IS NOT NULL THEN
      INSERT INTO {s} (lock_id, key, lim, expires_at_ms, acquired_at_ms, fence, holder)
        VALUES (q.lock_id, p_key, q.lim, c.c_now + q.ttl_ms, c.c_now, v_fence, q.holder);
      PERFORM {fn_notify}(p_channel, p_key, 0, 's:' || lpad(v_fence::text, 15, '0'));
    END IF;
    IF v_n = 0 AND current_setting('synchronous_commit') <> 'on' THEN
      -- A fence handed out and lost in a crash would be handed out again.
      v_void := set_config('synchronous_commit', 'on', true);
    END IF;
    DELETE FROM {q} AS x WHERE x.seq = q.seq;
    v_chs := v_chs || q.channel; v_msgs := v_msgs || ('q:' || {fn_hash}(p_key) || ':' || {fn_hash}(q.lock_id) || ':' || v_fence::text || ':' || (c.c_now + q.ttl_ms)::text);
    v_n := v_n + 1;
  END LOOP;
  PERFORM pg_notify(x.ch, CASE WHEN x.msg LIKE '%:0:0' OR current_setting('synchronous_standby_names') = '' THEN x.msg ELSE x.msg || ':s' END)
    FROM unnest(v_chs, v_msgs) AS x(ch, msg) WHERE x.ch IS DISTINCT FROM p_self;
  IF p_self = ANY (v_chs) THEN
    v_void := set_config('pglease.qturns', coalesce(current_setting('pglease.qturns', true), '') ||
      (SELECT string_agg(x.msg || ' ', '') FROM unnest(v_chs, v_msgs) AS x(ch, msg) WHERE x.ch = p_self), true);
  END IF;
  RETURN v_n;
END
$fn$;

-- Acquire or enqueue, in one statement: the fair queue's attempt. p_sets[i]
-- is 0 for a single-key item, k > 0 for an item of the batch's set k (all
-- or nothing, exclusive); p_limits[i] NULL exclusive, 0 reader, n permit.
-- Every key's advisory lock is taken first, in (hashtext, key) order
-- (bounded as in {fn_acquire4}: a key still locked after 100 ms is
-- answered held and its item neither queued nor granted, nor any item of
-- its set). Then, per item, the key's expired tickets are dropped and the
-- item's ticket (the ticket whose lock_id is the item's) refreshed to now
-- + p_life, or enqueued at the tail: a set's tickets after all its keys
-- are locked, so two tickets that share keys are in the same order on
-- each. Then, per key in seq order, an item whose ticket may go (an
-- exclusive one at the head of the key's live tickets, a reader with no
-- writer or permit ahead, a permit with nothing ahead) and that
-- {fn_check} allows is granted ({fn_grant}, or the shared insert) and its
-- ticket deleted; a set is granted only when each of its items may go and
-- can be granted. Status: 0 acquired, 1 held (o_position: the ticket's
-- place among the key's live tickets, 1 = head; NULL when not queued), 2
-- fence overflow (the ticket is dropped), 5 gone. p_refresh (NULL: no
-- item): a single item with p_refresh[i] true only refreshes its ticket,
-- which an earlier statement queued: when the ticket is gone and its
-- lockId holds no lease (it expired, or it was granted and that grant has
-- since ended) it is answered gone, not queued again — an attempt in
-- flight when its waiter's grant came and went must not queue the lockId
-- anew for a grant nobody waits for.
DROP FUNCTION IF EXISTS {fn_qwait}(integer[], text[], text[], text[], bigint[], bigint[], integer[], text, text, text, bigint);
CREATE OR REPLACE FUNCTION {fn_qwait}(p_sets integer[], p_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_delays bigint[],
  p_limits integer[], p_holder text, p_channel text, p_qchannel text, p_life bigint, p_refresh boolean[] DEFAULT NULL)
RETURNS TABLE (o_idx integer, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint, o_now_ms bigint, o_retry_ms bigint,
  o_holder text, o_shared integer, o_limit integer, o_position bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  c record;
  v_n integer := coalesce(array_length(p_keys, 1), 0);
  v_nsets integer := greatest(coalesce((SELECT max(x) FROM unnest(p_sets) AS x), 0), 1);
  v_until bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 100;
  v_now bigint;
  v_got boolean[];
  v_setok boolean[];
  v_setno bigint[];
  v_seq bigint[];
  v_status integer[];
  v_cnow bigint[];
  v_retry bigint[];
  v_exp bigint[];
  v_holder text[];
  v_shared integer[];
  v_limit integer[];
  v_row boolean[];
  v_may boolean;
  v_fence bigint;
  v_s bigint;
  v_sn bigint;
  v_hf bigint;
  v_ha bigint;
  v_he bigint;
  v_hfence bigint[];
  v_hacq bigint[];
  v_hexp bigint[];
  v_void text;
  v_fresh boolean := pg_current_xact_id_if_assigned() IS NULL;
  v_granted boolean := false;
BEGIN
  IF current_setting('synchronous_commit') <> 'on' THEN
    v_void := set_config('synchronous_commit', 'on', true);
  END IF;
  v_got := array_fill(false, ARRAY[v_n]);
  v_row := v_got;
  v_setok := array_fill(true, ARRAY[v_nsets]);
  v_setno := array_fill(NULL::bigint, ARRAY[v_nsets]);
  v_seq := array_fill(NULL::bigint, ARRAY[v_n]);
  v_cnow := v_seq; v_retry := v_seq; v_exp := v_seq; v_hfence := v_seq; v_hacq := v_seq; v_hexp := v_seq;
  v_status := array_fill(NULL::integer, ARRAY[v_n]);
  v_shared := v_status; v_limit := v_status;
  v_holder := array_fill(NULL::text, ARRAY[v_n]);
  FOR r IN SELECT u.k, u.i::integer AS i FROM unnest(p_keys) WITH ORDINALITY AS u(k, i) ORDER BY hashtext(u.k), u.k, u.i LOOP
    v_got[r.i] := pg_try_advisory_xact_lock(hashtext(r.k)) OR {fn_lockwait}(r.k, 0, v_until);
    IF NOT v_got[r.i] AND p_sets[r.i] > 0 THEN
      v_setok[p_sets[r.i]] := false;
    END IF;
  END LOOP;
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  -- The items' tickets, locked in {fn_qrefresh}'s order (a refresh of the
  -- same tickets at the same time cannot deadlock with this).
  PERFORM 1 FROM {q} AS x WHERE x.lock_id = ANY (p_lock_ids) AND x.expires_at_ms > v_now
    ORDER BY hashtext(x.key), x.key, x.seq FOR NO KEY UPDATE;
  -- Enqueue or refresh, per key the single items first, then each set's
  -- item in set order: two sets of one batch that share keys are in the
  -- same order on each.
  FOR r IN SELECT u.k, u.st, u.i::integer AS i FROM unnest(p_keys, p_sets) WITH ORDINALITY AS u(k, st, i)
    ORDER BY hashtext(u.k), u.k, u.st, u.i LOOP
    IF NOT v_got[r.i] OR (r.st > 0 AND NOT v_setok[r.st]) THEN
      CONTINUE;
    END IF;
    DELETE FROM {q} AS x WHERE x.key = r.k AND x.expires_at_ms <= v_now;
    v_s := NULL; v_sn := NULL;
    UPDATE {q} AS x SET expires_at_ms = v_now + p_life, channel = p_qchannel
      WHERE x.lock_id = p_lock_ids[r.i] AND x.key = r.k AND x.expires_at_ms > v_now
      RETURNING x.seq, x.set_no INTO v_s, v_sn;
    IF v_s IS NULL THEN
      -- Already granted (a release served the ticket and the caller did
      -- not hear it): answered granted, not queued again.
      v_hf := NULL;
      SELECT l.fence::bigint, l.acquired_at_ms, l.expires_at_ms INTO v_hf, v_ha, v_he
        FROM {t} AS l WHERE l.lock_id = p_lock_ids[r.i] AND l.key = r.k AND l.expires_at_ms > v_now;
      IF v_hf IS NULL THEN
        SELECT s.fence, s.acquired_at_ms, s.expires_at_ms INTO v_hf, v_ha, v_he
          FROM {s} AS s WHERE s.lock_id = p_lock_ids[r.i] AND s.key = r.k AND s.expires_at_ms > v_now;
      END IF;
      IF v_hf IS NOT NULL THEN
        -- An answer "granted" is a grant's answer: its commit waits for
        -- the synchronous standby as a grant's does (the row lock is a
        -- write: a transaction id and WAL, so the commit waits), so that
        -- a grant committed on the primary alone (a cancelled wait for the
        -- standby, whose own answer was lost) is not answered granted
        -- from a read. SKIP LOCKED: it never waits (a lock held here and
        -- one waited for could deadlock with a release); a lease being
        -- deleted or replaced is answered held, to try again, neither
        -- granted nor queued.
        PERFORM 1 FROM {t} AS l WHERE l.lock_id = p_lock_ids[r.i] AND l.key = r.k FOR KEY SHARE SKIP LOCKED;
        IF NOT FOUND THEN
          PERFORM 1 FROM {s} AS s WHERE s.lock_id = p_lock_ids[r.i] AND s.key = r.k FOR KEY SHARE SKIP LOCKED;
        END IF;
        IF FOUND THEN
          v_hfence[r.i] := v_hf; v_hacq[r.i] := v_ha; v_hexp[r.i] := v_he; v_granted := true;
        ELSE
          v_got[r.i] := false;
          IF r.st > 0 THEN
            v_setok[r.st] := false;
          END IF;
        END IF;
        CONTINUE;
      END IF;
      IF r.st = 0 AND p_refresh[r.i] THEN
        v_status[r.i] := 5; -- gone: not queued again
        CONTINUE;
      END IF;
      DELETE FROM {q} AS x WHERE x.lock_id = p_lock_ids[r.i];
      INSERT INTO {q} (key, lock_id, fence_key, lim, set_no, ttl_ms, delay_ms, holder, channel, enqueued_at_ms, expires_at_ms)
        VALUES (r.k, p_lock_ids[r.i], p_fence_keys[r.i], p_limits[r.i], CASE WHEN r.st > 0 THEN v_setno[r.st] END, p_ttls[r.i],
          coalesce(p_delays[r.i], 0), p_holder, p_qchannel, v_now, v_now + p_life)
        RETURNING seq INTO v_s;
      IF r.st > 0 AND v_setno[r.st] IS NULL THEN
        v_setno[r.st] := v_s;
        UPDATE {q} AS x SET set_no = v_s WHERE x.seq = v_s;
      END IF;
    ELSIF r.st > 0 AND v_setno[r.st] IS NULL THEN
      v_setno[r.st] := v_sn;
    END IF;
    v_seq[r.i] := v_s;
  END LOOP;
  -- Single items: per key in seq order, check and grant at once, so that
  -- a grant lets the next ticket of the batch go.
  FOR r IN SELECT u.k, u.st, u.lim, u.i::integer AS i FROM unnest(p_keys, p_sets, p_limits) WITH ORDINALITY AS u(k, st, lim, i)
    ORDER BY hashtext(u.k), u.k, v_seq[u.i], u.i LOOP
    o_idx := r.i;
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL; o_retry_ms := NULL; o_holder := NULL; o_shared := NULL; o_limit := NULL;
    o_position := NULL; o_now_ms := v_now;
    IF v_hfence[r.i] IS NOT NULL THEN
      IF r.st = 0 THEN
        o_status := 0; o_fence := v_hfence[r.i]; o_acquired_ms := v_hacq[r.i]; o_expires_ms := v_hexp[r.i];
        RETURN NEXT;
      END IF;
      CONTINUE;
    END IF;
    IF v_status[r.i] = 5 THEN
      o_status := 5;
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF v_seq[r.i] IS NULL THEN
      -- Not locked in time (or its set was not): held, to try again.
      IF r.st = 0 THEN
        o_status := 1; o_retry_ms := v_now + 1000;
        RETURN NEXT;
      ELSE
        v_status[r.i] := 1; v_retry[r.i] := v_now + 1000; v_setok[r.st] := false;
      END IF;
      CONTINUE;
    END IF;
    v_may := NOT EXISTS (SELECT 1 FROM {q} AS x WHERE x.key = r.k AND x.seq < v_seq[r.i] AND x.expires_at_ms > v_now
      AND (r.lim IS DISTINCT FROM 0 OR x.lim IS DISTINCT FROM 0));
    IF v_may THEN
      c := {fn_check}(r.k, r.lim, v_until);
      IF c.c_limit = -1 THEN
        PERFORM {fn_notify}(p_channel, r.k, 1, NULL);
        c.c_limit := NULL;
      END IF;
    END IF;
    IF r.st > 0 THEN
      -- A set's item: checked here, granted below with its set.
      v_cnow[r.i] := v_now;
      IF NOT v_may THEN
        v_status[r.i] := 1;
        v_setok[r.st] := false;
        CONTINUE;
      END IF;
      v_row[r.i] := c.c_row; v_cnow[r.i] := c.c_now;
      IF c.c_status <> 0 THEN
        v_status[r.i] := c.c_status; v_retry[r.i] := c.c_retry; v_exp[r.i] := c.c_exp; v_holder[r.i] := c.c_holder; v_shared[r.i] := c.c_shared;
        v_setok[r.st] := false;
      ELSE
        v_fence := NULL;
        SELECT fc.fence INTO v_fence FROM {f} AS fc WHERE fc.fence_key = p_fence_keys[r.i] FOR UPDATE;
        v_status[r.i] := CASE WHEN v_fence >= 900000000000000 THEN 2 ELSE 0 END;
        IF v_status[r.i] <> 0 THEN
          v_setok[r.st] := false;
        END IF;
      END IF;
      CONTINUE;
    END IF;
    IF v_may THEN
      v_may := c.c_status = 0;
      IF NOT v_may THEN
        o_now_ms := c.c_now; o_expires_ms := c.c_exp; o_retry_ms := c.c_retry; o_holder := c.c_holder; o_shared := c.c_shared; o_limit := c.c_limit;
      END IF;
    END IF;
    IF NOT v_may THEN
      o_status := 1;
      SELECT count(*) INTO o_position FROM {q} AS x WHERE x.key = r.k AND x.seq <= v_seq[r.i] AND x.expires_at_ms > v_now;
      RETURN NEXT;
      CONTINUE;
    END IF;
    o_now_ms := c.c_now;
    IF r.lim IS NULL THEN
      v_fence := {fn_grant}(r.k, p_fence_keys[r.i], p_lock_ids[r.i], p_ttls[r.i], coalesce(p_delays[r.i], 0), p_holder, p_channel, c.c_now, c.c_row);
    ELSIF r.lim = 0 THEN
      SELECT fc.fence INTO v_fence FROM {f} AS fc WHERE fc.fence_key = p_fence_keys[r.i];
      v_fence := coalesce(v_fence, 0);
    ELSE
      v_fence := NULL;
      INSERT INTO {f} AS fc (fence_key, fence, key_debug) VALUES (p_fence_keys[r.i], 1, r.k)
        ON CONFLICT (fence_key) DO UPDATE SET fence = fc.fence + 1 WHERE fc.fence < 900000000000000
        RETURNING fc.fence INTO v_fence;
    END IF;
    DELETE FROM {q} AS x WHERE x.seq = v_seq[r.i];
    IF v_fence IS NULL THEN
      o_status := 2;
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF r.lim IS NOT NULL THEN
      INSERT INTO {s} (lock_id, key, lim, expires_at_ms, acquired_at_ms, fence, holder)
        VALUES (p_lock_ids[r.i], r.k, r.lim, c.c_now + p_ttls[r.i], c.c_now, v_fence, p_holder);
      PERFORM {fn_notify}(p_channel, r.k, 0, 's:' || lpad(v_fence::text, 15, '0'));
    END IF;
    o_status := 0; o_fence := v_fence; o_acquired_ms := c.c_now; o_expires_ms := c.c_now + p_ttls[r.i];
    v_granted := true;
    RETURN NEXT;
  END LOOP;
  -- Sets: granted whole or not at all.
  FOR r IN SELECT u.k, u.st, u.i::integer AS i FROM unnest(p_keys, p_sets) WITH ORDINALITY AS u(k, st, i)
    WHERE u.st > 0 ORDER BY hashtext(u.k), u.k, u.i LOOP
    o_idx := r.i; o_now_ms := v_cnow[r.i];
    o_fence := NULL; o_acquired_ms := NULL; o_expires_ms := NULL; o_retry_ms := NULL; o_holder := NULL; o_shared := NULL; o_limit := NULL;
    o_position := NULL;
    IF v_hfence[r.i] IS NOT NULL THEN
      o_status := 0; o_fence := v_hfence[r.i]; o_acquired_ms := v_hacq[r.i]; o_expires_ms := v_hexp[r.i];
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF NOT v_setok[r.st] THEN
      o_status := CASE WHEN v_status[r.i] = 2 THEN 2 ELSE 1 END;
      o_retry_ms := v_retry[r.i]; o_expires_ms := v_exp[r.i]; o_holder := v_holder[r.i]; o_shared := v_shared[r.i];
      IF v_seq[r.i] IS NOT NULL THEN
        SELECT count(*) INTO o_position FROM {q} AS x WHERE x.key = r.k AND x.seq <= v_seq[r.i] AND x.expires_at_ms > v_now;
      END IF;
      RETURN NEXT;
      CONTINUE;
    END IF;
    o_fence := {fn_grant}(r.k, p_fence_keys[r.i], p_lock_ids[r.i], p_ttls[r.i], coalesce(p_delays[r.i], 0), p_holder, p_channel, v_cnow[r.i], v_row[r.i]);
    IF o_fence IS NULL THEN
      RAISE EXCEPTION 'pglease: fence counter changed under its row lock' USING ERRCODE = 'internal_error';
    END IF;
    DELETE FROM {q} AS x WHERE x.seq = v_seq[r.i];
    o_status := 0; o_acquired_ms := v_cnow[r.i]; o_expires_ms := v_cnow[r.i] + p_ttls[r.i];
    v_granted := true;
    RETURN NEXT;
  END LOOP;
  IF v_fresh AND NOT v_granted THEN
    -- Nothing granted (queued, refreshed, refused, gone): the commit
    -- need not wait for its WAL flush, as a release's. A ticket lost in
    -- a crash is only a place: the waiter's refresh finds it gone and
    -- its next attempt queues it again. The key's advisory lock is let go
    -- at once, not after a flush, so the key's release is not held up.
    v_void := set_config('synchronous_commit', 'off', true);
  END IF;
END
$fn$;

-- {fn_qwait} for exclusive single-key items of one key that are not
-- refreshes (p_lock_ids[i], p_ttls[i], p_delays[i]: distinct lockIds), in
-- plain arguments: the common wait on a contended key (callers that come
-- back for the key while others wait), in a few statements instead of the
-- batch function's loops. Statement for statement as {fn_qwait} runs this
-- case: the key's advisory lock taken at once, its expired tickets
-- dropped, each item's ticket refreshed, or, when its lockId holds no
-- lease, enqueued at the tail, in the items' order; with a live ticket
-- ahead of the first of them (an exclusive ticket goes only at the head),
-- none may go, and each is answered held (status 1, o_position, o_now_ms);
-- the commit need not wait for its flush when the statement wrote nothing
-- before. Every other case is answered by {fn_qwait} itself, before this
-- function wrote anything: the advisory lock held by another transaction,
-- a lockId holding a lease (a grant that came), or no live ticket ahead
-- (the first item may go).
CREATE OR REPLACE FUNCTION {fn_qwait1}(p_key text, p_fence_key text, p_lock_ids text[], p_ttls bigint[], p_delays bigint[], p_holder text, p_channel text,
  p_qchannel text, p_life bigint)
RETURNS TABLE (o_idx integer, o_status integer, o_fence bigint, o_acquired_ms bigint, o_expires_ms bigint, o_now_ms bigint, o_retry_ms bigint,
  o_holder text, o_shared integer, o_limit integer, o_position bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_n integer := coalesce(cardinality(p_lock_ids), 0);
  v_now bigint;
  v_first bigint;
  v_seq bigint[];
  v_i integer;
  v_void text;
  v_fresh boolean := pg_current_xact_id_if_assigned() IS NULL;
BEGIN
  IF current_setting('synchronous_commit') <> 'on' THEN
    v_void := set_config('synchronous_commit', 'on', true);
  END IF;
  IF v_n > 0 AND pg_try_advisory_xact_lock(hashtext(p_key)) THEN
    -- Decided before anything is written, so that {fn_qwait} meets the
    -- same transaction as if called itself (its commit waits for the
    -- flush only when it wrote or granted).
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_seq := ARRAY(SELECT (SELECT x.seq FROM {q} AS x WHERE x.lock_id = u.id AND x.key = p_key AND x.expires_at_ms > v_now)
      FROM unnest(p_lock_ids) WITH ORDINALITY AS u(id, i) ORDER BY u.i);
    v_first := (SELECT min(x) FROM unnest(v_seq) AS x);
    IF NOT EXISTS (SELECT 1 FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids) AND l.key = p_key AND l.expires_at_ms > v_now)
        AND NOT EXISTS (SELECT 1 FROM {s} AS s WHERE s.lock_id = ANY (p_lock_ids) AND s.key = p_key AND s.expires_at_ms > v_now)
        AND EXISTS (SELECT 1 FROM {q} AS x WHERE x.key = p_key AND x.expires_at_ms > v_now AND x.lock_id <> ALL (p_lock_ids)
          AND (v_first IS NULL OR x.seq < v_first)) THEN
      DELETE FROM {q} AS x WHERE x.key = p_key AND x.expires_at_ms <= v_now;
      FOR v_i IN 1 .. v_n LOOP
        IF v_seq[v_i] IS NULL THEN
          DELETE FROM {q} AS x WHERE x.lock_id = p_lock_ids[v_i];
          INSERT INTO {q} (key, lock_id, fence_key, lim, set_no, ttl_ms, delay_ms, holder, channel, enqueued_at_ms, expires_at_ms)
            VALUES (p_key, p_lock_ids[v_i], p_fence_key, NULL, NULL, p_ttls[v_i], coalesce(p_delays[v_i], 0), p_holder, p_qchannel, v_now, v_now + p_life)
            RETURNING seq INTO v_first;
          v_seq[v_i] := v_first;
        ELSE
          UPDATE {q} AS x SET expires_at_ms = v_now + p_life, channel = p_qchannel WHERE x.seq = v_seq[v_i];
        END IF;
      END LOOP;
      RETURN QUERY SELECT u.i::integer, 1, NULL::bigint, NULL::bigint, NULL::bigint, v_now, NULL::bigint, NULL::text, NULL::integer, NULL::integer,
          (SELECT count(*) FROM {q} AS x WHERE x.key = p_key AND x.seq <= u.s AND x.expires_at_ms > v_now)
        FROM unnest(v_seq) WITH ORDINALITY AS u(s, i);
      IF v_fresh THEN
        v_void := set_config('synchronous_commit', 'off', true);
      END IF;
      RETURN;
    END IF;
  END IF;
  RETURN QUERY SELECT r.o_idx, r.o_status, r.o_fence, r.o_acquired_ms, r.o_expires_ms, r.o_now_ms, r.o_retry_ms, r.o_holder, r.o_shared, r.o_limit, r.o_position
    FROM {fn_qwait}(array_fill(0, ARRAY[v_n]), array_fill(p_key, ARRAY[v_n]), array_fill(p_fence_key, ARRAY[v_n]), p_lock_ids, p_ttls, p_delays,
      array_fill(NULL::integer, ARRAY[v_n]), p_holder, p_channel, p_qchannel, p_life) AS r;
END
$fn$;

-- Refreshes tickets: each live ticket whose lock_id is p_lock_ids[i] lives
-- until now + p_life (an expired one is not revived: its caller enqueues
-- again, at the tail). o_position: the ticket's place among its key's live
-- tickets (1 = head); NULL when it has none, then o_fence and o_expires_ms
-- tell a grant that came meanwhile (the lockId holds a live lease: a
-- release served the ticket, whose notification may have been missed).
-- Not durable (a refresh lost in a crash only shortens a ticket's life),
-- unless it finds a grant: that answer commits as a grant does.
-- The tickets are locked first in (hashtext(key), key, seq) order, the
-- order in which a release serving their keys deletes them ({fn_qserve},
-- keys in the release's order), so the two cannot deadlock. It also
-- deletes up to 100 expired tickets of any key (none it would wait for),
-- so that a dead waiter's ticket on a key nobody uses again goes too.
CREATE OR REPLACE FUNCTION {fn_qrefresh}(p_lock_ids text[], p_life bigint)
RETURNS TABLE (o_idx integer, o_position bigint, o_fence bigint, o_expires_ms bigint, o_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_i integer;
  v_k text;
  v_seq bigint;
  v_void text;
BEGIN
  IF pg_current_xact_id_if_assigned() IS NULL THEN
    v_void := set_config('synchronous_commit', 'off', true);
  END IF;
  o_now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  DELETE FROM {q} AS x WHERE x.seq IN (SELECT y.seq FROM {q} AS y WHERE y.expires_at_ms <= o_now_ms LIMIT 100 FOR UPDATE SKIP LOCKED);
  PERFORM 1 FROM {q} AS x WHERE x.lock_id = ANY (p_lock_ids) AND x.expires_at_ms > o_now_ms
    ORDER BY hashtext(x.key), x.key, x.seq FOR NO KEY UPDATE;
  FOR v_i IN 1 .. coalesce(cardinality(p_lock_ids), 0) LOOP
    o_idx := v_i; o_position := NULL; o_fence := NULL; o_expires_ms := NULL; v_k := NULL;
    UPDATE {q} AS x SET expires_at_ms = o_now_ms + p_life WHERE x.lock_id = p_lock_ids[v_i] AND x.expires_at_ms > o_now_ms
      RETURNING x.key, x.seq INTO v_k, v_seq;
    IF v_k IS NOT NULL THEN
      SELECT count(*) INTO o_position FROM {q} AS x WHERE x.key = v_k AND x.seq <= v_seq AND x.expires_at_ms > o_now_ms;
    ELSE
      SELECT l.fence::bigint, l.expires_at_ms INTO o_fence, o_expires_ms FROM {t} AS l WHERE l.lock_id = p_lock_ids[v_i] AND l.expires_at_ms > o_now_ms;
      IF NOT FOUND THEN
        SELECT s.fence, s.expires_at_ms INTO o_fence, o_expires_ms FROM {s} AS s WHERE s.lock_id = p_lock_ids[v_i] AND s.expires_at_ms > o_now_ms;
      END IF;
      IF o_fence IS NOT NULL THEN
        -- A grant found: answered as a grant commits (durable, waiting
        -- for the synchronous standby: the row lock is a write), as in
        -- {fn_qwait}; a lease being deleted or replaced (SKIP LOCKED:
        -- never waited for) is answered neither granted nor queued.
        v_void := set_config('synchronous_commit', 'on', true);
        PERFORM 1 FROM {t} AS l WHERE l.lock_id = p_lock_ids[v_i] FOR KEY SHARE SKIP LOCKED;
        IF NOT FOUND THEN
          PERFORM 1 FROM {s} AS s WHERE s.lock_id = p_lock_ids[v_i] FOR KEY SHARE SKIP LOCKED;
        END IF;
        IF NOT FOUND THEN
          o_fence := NULL; o_expires_ms := NULL;
        END IF;
      END IF;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- Releases N lockIds (exclusive or shared) as {fn_release4} does (p_wake
-- and p_async its own), and, with p_grant, serves each released key's
-- queue ({fn_qserve}) in the same transaction: the next holder is granted
-- by the release's commit and only its process is notified. The keys'
-- advisory locks are taken first, in (hashtext, key) order (the acquire's
-- lock order, then the rows'), waiting 100 ms at most: a key still locked
-- then is released without being served, and its head ticket's process
-- told its turn (its own attempt serves it). o_served: the grants made on
-- the item's key (on its first item only). Durable when it granted.
-- p_self: the releasing process's own queue channel (NULL: none); its
-- tickets' notices are not sent but returned, in o_turns (on the first
-- row; payloads as notified, space-separated), so a grant to a waiter of
-- the releasing process reaches it with the release's answer.
CREATE OR REPLACE FUNCTION {fn_qrelease}(p_lock_ids text[], p_channel text, p_wake integer, p_grant boolean, p_async boolean, p_self text DEFAULT NULL)
RETURNS TABLE (o_idx integer, o_ok boolean, o_served integer, o_turns text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_until bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 100;
  v_keys text[];
  v_locked boolean[];
  v_item text[];
  v_ok boolean[];
  v_served integer[];
  v_j integer;
  v_seen text[] := ARRAY[]::text[];
  v_void text;
BEGIN
  IF p_self IS NOT NULL THEN
    v_void := set_config('pglease.qturns', '', true);
  END IF;
  v_item := ARRAY(SELECT coalesce((SELECT l.key FROM {t} AS l WHERE l.lock_id = u.id), (SELECT s.key FROM {s} AS s WHERE s.lock_id = u.id))
    FROM unnest(p_lock_ids) WITH ORDINALITY AS u(id, i) ORDER BY u.i);
  v_keys := ARRAY(SELECT x.k FROM (SELECT DISTINCT k FROM unnest(v_item) AS y(k) WHERE k IS NOT NULL) AS x ORDER BY hashtext(x.k), x.k);
  v_locked := array_fill(false, ARRAY[greatest(cardinality(v_keys), 1)]);
  FOR v_j IN 1 .. cardinality(v_keys) LOOP
    v_locked[v_j] := pg_try_advisory_xact_lock(hashtext(v_keys[v_j])) OR {fn_lockwait}(v_keys[v_j], 0, v_until);
  END LOOP;
  v_ok := array_fill(false, ARRAY[greatest(cardinality(p_lock_ids), 1)]);
  FOR r IN SELECT x.o_idx, x.o_ok FROM {fn_release4}(p_lock_ids, p_channel, p_wake, p_async) AS x LOOP
    v_ok[r.o_idx] := r.o_ok;
  END LOOP;
  v_served := array_fill(0, ARRAY[greatest(cardinality(v_keys), 1)]);
  IF p_grant THEN
    FOR v_j IN 1 .. cardinality(v_keys) LOOP
      IF NOT EXISTS (SELECT 1 FROM {q} AS x WHERE x.key = v_keys[v_j]) THEN
        CONTINUE;
      END IF;
      IF v_locked[v_j] THEN
        v_served[v_j] := {fn_qserve}(v_keys[v_j], p_channel, v_until, p_self);
      ELSE
        PERFORM pg_notify(x.channel, 'q:' || {fn_hash}(x.key) || ':' || {fn_hash}(x.lock_id) || ':0:0')
          FROM (SELECT y.* FROM {q} AS y WHERE y.key = v_keys[v_j] AND y.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
            ORDER BY y.seq LIMIT 1) AS x;
      END IF;
    END LOOP;
  END IF;
  FOR v_j IN 1 .. coalesce(cardinality(p_lock_ids), 0) LOOP
    o_idx := v_j; o_ok := v_ok[v_j]; o_served := 0; o_turns := NULL;
    IF v_j = 1 AND p_self IS NOT NULL THEN
      o_turns := nullif(current_setting('pglease.qturns', true), '');
      v_void := set_config('pglease.qturns', '', true);
    END IF;
    IF v_item[v_j] IS NOT NULL AND NOT v_item[v_j] = ANY (v_seen) THEN
      v_seen := v_seen || v_item[v_j];
      o_served := v_served[array_position(v_keys, v_item[v_j])];
    END IF;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- {fn_qrelease} for one exclusive lease whose key's queue has an
-- exclusive single-key ticket at its head, in plain arguments and one
-- row: the hand-over of a contended key, the lease taken over in place
-- by the head's grant (as {fn_handoff1} does within a process). It makes
-- what the release and {fn_qserve} make: the key's expired tickets
-- dropped, the fence counter incremented, the lock row now the head's
-- (expiry = now + its TTL), its holder row (identity, lock delay, the
-- exclusive-waiting mark lapsed) and watchers told ('r:' the old fence,
-- 'g:' the new), the key's waiters woken as p_wake asks, the ticket
-- deleted, and the head's process told ('q:' …, or in o_turns for
-- p_self); the commit is durable. The lock row is updated, not deleted,
-- so the release trigger does not fire (nothing is free to wake anyone
-- for). Every other case is answered by {fn_qrelease} itself, before this
-- function wrote anything: p_grant false, the advisory lock held by
-- another transaction, no live ticket, a head that is a reader, a permit
-- or a set's, shared rows on the key, a revoke's delay in force, no fence
-- counter or one at FENCE MAX, or the lease not live and ours.
CREATE OR REPLACE FUNCTION {fn_qrelease1}(p_lock_id text, p_key text, p_channel text, p_wake integer, p_grant boolean, p_async boolean, p_self text,
  OUT o_ok boolean, OUT o_served integer, OUT o_turns text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  q record;
  v_now bigint;
  v_fc bigint;
  v_old text;
  v_msg text;
  v_void text;
BEGIN
  IF p_grant AND pg_try_advisory_xact_lock(hashtext(p_key)) THEN
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    SELECT x.* INTO q FROM {q} AS x WHERE x.key = p_key AND x.expires_at_ms > v_now ORDER BY x.seq LIMIT 1;
    IF FOUND AND q.lim IS NULL AND q.set_no IS NULL
        AND NOT EXISTS (SELECT 1 FROM {s} AS s WHERE s.key = p_key)
        AND NOT EXISTS (SELECT 1 FROM {h} AS h WHERE h.key = p_key AND h.delay_until_ms > v_now) THEN
      SELECT fc.fence INTO v_fc FROM {f} AS fc WHERE fc.fence_key = q.fence_key;
      SELECT l.fence INTO v_old FROM {t} AS l WHERE l.key = p_key AND l.lock_id = p_lock_id AND l.expires_at_ms > v_now;
      IF v_fc < 900000000000000 AND v_old IS NOT NULL THEN
        IF current_setting('synchronous_commit') <> 'on' THEN
          v_void := set_config('synchronous_commit', 'on', true);
        END IF;
        UPDATE {t} AS l SET lock_id = q.lock_id, acquired_at_ms = v_now, expires_at_ms = v_now + q.ttl_ms,
            fence = lpad((v_fc + 1)::text, 15, '0'), user_key = p_key
          WHERE l.key = p_key AND l.lock_id = p_lock_id AND l.expires_at_ms > v_now;
        IF FOUND THEN
          UPDATE {f} AS fc SET fence = v_fc + 1 WHERE fc.fence_key = q.fence_key;
          IF q.holder IS NOT NULL OR q.delay_ms > 0 THEN
            UPDATE {h} AS h SET lock_id = q.lock_id, holder = coalesce(q.holder, ''), lock_delay_ms = nullif(q.delay_ms, 0),
                excl_wait_until_ms = CASE WHEN h.excl_wait_until_ms > 0 THEN 0 ELSE h.excl_wait_until_ms END
              WHERE h.key = p_key;
            IF NOT FOUND THEN
              INSERT INTO {h} (key, lock_id, holder, lock_delay_ms) VALUES (p_key, q.lock_id, coalesce(q.holder, ''), nullif(q.delay_ms, 0));
            END IF;
          ELSE
            UPDATE {h} AS h SET excl_wait_until_ms = 0 WHERE h.key = p_key AND h.excl_wait_until_ms > 0;
          END IF;
          DELETE FROM {q} AS x WHERE x.key = p_key AND (x.expires_at_ms <= v_now OR x.seq = q.seq);
          PERFORM {fn_notify}(p_channel, p_key, p_wake, 'r:' || v_old);
          PERFORM {fn_notify}(p_channel, p_key, 0, 'g:' || lpad((v_fc + 1)::text, 15, '0'));
          v_msg := 'q:' || {fn_hash}(p_key) || ':' || {fn_hash}(q.lock_id) || ':' || (v_fc + 1)::text || ':' || (v_now + q.ttl_ms)::text;
          IF q.channel = p_self THEN
            o_turns := v_msg || ' ';
          ELSE
            PERFORM pg_notify(q.channel, CASE WHEN current_setting('synchronous_standby_names') = '' THEN v_msg ELSE v_msg || ':s' END);
          END IF;
          o_ok := true; o_served := 1;
          RETURN;
        END IF;
      END IF;
    END IF;
  END IF;
  SELECT r.o_ok, r.o_served, r.o_turns INTO o_ok, o_served, o_turns
    FROM {fn_qrelease}(ARRAY[p_lock_id], p_channel, p_wake, p_grant, p_async, p_self) AS r;
END
$fn$;

-- Leaves the queue: drops each ticket whose lock_id is p_lock_ids[i]
-- (o_left), under its key's advisory lock (taken in (hashtext, key) order,
-- waiting 1 s at most: a key locked longer by another transaction still
-- has the ticket dropped, without the lock, and its queue is not served
-- here: a grant that raced with the drop is found and released), releases
-- a lease the lockId holds (a grant that came while the caller gave up:
-- o_released), and serves the keys' queues ({fn_qserve}): a head that left
-- lets the next ticket go at once. It commits with synchronous_commit =
-- off, as a release does (a lost drop expires with the ticket's life, a
-- lost release with the lease's TTL; no fence is handed out), unless it
-- runs in a transaction that already wrote or a serve grants.
CREATE OR REPLACE FUNCTION {fn_qleave}(p_lock_ids text[], p_channel text)
RETURNS TABLE (o_idx integer, o_left boolean, o_released boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  v_until bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1000;
  v_locked boolean[];
  v_keys text[];
  v_j integer;
  v_k text;
  v_ok boolean;
  v_void text;
BEGIN
  IF pg_current_xact_id_if_assigned() IS NULL THEN
    v_void := set_config('synchronous_commit', 'off', true);
  END IF;
  v_keys := ARRAY(SELECT x.k FROM (SELECT DISTINCT y.k FROM (
      SELECT q.key AS k FROM {q} AS q WHERE q.lock_id = ANY (p_lock_ids)
      UNION SELECT l.key FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids)
      UNION SELECT s.key FROM {s} AS s WHERE s.lock_id = ANY (p_lock_ids)) AS y) AS x ORDER BY hashtext(x.k), x.k);
  v_locked := array_fill(false, ARRAY[greatest(cardinality(v_keys), 1)]);
  FOR v_j IN 1 .. cardinality(v_keys) LOOP
    v_locked[v_j] := pg_try_advisory_xact_lock(hashtext(v_keys[v_j])) OR {fn_lockwait}(v_keys[v_j], 0, v_until);
  END LOOP;
  -- The tickets in the order a release serving their keys deletes them
  -- (matters for a key not locked in time).
  PERFORM 1 FROM {q} AS x WHERE x.lock_id = ANY (p_lock_ids) ORDER BY hashtext(x.key), x.key, x.seq FOR UPDATE;
  FOR v_j IN 1 .. coalesce(cardinality(p_lock_ids), 0) LOOP
    o_idx := v_j;
    v_k := NULL;
    DELETE FROM {q} AS x WHERE x.lock_id = p_lock_ids[v_j] RETURNING x.key INTO v_k;
    o_left := v_k IS NOT NULL;
    o_released := false;
    IF NOT o_left THEN
      SELECT x.o_ok INTO v_ok FROM {fn_release4}(ARRAY[p_lock_ids[v_j]], p_channel, 1, false) AS x;
      o_released := coalesce(v_ok, false);
    END IF;
    RETURN NEXT;
  END LOOP;
  FOR v_j IN 1 .. cardinality(v_keys) LOOP
    IF v_locked[v_j] THEN
      PERFORM {fn_qserve}(v_keys[v_j], p_channel, v_until);
    END IF;
  END LOOP;
END
$fn$;
