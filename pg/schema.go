package pg

import (
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed" // for schema.sql
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Default table names, SyncGuard's.
const (
	DefaultLockTable  = "syncguard_locks"
	DefaultFenceTable = "syncguard_fence_counters"
)

// fnVersion and acquireVersion are part of the server functions' names
// (their hash input): functions with a new body or signature get new
// names, so code of one schema version never calls another version's
// functions. fnVersion names the release, extend and handoff functions
// (schema version 2), acquireVersion the acquire function (schema version
// 3; version 2's stays, named with fnVersion). See functionsTemplate for
// when to change them.
const (
	fnVersion      = "v2"
	acquireVersion = "v3"
)

// SchemaFile is SchemaSQL(Config{}) (default table names): every
// migration's up SQL in order, as one file, pg/schema.sql, for users who
// apply the whole schema at once. A test checks that it matches
// SchemaSQL. The numbered migrations are in package pg/migrations.
//
//go:embed schema.sql
var SchemaFile string

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// names holds everything derived from a validated Config.
type names struct {
	lock, fence       string // quoted, possibly schema-qualified
	lockSchema        string // "" when unqualified
	lockIdent         string // unquoted table identifier
	holders           string // quoted holder identity table, in the lock table's schema
	idxLockID, idxExp string // quoted index names (unqualified: indexes live in the table's schema)
	fnAcquire         string // quoted, qualified like the lock table
	fnAcquireV2       string // schema version 2's acquire function, kept for version 2's code
	fnRelease         string
	fnExtend          string
	fnHandOff         string
	fnHash            string
	fnSchema          string // the schema version record (migrations.go)
	// v0's functions (SetupSchema before schema versions), dropped by
	// migration 2.
	fnAcquireV0, fnReleaseV0, fnExtendV0 string
}

func parseTable(op, what, s string) (schema, ident string, err error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return "", "", pgerr.New(pglease.CodeInvalidArgument, op, what+" must be ident or schema.ident", nil)
	}
	for _, p := range parts {
		if !identRe.MatchString(p) {
			return "", "", pgerr.New(pglease.CodeInvalidArgument, op, what+" must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$ (optionally schema-qualified)", nil)
		}
	}
	if len(parts) == 2 {
		return parts[0], parts[1], nil
	}
	return "", parts[0], nil
}

func quote(schema, ident string) string {
	if schema == "" {
		return pgx.Identifier{ident}.Sanitize()
	}
	return pgx.Identifier{schema, ident}.Sanitize()
}

// indexName is SyncGuard's idx_{table}_{suffix}, shortened so that it fits
// PostgreSQL's 63-byte identifiers without the two names colliding (the
// server would truncate both to the same 63 bytes).
func indexName(ident, suffix string) string {
	tail := "_" + suffix
	if len("idx_")+len(ident)+len(tail) > 63 {
		ident = ident[:63-len("idx_")-len(tail)]
	}
	return pgx.Identifier{"idx_" + ident + tail}.Sanitize()
}

func (c Config) names(op string) (names, error) {
	lock := cmp.Or(c.LockTable, DefaultLockTable)
	fence := cmp.Or(c.FenceTable, DefaultFenceTable)
	ls, li, err := parseTable(op, "LockTable", lock)
	if err != nil {
		return names{}, err
	}
	fs, fi, err := parseTable(op, "FenceTable", fence)
	if err != nil {
		return names{}, err
	}
	if maySame(ls, li, fs, fi) {
		// An unqualified name is resolved by the search_path, so "t" and
		// "public.t" may well be the same table (issue 9.11).
		return names{}, pgerr.New(pglease.CodeInvalidArgument, op, fmt.Sprintf(
			"LockTable %q and FenceTable %q may name the same table (an unqualified name is resolved by search_path): qualify both with their schema, or give them different names", lock, fence), nil)
	}
	if maySame(ls, holdersName(li), fs, fi) {
		return names{}, pgerr.New(pglease.CodeInvalidArgument, op, fmt.Sprintf(
			"FenceTable %q may be the lock table's holder table %q: give it another name", fence, holdersName(li)), nil)
	}
	if c.NotifyChannel != "" {
		if err := checkChannel(op, c.NotifyChannel); err != nil {
			return names{}, err
		}
	}
	n := names{
		lock: quote(ls, li), fence: quote(fs, fi), lockSchema: ls, lockIdent: li,
		idxLockID: indexName(li, "lock_id"), idxExp: indexName(li, "expires"),
		holders: quote(ls, holdersName(li)),
	}
	h := func(version string) string {
		sum := sha256.Sum256([]byte(version + "\x00" + n.lock + "\x00" + n.fence))
		return hex.EncodeToString(sum[:5])
	}
	cur, v0 := h(fnVersion), h("v1")
	n.fnAcquire = quote(ls, "pglease_acquire_"+h(acquireVersion))
	n.fnAcquireV2 = quote(ls, "pglease_acquire_"+cur)
	n.fnRelease = quote(ls, "pglease_release_"+cur)
	n.fnExtend = quote(ls, "pglease_extend_"+cur)
	n.fnHandOff = quote(ls, "pglease_handoff_"+cur)
	n.fnAcquireV0 = quote(ls, "pglease_acquire_"+v0)
	n.fnReleaseV0 = quote(ls, "pglease_release_"+v0)
	n.fnExtendV0 = quote(ls, "pglease_extend_"+v0)
	// One per schema, shared by every table pair in it (and by release
	// triggers): its body never changes, so neither does its name.
	n.fnHash = quote(ls, "pglease_hashkey_v1")
	n.fnSchema = quote(ls, "pglease_schema_"+h("schema"))
	return n, nil
}

// maySame reports whether schema-qualified-or-not names s1.i1 and s2.i2
// may resolve to the same table: the same identifier, and the same schema
// or at least one of them unqualified (resolved by search_path).
func maySame(s1, i1, s2, i2 string) bool {
	return i1 == i2 && (s1 == s2 || s1 == "" || s2 == "")
}

// holdersName is the holder identity table of lock table ident:
// ident_holders, or, when that would not fit PostgreSQL's 63 bytes, a
// prefix of ident and a hash of it.
func holdersName(ident string) string {
	const suffix = "_holders"
	if len(ident)+len(suffix) <= 63 {
		return ident + suffix
	}
	sum := sha256.Sum256([]byte(ident))
	tail := "_" + hex.EncodeToString(sum[:4]) + suffix
	return ident[:63-len(tail)] + tail
}

// SchemaSQL returns the DDL that takes an empty database (or one with
// SyncGuard's tables) to the current schema version for cfg: every
// migration's up SQL in order (see Migrations). Its table statements are
// IF NOT EXISTS, so it runs against tables SyncGuard created. Bad names
// are InvalidArgument.
func SchemaSQL(cfg Config) (string, error) {
	ms, err := Migrations(cfg)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, m := range ms {
		b.WriteString(m.Up)
	}
	return b.String(), nil
}

func (n names) render(tmpl string) string {
	r := strings.NewReplacer(
		"{t}", n.lock, "{f}", n.fence, "{h}", n.holders, "{idx_lock_id}", n.idxLockID, "{idx_expires}", n.idxExp,
		"{fn_acquire}", n.fnAcquire, "{fn_release}", n.fnRelease, "{fn_extend}", n.fnExtend, "{fn_handoff}", n.fnHandOff, "{fn_hash}", n.fnHash,
		"{fn_schema}", n.fnSchema, "{fn_acquire_v0}", n.fnAcquireV0, "{fn_release_v0}", n.fnReleaseV0, "{fn_acquire_v2}", n.fnAcquireV2,
		"{fn_extend_v0}", n.fnExtendV0,
	)
	return r.Replace(tmpl)
}

// setupLock serializes SetupSchema, Migrate, the migration files and
// SetupReleaseTrigger (CREATE … IF NOT EXISTS and CREATE OR REPLACE
// FUNCTION race on the catalogs otherwise). Every migration starts with
// it, so a migration tool and SetupSchema in a starting process also
// serialize.
const setupLock = "SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));\n"

// SetupSchema brings the schema to the version this pglease needs
// (SchemaVersion), applying the missing migrations (see Migrations) up
// from the recorded version: on an empty database it creates SyncGuard's
// tables (if missing) and pglease's functions; on a current one it only
// reads the version. It never goes down: a newer schema that still
// serves this version is left alone, one that does not is an error
// (*SchemaError). It is idempotent and safe to run from several
// processes at once: the DDL runs as one implicit transaction that first
// takes a transaction-level advisory lock and checks that the version is
// still the one read. It needs CREATE on the schema; production
// deployments may apply the migrations (package pg/migrations) with an
// owner role instead.
func (s *Store) SetupSchema(ctx context.Context) error {
	const op = "pg.SetupSchema"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	return s.migrate(ctx, op, SchemaVersion, false, true)
}

// tablesTemplate is migration 1 (up): SyncGuard 2.5.2's tables, byte for
// byte (IF NOT EXISTS: SyncGuard may have created them), and the schema
// version record.
const tablesTemplate = `-- SyncGuard 2.5.2's tables (byte-compatible; IF NOT EXISTS: SyncGuard may have created them).
CREATE TABLE IF NOT EXISTS {t} (
  key TEXT PRIMARY KEY,
  lock_id TEXT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  acquired_at_ms BIGINT NOT NULL,
  fence TEXT NOT NULL,
  user_key TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS {idx_lock_id} ON {t} (lock_id);
CREATE INDEX IF NOT EXISTS {idx_expires} ON {t} (expires_at_ms);
CREATE TABLE IF NOT EXISTS {f} (
  fence_key TEXT PRIMARY KEY,
  fence BIGINT NOT NULL DEFAULT 0,
  key_debug TEXT
);
`

// tablesDownTemplate is migration 1 (down). It keeps the tables (SyncGuard
// may use them, and the fence counters must never be lost by accident)
// unless the session setting pglease.drop_tables is 'on'.
const tablesDownTemplate = `-- Keep SyncGuard's tables and fence counters unless asked explicitly:
-- SET pglease.drop_tables = 'on' (or options=-c pglease.drop_tables=on in the connection string).
DO $pglease$
BEGIN
  IF coalesce(current_setting('pglease.drop_tables', true), '') = 'on' THEN
    DROP TABLE IF EXISTS {t};
    DROP TABLE IF EXISTS {f};
  ELSE
    RAISE NOTICE 'pglease: kept the lock and fence counter tables (set pglease.drop_tables = on to drop them)';
  END IF;
END
$pglease$;
`

// functionsTemplate is migration 2 (up): pglease's server functions and
// the holder identity table.
//
// Changing a function body: pglease v0.1.0 is unreleased, so until its
// release a body change is one edit here, followed by
//
//	go test ./pg/... -run 'TestSchemaFile|TestFilesUpToDate' -update
//
// which rewrites pg/schema.sql and the files in pg/migrations (tests fail
// until they match). After a release, databases at version 2 would not
// see the edit: copy the changed functions into a new migration (a new
// entry in migrationTemplates), give them a new version in their names
// (as acquireVersion did for migration 3) so that they sit next to the
// old ones (old processes keep working during a rolling upgrade), bump
// SchemaVersion, and drop the old functions in a later migration.
const functionsTemplate = `CREATE TABLE IF NOT EXISTS {h} (
  key TEXT PRIMARY KEY,
  lock_id TEXT NOT NULL,
  holder TEXT NOT NULL
);
-- Superseded by the functions below: v0's (SetupSchema before schema versions).
DROP FUNCTION IF EXISTS {fn_acquire_v0}(text[], text[], text[], text[], bigint[]);
DROP FUNCTION IF EXISTS {fn_release_v0}(text[], text);
DROP FUNCTION IF EXISTS {fn_extend_v0}(text[], bigint[]);

-- SyncGuard's hashKey (3 x uint32 polynomial over UTF-16 code units) of an
-- NFC string; needs a UTF8 database. Used for release notifications.
CREATE OR REPLACE FUNCTION {fn_hash}(p text) RETURNS text
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
CREATE OR REPLACE FUNCTION {fn_acquire_v2}(p_keys text[], p_user_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_holder text)
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
    SELECT l.expires_at_ms INTO v_exp FROM {t} AS l WHERE l.key = r.k FOR UPDATE;
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF v_exp IS NOT NULL AND v_exp + 1000 > v_now THEN
      o_status := 1;
      RETURN NEXT;
      CONTINUE;
    END IF;
    v_fence := NULL;
    INSERT INTO {f} AS c (fence_key, fence, key_debug) VALUES (r.fk, 1, r.uk)
      ON CONFLICT (fence_key) DO UPDATE SET fence = c.fence + 1 WHERE c.fence < 900000000000000
      RETURNING c.fence INTO v_fence;
    IF v_fence IS NULL THEN
      o_status := 2;
      RETURN NEXT;
      CONTINUE;
    END IF;
    INSERT INTO {t} AS l (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
      VALUES (r.k, r.id, v_now + r.ttl, v_now, lpad(v_fence::text, 15, '0'), r.uk)
      ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
        acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key;
    -- Holder identity, tied to this grant's lockId: a row left behind
    -- (release keeps it: the next grant's upsert is then a cheap HOT
    -- update, measured in BenchmarkHolderCost) or when SyncGuard (which
    -- never writes here) takes the key over names another lockId and is
    -- not shown. One row per key, like the fence counters.
    IF p_holder IS NOT NULL THEN
      INSERT INTO {h} AS h (key, lock_id, holder) VALUES (r.k, r.id, p_holder)
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
CREATE OR REPLACE FUNCTION {fn_release}(p_lock_ids text[], p_channel text)
RETURNS TABLE (o_idx integer, o_ok boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_now bigint;
  v_uk text;
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  PERFORM 1 FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids) ORDER BY hashtext(l.key), l.key FOR UPDATE;
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  FOR r IN SELECT u.id, u.i::integer AS i FROM unnest(p_lock_ids) WITH ORDINALITY AS u(id, i) ORDER BY u.i LOOP
    o_idx := r.i;
    v_uk := NULL;
    DELETE FROM {t} AS l WHERE l.lock_id = r.id AND l.expires_at_ms > v_now RETURNING l.user_key INTO v_uk;
    o_ok := v_uk IS NOT NULL;
    IF o_ok AND p_channel IS NOT NULL THEN
      PERFORM pg_notify(p_channel, {fn_hash}(v_uk));
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
CREATE OR REPLACE FUNCTION {fn_extend}(p_lock_ids text[], p_ttls bigint[])
RETURNS TABLE (o_idx integer, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  v_now bigint;
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  PERFORM 1 FROM {t} AS l WHERE l.lock_id = ANY (p_lock_ids) ORDER BY hashtext(l.key), l.key FOR UPDATE;
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  FOR r IN SELECT u.id, u.ttl, u.i::integer AS i FROM unnest(p_lock_ids, p_ttls) WITH ORDINALITY AS u(id, ttl, i) ORDER BY u.i LOOP
    o_idx := r.i;
    o_expires_ms := NULL;
    UPDATE {t} AS l SET expires_at_ms = v_now + r.ttl WHERE l.lock_id = r.id AND l.expires_at_ms > v_now
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
CREATE OR REPLACE FUNCTION {fn_handoff}(p_old_ids text[], p_keys text[], p_user_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_holder text, p_channel text)
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
    SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = r.k FOR UPDATE;
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    o_released := v_id IS NOT NULL AND v_id = r.old AND v_exp > v_now;
    IF NOT o_released AND v_exp IS NOT NULL AND v_exp + 1000 > v_now THEN
      o_status := 1;
      RETURN NEXT;
      CONTINUE;
    END IF;
    v_fence := NULL;
    INSERT INTO {f} AS c (fence_key, fence, key_debug) VALUES (r.fk, 1, r.uk)
      ON CONFLICT (fence_key) DO UPDATE SET fence = c.fence + 1 WHERE c.fence < 900000000000000
      RETURNING c.fence INTO v_fence;
    IF v_fence IS NULL THEN
      IF o_released THEN
        DELETE FROM {t} AS l WHERE l.key = r.k;
        IF p_channel IS NOT NULL THEN
          PERFORM pg_notify(p_channel, {fn_hash}(r.uk));
        END IF;
      END IF;
      o_status := 2;
      RETURN NEXT;
      CONTINUE;
    END IF;
    INSERT INTO {t} AS l (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
      VALUES (r.k, r.id, v_now + r.ttl, v_now, lpad(v_fence::text, 15, '0'), r.uk)
      ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
        acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key;
    IF p_holder IS NOT NULL THEN
      INSERT INTO {h} AS h (key, lock_id, holder) VALUES (r.k, r.id, p_holder)
        ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, holder = EXCLUDED.holder;
    END IF;
    o_status := 0; o_fence := v_fence; o_acquired_ms := v_now; o_expires_ms := v_now + r.ttl;
    RETURN NEXT;
  END LOOP;
END
$fn$;
`

// acquireTemplate is migration 3 (up): an acquire function whose "locked"
// answer also says until when and by whom the key is held, so that a
// waiter can try again right when the key can be taken over instead of at
// its next poll, and can say who held the key when it gives up. Version
// 2's acquire function stays, for version 2's code during a rolling
// upgrade.
const acquireTemplate = `-- The acquire function of schema version 3. As version 2's, plus: every row
-- has the server clock the key was checked at (o_now_ms); a "locked" row
-- (status 1) has the holder's expires_at_ms (o_expires_ms: the key can be
-- taken from o_expires_ms + 1000 unless the holder extends it) and the
-- holder identity recorded for the holder's lockId (o_holder; NULL when
-- none was, e.g. a SyncGuard holder). Status: 0 acquired, 1 locked,
-- 2 fence overflow.
CREATE OR REPLACE FUNCTION {fn_acquire}(p_keys text[], p_user_keys text[], p_fence_keys text[], p_lock_ids text[], p_ttls bigint[], p_holder text)
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
    SELECT l.expires_at_ms, l.lock_id INTO v_exp, v_id FROM {t} AS l WHERE l.key = r.k FOR UPDATE;
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    o_now_ms := v_now;
    IF v_exp IS NOT NULL AND v_exp + 1000 > v_now THEN
      o_status := 1;
      o_expires_ms := v_exp;
      SELECT h.holder INTO o_holder FROM {h} AS h WHERE h.key = r.k AND h.lock_id = v_id;
      RETURN NEXT;
      CONTINUE;
    END IF;
    v_fence := NULL;
    INSERT INTO {f} AS c (fence_key, fence, key_debug) VALUES (r.fk, 1, r.uk)
      ON CONFLICT (fence_key) DO UPDATE SET fence = c.fence + 1 WHERE c.fence < 900000000000000
      RETURNING c.fence INTO v_fence;
    IF v_fence IS NULL THEN
      o_status := 2;
      RETURN NEXT;
      CONTINUE;
    END IF;
    INSERT INTO {t} AS l (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
      VALUES (r.k, r.id, v_now + r.ttl, v_now, lpad(v_fence::text, 15, '0'), r.uk)
      ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
        acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key;
    -- Holder identity, tied to this grant's lockId (see version 2's).
    IF p_holder IS NOT NULL THEN
      INSERT INTO {h} AS h (key, lock_id, holder) VALUES (r.k, r.id, p_holder)
        ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, holder = EXCLUDED.holder;
    END IF;
    o_status := 0; o_fence := v_fence; o_acquired_ms := v_now; o_expires_ms := v_now + r.ttl;
    RETURN NEXT;
  END LOOP;
END
$fn$;
`
