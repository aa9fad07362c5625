package migrate

import (
	"context"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// Guard installs the database guard on table (ident or schema.ident; an
// unqualified name resolves through the connection's search_path): a
// BEFORE INSERT, UPDATE and DELETE row trigger that refuses, with
// SQLSTATE PGL10 ("pglease: this transaction holds no live lease of the
// row's key"), every write of a row by a transaction that does not hold a
// live exclusive lease of the row's key, the value of keyColumn (as text,
// the lease key in NFC). A transaction holds one when it guarded the lease
// first ((*manager.Lock).Guard, which adds the lease's lockId to the
// transaction's pglease.lock_ids setting) and the lease is live on the
// server's clock and still that lockId's: a writer that never calls
// pglease (psql, another service), one holding another key's lease, or a
// stale holder after an expiry, a release, a revoke or a takeover is
// refused. An update that changes the key needs the leases of both keys.
// TRUNCATE, which fires no row trigger, is refused too (PGL10, by a BEFORE
// TRUNCATE statement trigger), whoever runs it: remove the guard first.
// The check locks the lease's row FOR KEY SHARE, so a takeover waits for
// the writing transaction's commit.
//
// The trigger function runs as the owner of the schema's functions
// (SECURITY DEFINER, search_path pinned, names schema-qualified): writers
// need no privilege on the lock table. Guard needs ownership of table
// (CREATE TRIGGER); it is idempotent, serialized with Up, and also
// callable from SQL: SELECT {lock}_guard('table'::regclass, 'key_column')
// (e.g. syncguard_locks_guard), {lock}_unguard('table') to remove it.
// Whoever can read the lock table can read a live lease's lockId and
// present it (set_config('pglease.lock_ids', …)): Guard keeps out
// writers that do not read the lock table; GuardStrict also keeps out
// those that do.
// Each write pays the trigger, one index lookup and a row lock on the
// lock table: about 55-70 µs per single-row autocommit UPDATE on a
// 2-core test server, +40% with fsync off and +20% with fsync on
// (BenchmarkGuardedWrite). Only exclusive leases guard
// writes; shared holds do not. A table already guarded by this lock table
// with keyColumn is left alone; another key column replaces the trigger.
// Schema version 4 must be installed (Up). Names that are not
// identifiers are InvalidArgument before any I/O; a missing table or
// column is InvalidArgument.
func (m *Migrator) Guard(ctx context.Context, table, keyColumn string) error {
	return m.guard(ctx, "migrate.Guard", table, keyColumn, false)
}

// GuardStrict installs the strict database guard on table: Guard's, except
// that a transaction passes it only with the guard proof of a lease this
// process acquired, which (*manager.Lock).Guard and pg.Store.Guard present
// (pglease.lock_proofs), never with a lockId in pglease.lock_ids. The
// lock table holds lockIds in plain text (SyncGuard's format), and the
// runtime role of roles.sql may read it: under Guard, whoever reads a live
// lease's lockId can present it and write; under GuardStrict, what the
// lock table holds does not pass. A proof is derived from a random key of
// the acquiring process (see docs/guarantees.md, P3), so a lease taken
// by another process, a SyncGuard process, or with a lockId generated
// elsewhere (store.AcquireRequest.LockID) cannot pass it; the SQL API's
// acquire ({lock}_acquire) returns its lease's proof as guard_proof, for
// SQL callers to set in pglease.lock_proofs. A role that may write the
// lock table can still take a key's lease by force (delete the row, or
// overwrite its lockId), as it can without a guard; GuardStrict keeps out
// readers, not writers of the lock table. Guard and GuardStrict replace
// each other's trigger; Unguard removes either. SQL: SELECT
// {lock}_guard('table'::regclass, 'key_column', true).
func (m *Migrator) GuardStrict(ctx context.Context, table, keyColumn string) error {
	return m.guard(ctx, "migrate.GuardStrict", table, keyColumn, true)
}

func (m *Migrator) guard(ctx context.Context, op, table, keyColumn string, strict bool) error {
	qt, err := guardedTable(op, m.n, table)
	if err != nil {
		return err
	}
	if !store.ValidIdent(keyColumn) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "keyColumn must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if _, err := m.db.Exec(ctx, "SELECT "+m.n.APIGuard+"($1::text::regclass, $2::text::name, $3::boolean)", qt, keyColumn, strict); err != nil {
		return pgerr.Map(ctx, op, err)
	}
	return nil
}

// Unguard removes the database guard Guard installed on table, if any
// (idempotent; serialized with Up). It needs ownership of table.
func (m *Migrator) Unguard(ctx context.Context, table string) error {
	const op = "migrate.Unguard"
	qt, err := guardedTable(op, m.n, table)
	if err != nil {
		return err
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if _, err := m.db.Exec(ctx, "SELECT "+m.n.APIUnguard+"($1::text::regclass)", qt); err != nil {
		return pgerr.Map(ctx, op, err)
	}
	return nil
}

// guardedTable validates a table name for Guard and Unguard and returns
// it quoted. pglease's own tables cannot be guarded.
func guardedTable(op string, n store.Names, table string) (string, error) {
	schema, ident, err := store.ParseTable(op, "table", table)
	if err != nil {
		return "", err
	}
	q := store.Quote(schema, ident)
	for _, own := range []string{n.Lock, n.Fence, n.Holders, n.Shared, n.Queue} {
		if q == own {
			return "", pgerr.New(pglease.CodeInvalidArgument, op, "pglease's own tables cannot be guarded", nil)
		}
	}
	return q, nil
}
