package migrate

import (
	"embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/pglease/pglease/internal/store"
)

// templates holds the SQL sources, with {placeholders} for the names a
// Config derives (see render). The migrations are the numbered files
// NNNN_name.up.sql / NNNN_name.down.sql, listed in migrationTemplates.
//
//go:embed templates
var templates embed.FS

// tmpl returns a template's text; a missing file is a build mistake
// that every test catches.
func tmpl(name string) string {
	b, err := templates.ReadFile("templates/" + name)
	if err != nil {
		panic("pglease: migrate: " + err.Error())
	}
	return string(b)
}

// migrationTemplate is one entry of the lease schema's history. Append
// only: once released, an entry's SQL never changes.
//
// Changing a function body: pglease v0.1.0 is unreleased, so until its
// release a body change is one edit of its template, followed by
//
//	go test ./pg/migrate -run TestSQLFiles -update
//
// which rewrites the files in pg/migrate/sql (the test fails until they
// match). After a release, databases at the version would not see the
// edit: copy the changed functions into a new migration (a new entry
// here and its files), give them a new version in their names (as
// internal/store's acquireVersion did for migration 3) so that they sit
// next to the old ones (old processes keep working during a rolling
// upgrade), bump Latest and store.SchemaVersion, and drop the old
// functions in a later migration.
type migrationTemplate struct {
	name string
	// compatibleFrom is the oldest version whose code still works on
	// this version (its functions exist): the record lets code of that
	// version start on a newer schema during a rolling upgrade.
	compatibleFrom int
	// dropHashKey ends the down with drop_hashkey_if_unused.sql (a
	// release trigger can keep the function alive past migration 2's
	// down).
	dropHashKey bool
}

var migrationTemplates = []migrationTemplate{
	// SyncGuard 2.5.2's tables, byte for byte (IF NOT EXISTS: SyncGuard
	// may have created them); the down keeps them (SyncGuard may use
	// them, and the fence counters must never be lost by accident)
	// unless the session setting pglease.drop_tables is 'on'.
	{name: "syncguard_tables", compatibleFrom: 1, dropHashKey: true},
	// pglease's server functions and the holder identity table; the down
	// never touches SyncGuard's tables.
	{name: "pglease_functions", compatibleFrom: 2, dropHashKey: true},
	// An acquire function whose "locked" answer also says until when and
	// by whom the key is held, so that a waiter can try again right when
	// the key can be taken over and can say who held it when it gives up.
	// Version 2's acquire function stays, for version 2's code during a
	// rolling upgrade, which still runs on it.
	{name: "acquire_holder_expiry", compatibleFrom: 2},
	// Shared holds (readers, semaphore permits), all-or-nothing sets,
	// lock delays, revocation, watch notifications, the database guard
	// and the SQL API: new acquire, release, extend and handoff functions
	// that know all of it, next to the old ones (which stay for the code
	// of versions 2 and 3 during a rolling upgrade: like SyncGuard, it
	// ignores shared holds, lock delays and revocation delays).
	{name: "shared_guard_sql_api", compatibleFrom: 2},
}

// migration is one numbered step of the lease schema, rendered for a
// Config's names. up takes the schema from version-1 to version, down
// takes it back. Each runs as one transaction (an implicit one when sent
// as a single simple-protocol statement, as Up and golang-migrate do;
// goose wraps each file in one), starts with the advisory lock Up takes,
// and records the version it leaves.
type migration struct {
	version  int
	name     string
	up, down string
}

// file is the file name part: 0002_pglease_functions.
func (m migration) file() string { return fmt.Sprintf("%04d_%s", m.version, m.name) }

// errConcurrent is the SQLSTATE the migration guard raises when another
// session changed the version between the read and the lock.
const errConcurrent = "PGL01"

// render fills a template's placeholders with n's names and extra's
// pairs. Every substituted value is a validated identifier (quoted or
// not) or a number: none can contain a single quote or a dollar-quote
// tag.
func render(n store.Names, t string, extra ...string) string {
	r := strings.NewReplacer(append([]string{
		"{t}", n.Lock, "{f}", n.Fence, "{h}", n.Holders, "{idx_lock_id}", n.IdxLockID, "{idx_expires}", n.IdxExp,
		"{fn_acquire}", n.FnAcquire, "{fn_release}", n.FnRelease, "{fn_extend}", n.FnExtend, "{fn_handoff}", n.FnHandOff, "{fn_hash}", n.FnHash,
		"{fn_schema}", n.FnSchema, "{fn_acquire_v0}", n.FnAcquireV0, "{fn_release_v0}", n.FnReleaseV0, "{fn_acquire_v2}", n.FnAcquireV2,
		"{fn_extend_v0}", n.FnExtendV0, "{fn_trigger}", n.TriggerFn, "{trigger}", store.ReleaseTriggerName,
		"{s}", n.Shared, "{idx_shared_key}", n.IdxSharedKey,
		"{fn_acquire4}", n.FnAcquire4, "{fn_acquire_shared}", n.FnAcquireShared, "{fn_acquire_sets}", n.FnAcquireSets,
		"{fn_release4}", n.FnRelease4, "{fn_extend4}", n.FnExtend4, "{fn_handoff4}", n.FnHandOff4, "{fn_handoff1}", n.FnHandOff1, "{fn_revoke}", n.FnRevoke,
		"{fn_snapshot}", n.FnSnapshot, "{fn_check}", n.FnCheck, "{fn_grant}", n.FnGrant, "{fn_notify}", n.FnNotify, "{fn_lockwait}", n.FnLockWait,
		"{q}", n.Queue, "{idx_queue_key}", n.IdxQueueKey, "{fn_qwait}", n.FnQWait, "{fn_qwait1}", n.FnQWait1, "{fn_qrelease1}", n.FnQRelease1, "{fn_qrefresh}", n.FnQRefresh, "{fn_qleave}", n.FnQLeave,
		"{fn_qrelease}", n.FnQRelease, "{fn_qserve}", n.FnQServe,
		"{fn_guard_trigger}", n.FnGuardTrigger, "{guard_trigger}", n.GuardTrigger,
		"{api_acquire}", n.APIAcquire, "{api_release}", n.APIRelease, "{api_extend}", n.APIExtend, "{api_status}", n.APIStatus,
		"{api_revoke}", n.APIRevoke, "{api_request_release}", n.APIRequestRelease, "{api_guard}", n.APIGuard, "{api_unguard}", n.APIUnguard,
		"{v_leases}", n.ViewLeases, "{v_waiters}", n.ViewWaiters, "{v_advisory}", n.ViewAdvisory,
		"{waiter_class}", strconv.Itoa(int(store.WaiterLockClass)), "{watch_class}", strconv.Itoa(int(store.WatchLockClass)),
	}, extra...)...)
	return r.Replace(t)
}

// versionSQL records version v (with its compatibleFrom) in the schema
// version function, or drops the function for version 0.
func versionSQL(n store.Names, v int) string {
	if v == 0 {
		return render(n, tmpl("version_drop.sql"))
	}
	return render(n, tmpl("version.sql"), "{version}", strconv.Itoa(v),
		"{compatible_from}", strconv.Itoa(migrationTemplates[v-1].compatibleFrom))
}

// guardSQL fails the migration transaction (after the advisory lock) when
// the recorded version is no longer want.
func guardSQL(n store.Names, want int) string {
	return render(n, tmpl("guard.sql"), "{want}", strconv.Itoa(want), "{errcode}", errConcurrent)
}

// setupLock serializes Up, To, the migration files and
// SetupReleaseTrigger (CREATE … IF NOT EXISTS and CREATE OR REPLACE
// FUNCTION race on the catalogs otherwise). Every migration starts with
// it, so a migration tool and Up in a starting process also serialize.
var setupLock = tmpl("setup_lock.sql")

// migrations returns the lease schema's migrations, oldest first, with
// n's names.
func migrations(n store.Names) []migration {
	out := make([]migration, len(migrationTemplates))
	for i, t := range migrationTemplates {
		v := i + 1
		m := migration{version: v, name: t.name}
		head := fmt.Sprintf("-- pglease migration %d (%s), %%s: see package github.com/pglease/pglease/pg/migrate.\n", v, t.name)
		down := tmpl(m.file() + ".down.sql")
		if t.dropHashKey {
			down += tmpl("drop_hashkey_if_unused.sql")
		}
		m.up = fmt.Sprintf(head, "up") + setupLock + render(n, tmpl(m.file()+".up.sql")) + versionSQL(n, v)
		m.down = fmt.Sprintf(head, "down") + setupLock + render(n, down) + versionSQL(n, v-1)
		out[i] = m
	}
	return out
}

// designs returns the optional migration with the SQL functions of the
// email-keyed cleanup lock design (../shared/reference: the
// advisory-locks cleanup design): email_to_lock_id(text),
// generate_lock_id(text, text), acquire_cleanup_lock(text) and
// release_cleanup_lock(text), with its rollback. It is a sequence of its
// own (version 1), independent of the lease schema and of any table
// names.
//
// The functions give the same lock ids as pg/advisory's Go derivations on
// the same input (SHA256Key for email_to_lock_id, NamespacedKey for
// generate_lock_id), so SQL callers and Go callers share one lock space.
// Two deliberate differences from the design's text, both for that
// equality: lower() runs under collation "C" (only A–Z are lowered, in
// every database, as in Go), and an input that Go rejects (empty after
// trimming; a namespace that is empty or contains ':') raises
// invalid_parameter_value instead of locking a meaningless id. They use
// PostgreSQL's built-in sha256() (PostgreSQL 11+), so pgcrypto is not
// needed. The notices name the lock id, never the email.
func designs() []migration {
	const name = "advisory_design_functions"
	head := "-- pglease optional migration 1 (" + name + "), %s: see package github.com/pglease/pglease/pg/migrate.\n"
	return []migration{{
		version: 1,
		name:    name,
		up:      fmt.Sprintf(head, "up") + tmpl("designs/0001_"+name+".up.sql"),
		down:    fmt.Sprintf(head, "down") + tmpl("designs/0001_"+name+".down.sql"),
	}}
}
