package pg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// SchemaVersion is the lease schema version this pglease needs: the
// number of the last migration in Migrations. Version 0 is no pglease
// schema at all, which includes the schema SetupSchema created before
// schema versions existed (migration 1 and 2 upgrade it in place).
const SchemaVersion = 3

// Migration is one numbered step of the lease schema, rendered for a
// Config's table names. Up takes the schema from Version-1 to Version,
// Down takes it back. Each runs as one transaction (an implicit one when
// sent as a single simple-protocol statement, as SetupSchema and
// golang-migrate do; goose wraps each file in one), starts with the
// advisory lock SetupSchema takes, and records the version it leaves.
type Migration struct {
	// Version is the version Up leaves (1, 2, …).
	Version int
	// Name is the file name part: 0002_pglease_functions.up.sql has
	// Version 2 and Name "pglease_functions".
	Name string
	// Up and Down are the SQL.
	Up, Down string
}

// migrationTemplate is one entry of the lease schema's history. Append
// only: once released, an entry's SQL never changes (see
// functionsTemplate for the one exception before v0.1.0).
type migrationTemplate struct {
	name, up, down string
	// compatibleFrom is the oldest SchemaVersion whose code still works
	// on this version (its functions exist): the record lets code of that
	// version start on a newer schema during a rolling upgrade.
	compatibleFrom int
}

var migrationTemplates = []migrationTemplate{
	{name: "syncguard_tables", up: tablesTemplate, down: tablesDownTemplate + dropHashKeyIfUnused, compatibleFrom: 1},
	{name: "pglease_functions", up: functionsTemplate, down: functionsDownTemplate, compatibleFrom: 2},
	// Adds an acquire function; version 2's code still runs on it.
	{name: "acquire_holder_expiry", up: acquireTemplate, down: acquireDownTemplate, compatibleFrom: 2},
}

// functionsDownTemplate is migration 2 (down): it drops what migration 2
// created and never touches SyncGuard's tables.
const functionsDownTemplate = `DROP FUNCTION IF EXISTS {fn_acquire_v2}(text[], text[], text[], text[], bigint[], text);
DROP FUNCTION IF EXISTS {fn_release}(text[], text);
DROP FUNCTION IF EXISTS {fn_extend}(text[], bigint[]);
DROP FUNCTION IF EXISTS {fn_handoff}(text[], text[], text[], text[], text[], bigint[], text, text);
DROP TABLE IF EXISTS {h};
` + dropHashKeyIfUnused

// acquireDownTemplate is migration 3 (down): it drops version 3's acquire
// function (version 2's stays).
const acquireDownTemplate = `DROP FUNCTION IF EXISTS {fn_acquire}(text[], text[], text[], text[], bigint[], text);
`

// dropHashKeyIfUnused ends the downs of migrations 1 and 2 (a release trigger can keep the
// function alive past migration 2's down).
const dropHashKeyIfUnused = `-- The hashKey function is shared by every table pair in its schema and by
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
`

// versionSQL records version v (with its compatibleFrom) in the schema
// version function, or drops the function for version 0.
func (n names) versionSQL(v int) string {
	if v == 0 {
		return "DROP FUNCTION IF EXISTS " + n.fnSchema + "();\n"
	}
	c := migrationTemplates[v-1].compatibleFrom
	return "-- The schema version record: SELECT * FROM " + n.fnSchema + "();\n" +
		"CREATE OR REPLACE FUNCTION " + n.fnSchema + "(OUT version integer, OUT compatible_from integer)\n" +
		"LANGUAGE sql IMMUTABLE AS $fn$ SELECT " + strconv.Itoa(v) + ", " + strconv.Itoa(c) + " $fn$;\n"
}

// Migrations returns the lease schema's migrations, oldest first, with
// cfg's table names: what SetupSchema applies, what the files in package
// pg/migrations hold for the default names, and what `pglease sql`
// prints. Apply them with any tool that runs numbered up/down SQL files
// in order, each in one transaction. Bad names are InvalidArgument.
//
// Down SQL never drops SyncGuard's tables (and so never loses a fence
// counter) unless the session that runs it set pglease.drop_tables to
// 'on' (SET pglease.drop_tables = 'on', or -c pglease.drop_tables=on in
// the connection's options).
func Migrations(cfg Config) ([]Migration, error) {
	n, err := cfg.names("pg.Migrations")
	if err != nil {
		return nil, err
	}
	return n.migrations(), nil
}

func (n names) migrations() []Migration {
	out := make([]Migration, len(migrationTemplates))
	for i, t := range migrationTemplates {
		v := i + 1
		head := fmt.Sprintf("-- pglease migration %d (%s), %%s: see package github.com/pglease/pglease/pg/migrations.\n", v, t.name)
		out[i] = Migration{
			Version: v,
			Name:    t.name,
			Up:      fmt.Sprintf(head, "up") + setupLock + n.render(t.up) + n.versionSQL(v),
			Down:    fmt.Sprintf(head, "down") + setupLock + n.render(t.down) + n.versionSQL(v-1),
		}
	}
	return out
}

// SchemaError says that the database's lease schema is not the one this
// pglease needs, and how to fix it. Operations return it as the cause of
// an InvalidArgument *pglease.Error; find it with errors.As.
type SchemaError struct {
	// Found is the recorded version: 0 when there is no pglease schema
	// (none at all, or one from before schema versions).
	Found int
	// CompatibleFrom is the oldest code version the found schema serves
	// (0 when Found is 0).
	CompatibleFrom int
	// Want is the version this pglease needs (SchemaVersion).
	Want int
	// Err is the server's answer that showed the schema missing (SQLSTATE
	// 42883, the version record is undefined), if that is how it was
	// found.
	Err error
}

// Unwrap returns Err.
func (e *SchemaError) Unwrap() error { return e.Err }

const howToMigrate = "run SetupSchema or apply pg/schema.sql (or the numbered files of package pg/migrations with goose or golang-migrate, " +
	"or `pglease migrate`: go install github.com/pglease/pglease/cmd/pglease@latest)"

// Error says what was found, what is needed and what to run.
func (e *SchemaError) Error() string {
	switch {
	case e.Found == 0:
		return fmt.Sprintf("no pglease schema found (version 0; this pglease needs version %d): %s", e.Want, howToMigrate)
	case e.Found < e.Want:
		return fmt.Sprintf("pglease schema version %d found, this pglease needs version %d: %s", e.Found, e.Want, howToMigrate)
	default:
		return fmt.Sprintf("pglease schema version %d found, which serves pglease schema versions %d to %d; this pglease needs version %d: upgrade pglease (the schema is newer)",
			e.Found, e.CompatibleFrom, e.Found, e.Want)
	}
}

// serves reports whether a schema at version found (compatible from
// from) serves code that needs want.
func serves(found, from, want int) bool { return found >= want && from <= want }

// schemaErr wraps a SchemaError for op.
func schemaErr(op string, e *SchemaError) error {
	return pgerr.New(pglease.CodeInvalidArgument, op, "wrong schema version", e)
}

// readVersion reads the recorded version. It first looks the record up in
// the catalog, so a missing one is version 0 without an error (which
// would abort a caller's transaction). Two round trips.
func (s *Store) readVersion(ctx context.Context, op string) (version, from int, err error) {
	var exists bool
	err = s.run(ctx, op, false, "SELECT to_regprocedure($1) IS NOT NULL", []any{s.n.fnSchema + "()"}, func(r pgx.Rows) error {
		return r.Scan(&exists)
	})
	if err != nil || !exists {
		return 0, 0, err
	}
	err = s.run(ctx, op, false, s.versionSQL, nil, func(r pgx.Rows) error { return r.Scan(&version, &from) })
	return version, from, err
}

// SchemaVersion returns the lease schema version recorded in the
// database for the Store's tables (0: none) and the oldest code version
// it serves. Read-only; it needs no privilege beyond connecting (and
// EXECUTE on the record function, which pg/roles.sql grants).
func (s *Store) SchemaVersion(ctx context.Context) (version, compatibleFrom int, err error) {
	const op = "pg.SchemaVersion"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return 0, 0, err
	}
	return s.readVersion(ctx, op)
}

// CheckSchema returns nil when the database's lease schema serves this
// pglease (SchemaVersion), else an InvalidArgument error whose cause is a
// *SchemaError that says how to migrate. The Store also checks once by
// itself, before its first acquire.
func (s *Store) CheckSchema(ctx context.Context) error {
	const op = "pg.CheckSchema"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	v, c, err := s.readVersion(ctx, op)
	if err != nil {
		return err
	}
	if !serves(v, c, SchemaVersion) {
		return schemaErr(op, &SchemaError{Found: v, CompatibleFrom: c, Want: SchemaVersion})
	}
	s.checked.Store(true)
	return nil
}

// checkOnce is the Store's own check before its first acquire: one round
// trip (the record is called directly; a missing one is version 0) until
// a check succeeds, none after.
func (s *Store) checkOnce(ctx context.Context, op string) error {
	if s.checked.Load() {
		return nil
	}
	var v, c int
	err := s.run(ctx, op, false, s.versionSQL, nil, func(r pgx.Rows) error { return r.Scan(&v, &c) })
	var st interface{ SQLState() string }
	if errors.As(err, &st) && st.SQLState() == "42883" { // undefined_function: no record
		var cause error = st.(error)
		return schemaErr(op, &SchemaError{Want: SchemaVersion, Err: cause})
	}
	if err != nil {
		return err
	}
	if !serves(v, c, SchemaVersion) {
		return schemaErr(op, &SchemaError{Found: v, CompatibleFrom: c, Want: SchemaVersion})
	}
	s.checked.Store(true)
	return nil
}

// errConcurrent is the SQLSTATE the migration guard raises when another
// session changed the version between the read and the lock.
const errConcurrent = "PGL01"

// guardSQL fails the migration transaction (after the advisory lock) when
// the recorded version is no longer want.
func (n names) guardSQL(want int) string {
	return `DO $pglease$
DECLARE
  v integer := 0;
BEGIN
  IF to_regprocedure('` + n.fnSchema + `()') IS NOT NULL THEN
    EXECUTE 'SELECT version FROM ` + n.fnSchema + `()' INTO v;
  END IF;
  IF v IS DISTINCT FROM ` + strconv.Itoa(want) + ` THEN
    RAISE EXCEPTION 'pglease: schema version changed concurrently (now %, expected ` + strconv.Itoa(want) + `)', v USING ERRCODE = '` + errConcurrent + `';
  END IF;
END
$pglease$;
`
}

// MigrateOptions tunes Migrate.
type MigrateOptions struct {
	// DropTables lets migration 1's down drop SyncGuard's lock and fence
	// counter tables (it sets pglease.drop_tables for the transaction).
	// Without it they are kept: dropping the fence counters lets a later
	// grant reuse a fence an old holder still has.
	DropTables bool
}

// Migrate takes the lease schema to version target (0 … SchemaVersion),
// up or down, applying Migrations in order in one transaction, under
// SetupSchema's advisory lock. Going down to 0 removes everything
// pglease added; SyncGuard's tables stay unless opts.DropTables. A
// version this pglease does not know (a newer schema) cannot be migrated
// down from here: use the newer pglease. A target out of range is
// InvalidArgument before any I/O.
func (s *Store) Migrate(ctx context.Context, target int, opts MigrateOptions) error {
	const op = "pg.Migrate"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if target < 0 || target > SchemaVersion {
		return pgerr.New(pglease.CodeInvalidArgument, op, "target version out of range 0.."+strconv.Itoa(SchemaVersion), nil)
	}
	return s.migrate(ctx, op, target, opts.DropTables, false)
}

// migrate moves the schema to target. upOnly (SetupSchema) never goes
// down and accepts a newer schema that serves this version. A concurrent
// migration that changes the version between the read and the lock makes
// it read again (bounded).
func (s *Store) migrate(ctx context.Context, op string, target int, dropTables, upOnly bool) error {
	ms := s.n.migrations()
	for attempt := 0; ; attempt++ {
		v, c, err := s.readVersion(ctx, op)
		if err != nil {
			return err
		}
		if upOnly && v >= target {
			if !serves(v, c, target) {
				return schemaErr(op, &SchemaError{Found: v, CompatibleFrom: c, Want: target})
			}
			s.checked.Store(true)
			return nil
		}
		if v == target {
			s.checked.Store(target == SchemaVersion)
			return nil
		}
		if v > len(ms) {
			return pgerr.New(pglease.CodeInvalidArgument, op,
				fmt.Sprintf("schema version %d is newer than this pglease knows (%d): migrate it with the newer pglease", v, len(ms)), nil)
		}
		var b strings.Builder
		b.WriteString(setupLock)
		if dropTables {
			b.WriteString("SET LOCAL pglease.drop_tables = 'on';\n")
		}
		b.WriteString(s.n.guardSQL(v))
		if v < target {
			for _, m := range ms[v:target] {
				b.WriteString(m.Up)
			}
		} else {
			for i := v; i > target; i-- {
				b.WriteString(ms[i-1].Down)
			}
		}
		// One simple-protocol Exec (no arguments): one implicit
		// transaction for all statements.
		_, err = s.db.Exec(ctx, b.String())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == errConcurrent && attempt < 10 {
			continue
		}
		if pgerr.CatalogRace(err) && ctx.Err() == nil {
			// Someone without our advisory lock (SyncGuard's setupSchema,
			// a hand-run migration) created the same objects at the same
			// moment (issue 9.7). The transaction rolled back; again, after
			// a short jittered pause, finds them there.
			if attempt < 10 {
				select {
				case <-time.After(time.Duration(5+rand.IntN(20)) * time.Millisecond):
				case <-ctx.Done():
				}
				continue
			}
			return pgerr.New(pglease.CodeServiceUnavailable, op, pgerr.CatalogRaceMsg, pgerr.Map(ctx, op, err))
		}
		if err != nil {
			return pgerr.Map(ctx, op, err)
		}
		s.checked.Store(target == SchemaVersion)
		return nil
	}
}
