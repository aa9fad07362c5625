package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// SchemaVersion is the lease schema version this code needs: the number
// of the last migration of package pg/migrate (migrate.Latest, which a
// test keeps equal). Version 0 is no pglease schema at all, which
// includes the schema SetupSchema created before schema versions existed.
const SchemaVersion = 4

// SchemaError says that the database's lease schema is not the one this
// pglease needs. It is the cause of the InvalidArgument error the schema
// check returns; users find it as a *migrate.SchemaError (see As).
type SchemaError struct {
	// Found is the recorded version: 0 when there is no pglease schema.
	Found int
	// CompatibleFrom is the oldest code version the found schema serves
	// (0 when Found is 0).
	CompatibleFrom int
	// Want is the version this pglease needs.
	Want int
	// Err is the server's answer that showed the schema missing (SQLSTATE
	// 42883, the version record is undefined), if that is how it was
	// found.
	Err error
}

// Unwrap returns Err.
func (e *SchemaError) Unwrap() error { return e.Err }

// HowToMigrate is what a SchemaError tells the operator to run.
const HowToMigrate = "run SetupSchema (migrate.Migrator.Up) or apply pg/migrate/sql/schema.sql (or the numbered files of pg/migrate/sql with goose or golang-migrate, " +
	"or `pglease migrate`: go install github.com/pglease/pglease/cmd/pglease@latest)"

// Error says what was found, what is needed and what to run.
func (e *SchemaError) Error() string {
	switch {
	case e.Found == 0:
		return fmt.Sprintf("no pglease schema found (version 0; this pglease needs version %d): %s", e.Want, HowToMigrate)
	case e.Found < e.Want:
		return fmt.Sprintf("pglease schema version %d found, this pglease needs version %d: %s", e.Found, e.Want, HowToMigrate)
	default:
		return fmt.Sprintf("pglease schema version %d found, which serves pglease schema versions %d to %d; this pglease needs version %d: upgrade pglease (the schema is newer)",
			e.Found, e.CompatibleFrom, e.Found, e.Want)
	}
}

// AsPublic, set once by package pg/migrate when it is initialized, fills
// target when it points to a *migrate.SchemaError. It is how errors.As
// finds the public type in an error chain that holds this one: the store
// cannot import pg/migrate (which imports pg, which imports the store),
// and a program that names migrate.SchemaError imports pg/migrate, so the
// hook is set whenever someone asks.
var AsPublic func(e *SchemaError, target any) bool

// Setup, set once by package pg/migrate when it is initialized, is what
// sets a lease schema up, for code below pg/migrate that must: the test
// harness (internal/pgtest), which the tests of the lease packages import
// and which therefore cannot import pg/migrate (that would run up the
// package layers). Install migrates the tables cfg names on db to
// SchemaVersion (migrate.New(db, pg.Config(cfg)).Up); RolesSQL is
// migrate.RolesSQL. Every program that links pg/migrate has them (a
// Manager's user, and the tests of the store, pg, pg/migrate, the
// Manager and the CLI); they are nil in one that does not.
var Setup struct {
	Install  func(ctx context.Context, db DB, cfg Config) error
	RolesSQL func(owner, runtime, schema, database string) (beforeSchema, afterSchema string, err error)
}

// As lets errors.As find e as a *migrate.SchemaError (see AsPublic).
func (e *SchemaError) As(target any) bool {
	return AsPublic != nil && AsPublic(e, target)
}

// Serves reports whether a schema at version found (compatible from
// from) serves code that needs want.
func Serves(found, from, want int) bool { return found >= want && from <= want }

// SchemaErr wraps a SchemaError for op.
func SchemaErr(op string, e *SchemaError) error {
	return pgerr.New(pglease.CodeInvalidArgument, op, "wrong schema version", e)
}

// ReadVersion reads the recorded schema version and the oldest code
// version it serves. It first looks the record up in the catalog, so a
// missing one is version 0 without an error (which would abort a
// caller's transaction). Read-only; two round trips; it needs no
// privilege beyond connecting (and EXECUTE on the record function, which
// the roles SQL grants).
func (s *Store) ReadVersion(ctx context.Context, op string) (version, from int, err error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return 0, 0, err
	}
	var exists bool
	err = s.run(ctx, op, false, "SELECT to_regprocedure($1) IS NOT NULL", []any{s.n.FnSchema + "()"}, func(r pgx.Rows) error {
		return r.Scan(&exists)
	})
	if err != nil || !exists {
		return 0, 0, err
	}
	err = s.run(ctx, op, false, s.versionSQL, nil, func(r pgx.Rows) error { return r.Scan(&version, &from) })
	return version, from, err
}

// MarkChecked records that the schema is known to serve this code (a
// migration to SchemaVersion or a successful check just said so), so the
// Store's own check before its first acquire is skipped, as are those of
// later Stores on the same target (see checkedTargets).
func (s *Store) MarkChecked() {
	s.checked.Store(true)
	if t := s.target(); t != "" {
		checkedTargets.Store(t, struct{}{})
	}
}

// ForgetChecked drops what this process remembers of the schema checks of
// s's target: a migration that moves the schema calls it, so that Stores
// built on the target afterwards check again.
func (s *Store) ForgetChecked() {
	if t := s.target(); t != "" {
		checkedTargets.Delete(t)
	}
}

// checkedTargets holds the targets (target) whose schema a Store of this
// process found to serve this code. A Store on a transaction or a
// connection is often built per transaction (pg.New on the caller's
// pgx.Tx): without this, each would spend a round trip on its own check.
// A Store on a pool checks once for its life, as before (and records its
// target here). A schema moves back only by a migration, which
// pg/migrate's forgets the target for.
var checkedTargets sync.Map // string -> struct{}

// target names what s's schema check is about: the server, database,
// user and run-time parameters (search_path among them) s's DB connects
// with, and the schema record function's name. "" when the DB does not
// say (a DB of another type than pgx's): such a Store checks for itself.
// It holds no password and is never printed.
func (s *Store) target() string {
	var cc *pgx.ConnConfig
	switch d := s.db.(type) {
	case *pgxpool.Pool:
		cc = d.Config().ConnConfig
	case *pgx.Conn:
		cc = d.Config()
	case interface{ Conn() *pgx.Conn }: // pgx.Tx, *pgxpool.Conn
		if c := d.Conn(); c != nil {
			cc = c.Config()
		}
	}
	if cc == nil {
		return ""
	}
	var b strings.Builder
	add := func(v string) { b.WriteString(strconv.Quote(v)); b.WriteByte(' ') }
	add(s.n.FnSchema)
	add(cc.Database)
	add(cc.User)
	add(cc.Host)
	add(strconv.Itoa(int(cc.Port)))
	for _, f := range cc.Fallbacks {
		add(f.Host)
		add(strconv.Itoa(int(f.Port)))
	}
	params := make([]string, 0, len(cc.RuntimeParams))
	for k := range cc.RuntimeParams {
		params = append(params, k)
	}
	slices.Sort(params)
	for _, k := range params {
		add(k)
		add(cc.RuntimeParams[k])
	}
	return b.String()
}

// checkOnce is the Store's own check before its first acquire: one round
// trip (the record is called directly; a missing one is version 0) until
// a check of its target succeeds in this process, none after.
func (s *Store) checkOnce(ctx context.Context, op string) error {
	if s.checked.Load() {
		return nil
	}
	t := s.target()
	// A Store on a pool checks for itself, once for its life; one on a
	// transaction or connection, usually built per transaction, trusts
	// an earlier check of its target.
	if _, pool := s.db.(*pgxpool.Pool); t != "" && !pool {
		if _, ok := checkedTargets.Load(t); ok {
			s.checked.Store(true)
			return nil
		}
	}
	var v, c int
	err := s.run(ctx, op, false, s.versionSQL, nil, func(r pgx.Rows) error { return r.Scan(&v, &c) })
	var st interface{ SQLState() string }
	if errors.As(err, &st) && st.SQLState() == "42883" { // undefined_function: no record
		var cause error = st.(error)
		return SchemaErr(op, &SchemaError{Want: SchemaVersion, Err: cause})
	}
	if err != nil {
		return err
	}
	if !Serves(v, c, SchemaVersion) {
		return SchemaErr(op, &SchemaError{Found: v, CompatibleFrom: c, Want: SchemaVersion})
	}
	s.checked.Store(true)
	if t != "" {
		checkedTargets.Store(t, struct{}{})
	}
	return nil
}
