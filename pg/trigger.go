package pg

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// releaseTriggerName is the name of the release trigger on the lock table
// (trigger names are per table).
const releaseTriggerName = "pglease_release_notify"

// checkChannel is the rule for notification channel names
// (Config.NotifyChannel, SetupReleaseTrigger): an unquoted identifier.
func checkChannel(op, channel string) error {
	if !identRe.MatchString(channel) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "channel must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	return nil
}

// triggerFnName is the (unquoted) name of the trigger function, which
// lives in the lock table's schema.
func (n names) triggerFnName() string {
	// "v1" is fixed: installed triggers keep their function's name.
	sum := sha256.Sum256([]byte("v1\x00" + n.lockIdent))
	return "pglease_release_notify_" + hex.EncodeToString(sum[:5])
}

// ReleaseTriggerSQL returns the DDL of SetupReleaseTrigger for cfg's lock
// table and channel, for migrations. It must run after SchemaSQL (it needs
// the table and the hashKey function). Bad names are InvalidArgument.
func ReleaseTriggerSQL(cfg Config, channel string) (string, error) {
	const op = "pg.ReleaseTriggerSQL"
	if err := checkChannel(op, channel); err != nil {
		return "", err
	}
	n, err := cfg.names(op)
	if err != nil {
		return "", err
	}
	return n.triggerSQL(channel), nil
}

func (n names) triggerSQL(channel string) string {
	// Every substituted value is a validated identifier (quoted or not):
	// none can contain a single quote or a dollar-quote tag.
	r := strings.NewReplacer("{t}", n.lock, "{fn_hash}", n.fnHash, "{fn}", n.triggerFnName(), "{trg}", releaseTriggerName, "{channel}", channel)
	return r.Replace(triggerTemplate)
}

func (n names) dropTriggerSQL() string {
	r := strings.NewReplacer("{t}", n.lock, "{fn}", n.triggerFnName(), "{trg}", releaseTriggerName)
	return r.Replace(dropTriggerTemplate)
}

// SetupReleaseTrigger installs (or re-points) an AFTER DELETE trigger on
// the lock table that runs pg_notify(channel, pglease.HashKey(user_key))
// for every deleted row, so that releases by SyncGuard processes (which
// delete the row themselves) wake pglease waiters listening on channel.
// Use the channel the Managers listen on (manager.Config.NotifyChannel).
// pglease's own releases with Config.NotifyChannel = channel then notify
// twice with the same payload in one transaction, which PostgreSQL
// delivers once.
//
// The trigger function runs as the role that ran SetupReleaseTrigger
// (SECURITY DEFINER; run it as pg/roles.sql's owner role, the owner of the
// lock table and the hashKey function): every role that may delete lock
// rows, SyncGuard's included, then releases without EXECUTE on pglease's
// functions.
//
// It is idempotent and safe to run from several processes at once: one
// implicit transaction serialized with SetupSchema's advisory lock. When
// the trigger already exists with this channel it does not touch the
// table; otherwise it replaces the trigger, which briefly takes an ACCESS
// EXCLUSIVE lock on the lock table. It needs the table (SetupSchema) and
// ownership of it. The channel must match Config.NotifyChannel's rule;
// a bad one is InvalidArgument before any I/O.
func (s *Store) SetupReleaseTrigger(ctx context.Context, channel string) error {
	const op = "pg.SetupReleaseTrigger"
	if err := checkChannel(op, channel); err != nil {
		return err
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, setupLock+s.n.triggerSQL(channel)); err != nil {
		return pgerr.Map(ctx, op, err)
	}
	return nil
}

// ReleaseTriggerInstalled reports whether the release trigger
// (SetupReleaseTrigger) is installed and enabled on the Store's lock table
// for channel. Without it, releases made by SyncGuard processes (which
// delete the row themselves) notify nobody, and pglease waiters learn of
// them only by polling. A missing lock table answers false. Read-only:
// one query on pg_trigger. The channel must match Config.NotifyChannel's
// rule; a bad one is InvalidArgument before any I/O.
func (s *Store) ReleaseTriggerInstalled(ctx context.Context, channel string) (bool, error) {
	const op = "pg.ReleaseTriggerInstalled"
	if err := checkChannel(op, channel); err != nil {
		return false, err
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return false, err
	}
	var ok bool
	err := s.run(ctx, op, false, releaseTriggerInstalledSQL, []any{s.n.lock, releaseTriggerName, channel}, func(r pgx.Rows) error {
		return r.Scan(&ok)
	})
	return ok, err
}

// releaseTriggerInstalledSQL: $1 the lock table (quoted, maybe qualified),
// $2 the trigger's name, $3 the channel. tgtype 9 = ROW | DELETE (AFTER);
// tgenabled 'D' is disabled; tgargs = the channel, NUL-terminated.
const releaseTriggerInstalledSQL = `SELECT EXISTS (SELECT 1 FROM pg_trigger t
  WHERE t.tgrelid = to_regclass($1) AND t.tgname = $2 AND t.tgtype = 9 AND t.tgenabled <> 'D'
    AND t.tgargs = convert_to($3, 'UTF8') || '\x00'::bytea)`

// DropReleaseTrigger removes the trigger and its function, if present
// (idempotent; a missing lock table is not an error). It serializes with
// SetupSchema and SetupReleaseTrigger like they do.
func (s *Store) DropReleaseTrigger(ctx context.Context) error {
	const op = "pg.DropReleaseTrigger"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, setupLock+s.n.dropTriggerSQL()); err != nil {
		return pgerr.Map(ctx, op, err)
	}
	return nil
}

// The trigger function is created in the lock table's schema and calls
// the hashKey function by its schema-qualified name, both resolved here
// through the setup session's search_path: the trigger then works from
// sessions (SyncGuard's) with any search_path. It is SECURITY DEFINER, so
// that a role allowed to DELETE lock rows but not to EXECUTE pglease's
// functions (SyncGuard's own role, next to pg/roles.sql's grants) can
// still release: it runs the hashKey function as the trigger function's
// owner, and nothing else. Its search_path is pinned (pg_catalog, then
// pg_temp), so a deleting session cannot put objects of its own in its
// way; and a trigger function cannot be called other than as a trigger.
// Row level: measured as cheap as a statement-level trigger with a
// transition table (see BenchmarkReleaseTrigger) and simpler.
const triggerTemplate = `-- pglease release trigger: deleting a lock row notifies hashKey(user_key).
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
  v_fn := format('%I.%I', v_schema, '{fn}');
  EXECUTE format($f$CREATE OR REPLACE FUNCTION %s() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  PERFORM pg_notify(TG_ARGV[0], %s(OLD.user_key));
  RETURN NULL;
END
$fn$$f$, v_fn, v_hash);
  v_fnoid := to_regprocedure(v_fn || '()');
  -- tgtype 9 = ROW | DELETE (AFTER); tgargs = the channel, NUL-terminated.
  IF NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = v_rel AND t.tgname = '{trg}'
      AND t.tgfoid = v_fnoid AND t.tgtype = 9 AND t.tgenabled = 'O'
      AND t.tgargs = convert_to('{channel}', 'UTF8') || '\x00'::bytea) THEN
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', '{trg}', v_rel);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%L)', '{trg}', v_rel, v_fn, '{channel}');
  END IF;
END
$do$;
`

const dropTriggerTemplate = `DO $do$
DECLARE
  v_rel regclass := to_regclass('{t}');
  v_schema text;
BEGIN
  IF v_rel IS NULL THEN
    RETURN;
  END IF;
  SELECT n.nspname INTO v_schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = v_rel;
  IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = v_rel AND t.tgname = '{trg}') THEN
    EXECUTE format('DROP TRIGGER %I ON %s', '{trg}', v_rel);
  END IF;
  EXECUTE format('DROP FUNCTION IF EXISTS %I.%I()', v_schema, '{fn}');
END
$do$;
`
