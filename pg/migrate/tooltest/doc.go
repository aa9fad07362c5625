// Package tooltest applies pglease's migration files (migrate.SQL, the
// files of pg/migrate/sql) with the migration tools themselves, goose and
// golang-migrate, against a real PostgreSQL. It is a module of its own so
// that the tools stay out of pglease's go.mod; `make test` runs it.
package tooltest
