package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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
// Store's own check before its first acquire is skipped.
func (s *Store) MarkChecked() { s.checked.Store(true) }

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
		return SchemaErr(op, &SchemaError{Want: SchemaVersion, Err: cause})
	}
	if err != nil {
		return err
	}
	if !Serves(v, c, SchemaVersion) {
		return SchemaErr(op, &SchemaError{Found: v, CompatibleFrom: c, Want: SchemaVersion})
	}
	s.checked.Store(true)
	return nil
}
