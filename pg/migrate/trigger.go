package migrate

import (
	"context"

	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// SetupReleaseTrigger installs (or re-points) an AFTER DELETE trigger on
// the lock table that runs pg_notify(channel, pglease.HashKey(user_key))
// for every deleted row, so that releases by SyncGuard processes (which
// delete the row themselves and notify nobody) wake pglease waiters
// listening on channel at once instead of at their next poll. Use the
// channel the Managers listen on (manager.Config.NotifyChannel). pglease's
// own releases on the same channel then notify twice with the same
// payload in one transaction, which PostgreSQL delivers once.
//
// The trigger function runs as the role that ran SetupReleaseTrigger
// (SECURITY DEFINER; run it as the owner role of RolesSQL, the owner of
// the lock table and the hashKey function): every role that may delete
// lock rows, SyncGuard's included, then releases without EXECUTE on
// pglease's functions.
//
// It is idempotent and safe to run from several processes at once: one
// implicit transaction serialized with Up's advisory lock. When the
// trigger already exists with this channel it does not touch the table;
// otherwise it replaces the trigger, which briefly takes an ACCESS
// EXCLUSIVE lock on the lock table. It needs the table (Up) and ownership
// of it. The channel must match pg.Config.NotifyChannel's rule; a bad one
// is InvalidArgument before any I/O. SQL (with pg.Config.NotifyChannel
// set) has the same DDL for migration tools.
func (m *Migrator) SetupReleaseTrigger(ctx context.Context, channel string) error {
	const op = "migrate.SetupReleaseTrigger"
	if err := store.CheckChannel(op, channel); err != nil {
		return err
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if _, err := m.db.Exec(ctx, setupLock+triggerSQL(m.n, channel)); err != nil {
		return pgerr.Map(ctx, op, err)
	}
	return nil
}

// DropReleaseTrigger removes the release trigger and its function, if
// present, for a fleet that no longer has SyncGuard processes
// (idempotent; a missing lock table is not an error). It serializes with
// Up and SetupReleaseTrigger like they do.
func (m *Migrator) DropReleaseTrigger(ctx context.Context) error {
	const op = "migrate.DropReleaseTrigger"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if _, err := m.db.Exec(ctx, setupLock+dropTriggerSQL(m.n)); err != nil {
		return pgerr.Map(ctx, op, err)
	}
	return nil
}

// triggerSQL is the trigger's DDL (release_trigger.sql). The trigger
// function is created in the lock table's schema and calls the hashKey
// function by its schema-qualified name, both resolved through the setup
// session's search_path: the trigger then works from sessions
// (SyncGuard's) with any search_path. It is SECURITY DEFINER, so that a
// role allowed to DELETE lock rows but not to EXECUTE pglease's functions
// (SyncGuard's own role, next to the roles SQL's grants) can still
// release: it runs the hashKey function as the trigger function's owner,
// and nothing else. Its search_path is pinned (pg_catalog, then pg_temp),
// so a deleting session cannot put objects of its own in its way; and a
// trigger function cannot be called other than as a trigger. Row level:
// measured as cheap as a statement-level trigger with a transition table
// (see BenchmarkReleaseTrigger) and simpler.
func triggerSQL(n store.Names, channel string) string {
	return render(n, tmpl("release_trigger.sql"), "{channel}", channel)
}

func dropTriggerSQL(n store.Names) string { return render(n, tmpl("release_trigger_drop.sql")) }
