// Package migrations holds pglease's schema as numbered SQL migration
// files, for teams that run migrations with their own tool. The files are
// generated from pg.Migrations(pg.Config{}) and pg.DesignMigrations() (a
// test checks they match); they use SyncGuard's default table names
// (syncguard_locks, syncguard_fence_counters). For other names, print
// them with `pglease sql --lock-table … --fence-table …` or pg.Migrations.
//
// # Layout
//
// The lease schema, in this directory, in golang-migrate's layout, which
// Atlas also reads (format=golang-migrate):
//
//	0001_syncguard_tables.up.sql     0001_syncguard_tables.down.sql
//	0002_pglease_functions.up.sql    0002_pglease_functions.down.sql
//	0003_acquire_holder_expiry.up.sql  0003_acquire_holder_expiry.down.sql
//
// The same migrations for goose (one file each, -- +goose Up / Down) in
// goose/. The optional design functions (email_to_lock_id,
// generate_lock_id, acquire_cleanup_lock, release_cleanup_lock; see
// pg.DesignMigrations) are a sequence of their own in designs/ (and
// designs/goose/): give them their own migrations table.
//
//	migrate -path pg/migrations -database "$DATABASE_URL" up
//	migrate -path pg/migrations/designs -database "$DATABASE_URL&x-migrations-table=pglease_design_migrations" up
//	goose -dir pg/migrations/goose postgres "$DATABASE_URL" up
//	goose -dir pg/migrations/designs/goose -table pglease_design_migrations postgres "$DATABASE_URL" up
//	atlas migrate hash --dir "file://pg/migrations?format=golang-migrate"   # once: Atlas wants atlas.sum
//	atlas migrate apply --dir "file://pg/migrations?format=golang-migrate" --url "$DATABASE_URL"
//
// From Go, the files are in FS (golang-migrate: iofs.New(migrations.FS,
// "."); goose: goose.SetBaseFS(migrations.FS) and the directory "goose").
//
// # Rules
//
// Each file is one transaction (golang-migrate sends a file as one
// statement; goose wraps a migration in one), takes the advisory lock
// pg.Store.SetupSchema takes (so a tool and starting processes
// serialize), and records the version it leaves in the function
// pglease_schema_<hash>() (SELECT * FROM it), which pglease checks at
// start: migrate before deploying a pglease that needs a newer version.
// A database that pglease's SetupSchema set up before schema versions
// existed upgrades in place: migration 1 finds its tables, migration 2
// replaces its functions.
//
// Down never drops SyncGuard's tables, and so never loses a fence
// counter, unless the session sets pglease.drop_tables = 'on' (e.g.
// options=-c%20pglease.drop_tables%3Don in the connection URL, or
// PGOPTIONS="-c pglease.drop_tables=on" for psql). Up, down and up again
// leaves the database as after one up (tested, with the tools themselves
// in pg/migrations/tooltest).
package migrations

import "embed"

// FS holds the migration files: *.sql (golang-migrate layout), goose/,
// designs/ and designs/goose/.
//
//go:embed *.sql goose/*.sql designs/*.sql designs/goose/*.sql
var FS embed.FS

// The directories of FS.
const (
	// Dir is the lease schema in golang-migrate's layout (also Atlas's
	// format=golang-migrate).
	Dir = "."
	// GooseDir is the lease schema for goose.
	GooseDir = "goose"
	// DesignsDir is the optional design functions in golang-migrate's
	// layout.
	DesignsDir = "designs"
	// DesignsGooseDir is the optional design functions for goose.
	DesignsGooseDir = "designs/goose"
)
