// Package migrate manages pglease's lease schema: SyncGuard's two tables
// (created if missing, never changed), pglease's server functions next to
// them, a holder identity table, and a record of the schema version. It
// is the one place the schema's SQL comes from, whichever way it is
// applied:
//
//   - from the program: a Migrator's Up (manager.Manager.SetupSchema calls
//     it), To for a given version, up or down;
//   - by a deployment's migration tool or by hand: SQL returns the same
//     migrations as files (golang-migrate, Atlas and goose layouts, and
//     one schema.sql), also checked in under pg/migrate/sql for the
//     default table names, and printed by `pglease sql` for any;
//   - checked at start: Check and Version, and the check a pg.Store or a
//     Manager makes before its first acquire, which fails with a
//     *SchemaError that says how to migrate.
//
// The lease schema is versioned (Latest): each migration runs as one
// transaction under one advisory lock and records the version it leaves,
// so that processes, tools and SyncGuard's own setup may run at the same
// time, and code of an older version keeps running on a newer schema that
// still serves it during a rolling upgrade. Down migrations never drop
// SyncGuard's tables (and so never lose a fence counter) unless asked
// explicitly (see To).
//
// Version 4 adds, next to the lock table (names derived from its name,
// {lock} below, e.g. syncguard_locks): the table of shared holds
// ({lock}_shared: readers and semaphore permits); the fair queue's
// tickets ({lock}_queue: one per waiting caller, in arrival order; see
// docs/fairness.md); the SQL API for SQL
// callers next to pglease processes, {lock}_acquire(key, ttl_ms),
// {lock}_release(lock_id), {lock}_extend(lock_id, ttl_ms),
// {lock}_status(key), {lock}_revoke(key, delay_ms, hold) and
// {lock}_request_release(key, hold), and the views
// {lock}_leases (no lockIds), {lock}_waiters and pglease_advisory_locks;
// and the database guard (Guard), which refuses writes to a user table
// by transactions that hold no live lease of the row's key.
//
// It also holds the optional parts: RolesSQL, the grants of an owner role
// that migrates and a least-privilege runtime role; the release trigger
// (SetupReleaseTrigger) that makes releases by SyncGuard processes wake
// pglease waiters; the database guard (Guard, Unguard); and the SQL
// functions of the email-keyed cleanup lock design (in SQL, designs/),
// equal to pg/advisory's key derivations.
//
// The SQL sources are the .sql files in templates/, with {placeholders}
// for the names a pg.Config derives.
package migrate
