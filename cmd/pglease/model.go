package main

import (
	"fmt"
	"strings"
	"time"
)

// The model: one snapshot of the locks (collect reads it), the types
// status, inspect and serve show it with. Their JSON field names and
// order are what status --json and inspect --json print: scripts read
// them, so they do not change (TestJSONShape).
//
// Where the rest lives: commands.go is the table of subcommands (dispatch
// and help); collect.go and kinds.go read the snapshot; status_text.go
// (status), inspect.go (inspect's keyView) and serve.go (the page's
// serveState) are its views, each JSON view the model encoded as it is;
// release.go, schema.go and doctor.go (whose findings are its own model,
// doctorReport) are the commands that act or check.

// leaseView is one lease as status and inspect print it.
type leaseView struct {
	KeyHash         string    `json:"key_hash"`
	Key             string    `json:"key,omitempty"`
	Holder          string    `json:"holder"`
	Fence           string    `json:"fence"`
	AcquiredAt      time.Time `json:"acquired_at"`
	ExpiresAt       time.Time `json:"expires_at"`
	ExpiresInMs     int64     `json:"expires_in_ms"`
	Live            bool      `json:"live"`
	AcquiresWaiting int       `json:"acquires_waiting"`
	// ManagersWaiting counts the pglease Managers (processes) waiting
	// for the key: the holders of its waiter lock.
	ManagersWaiting int `json:"managers_waiting"`
	// ManagersWatching counts the pglease Managers watching the key (the
	// holders of its watch lock).
	ManagersWatching int `json:"managers_watching"`
	// LockDelayMs is the grant's lock delay (manager.WithLockDelay; 0:
	// none): when the lease expires unreleased, nobody takes the key
	// before its expiry + the delay.
	LockDelayMs  int64   `json:"lock_delay_ms"`
	FenceCounter *string `json:"fence_counter,omitempty"`
	// Queued counts the live tickets of the key's fair queue: callers
	// waiting in line (see snapshotView.Queue).
	Queued      int `json:"queued"`
	advisoryKey int64
}

// advisoryView is one advisory lock holder or waiter.
type advisoryView struct {
	Key          string    `json:"key"`
	Name         string    `json:"name,omitempty"`
	PID          int32     `json:"pid"`
	Granted      bool      `json:"granted"`
	Mode         string    `json:"mode"`
	Application  string    `json:"application"`
	User         string    `json:"user"`
	State        string    `json:"state,omitempty"`
	WaitingSince time.Time `json:"waiting_since,omitzero"`
	WaitingMs    int64     `json:"waiting_ms,omitempty"`
	BlockedBy    []int32   `json:"blocked_by,omitempty"`
}

// waitersView is one lease key that pglease Managers wait for: the
// holders of its waiter lock, pair:store.WaiterLockClass,hashtext(key)
// (the store's RegisterWaiters). A Manager holds it on its listening session
// while callers of its wait for the key and someone else holds it. The
// Managers watching a key (store.RegisterWatchers) hold its watch lock,
// pair:store.WatchLockClass,hashtext(key), and are listed the same way.
type waitersView struct {
	// Hashtext is the lock's second key: hashtext of the key (in NFC).
	Hashtext int32 `json:"hashtext"`
	// KeyHashes are the hashes of the lease keys with this hashtext in
	// the lock, shared-hold and holder tables: one, none when the key
	// was never held (or was just released, with no holder table), several
	// only on a hashtext collision.
	KeyHashes []string `json:"key_hashes"`
	Keys      []string `json:"keys,omitempty"` // with --show-keys
	Managers  int      `json:"managers"`
	PIDs      []int32  `json:"pids"`
	// Applications are the application_name of each of PIDs' sessions:
	// a Manager names its listening session by its holder identity
	// ("program[pid]@host" unless manager.Config.Holder or the
	// connection string says otherwise).
	Applications []string `json:"applications"`
}

func (w *waitersView) what() string {
	switch len(w.KeyHashes) {
	case 0:
		return fmt.Sprintf("key with hashtext %d (no lease row)", w.Hashtext)
	case 1:
		if len(w.Keys) == 1 {
			return "lease " + w.Keys[0]
		}
		return "lease " + w.KeyHashes[0]
	}
	ks := w.KeyHashes
	if len(w.Keys) == len(ks) {
		ks = w.Keys
	}
	return "lease " + strings.Join(ks, " or ") + " (same hashtext)"
}

// schemaView is the state of the pglease schema: what exists, what is
// missing.
type schemaView struct {
	Version int  `json:"version"`
	Needs   int  `json:"needs"`
	Current bool `json:"current"`
	// The lease tables: SyncGuard's lock and fence counter tables, and
	// pglease's holder table (schema version 2).
	LockTable   bool `json:"lock_table"`
	FenceTable  bool `json:"fence_table"`
	HolderTable bool `json:"holder_table"`
	// SharedTable: the shared-hold table (schema version 4); MarkColumns:
	// the holder table's columns for the exclusive-waiting mark and lock
	// delays (schema version 4). Without them, no shared hold, mark or
	// lock delay is shown.
	SharedTable bool `json:"shared_table"`
	MarkColumns bool `json:"mark_columns"`
	// ReleaseTrigger: the lock table has the release trigger for
	// NotifyChannel (migrate.Migrator.SetupReleaseTrigger), which makes
	// SyncGuard processes' releases wake pglease waiters.
	ReleaseTrigger bool   `json:"release_trigger"`
	NotifyChannel  string `json:"notify_channel"`
	// Missing names each missing part, for people.
	Missing []string `json:"missing"`
	// QueueTable: the fair queue's table (schema version 4). Without it,
	// no queue is shown.
	QueueTable bool `json:"queue_table"`
}

// snapshotView is what status prints.
type snapshotView struct {
	Time   time.Time  `json:"time"`
	Schema schemaView `json:"schema"`
	Leases struct {
		Total int         `json:"total"`
		Live  int         `json:"live"`
		Rows  []leaseView `json:"rows"`
	} `json:"leases"`
	// Shared are the live shared holds: readers and semaphore permits.
	Shared sharedSection `json:"shared"`
	// Marks are the keys with an exclusive-waiting mark or a lock delay
	// in force.
	Marks            []markView     `json:"marks"`
	WaitingManagers  []waitersView  `json:"waiting_managers"`
	WatchingManagers []waitersView  `json:"watching_managers"`
	GuardedTables    []guardedView  `json:"guarded_tables"`
	Advisory         []advisoryView `json:"advisory"`
	// Queue is the fair queue: the callers waiting in line for each key,
	// in order.
	Queue queueSection `json:"queue"`
	// acquiresWaiting counts, by key hash, the acquires waiting in the
	// database for a key of a lease row or a shared hold.
	acquiresWaiting map[string]int
}

// sharedHoldView is one live shared hold: a reader or a semaphore permit.
type sharedHoldView struct {
	// LockIDHash is pglease.HashKey of the hold's lockId: the id that
	// release --key KEY --hold ID revokes (or asks) alone.
	LockIDHash  string    `json:"lock_id_hash"`
	Holder      string    `json:"holder"`
	Fence       string    `json:"fence"`
	AcquiredAt  time.Time `json:"acquired_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	ExpiresInMs int64     `json:"expires_in_ms"`
	lockID      string    // the raw lockId: a bearer secret, never shown
}

// sharedKeyView is the live shared holds of one key.
type sharedKeyView struct {
	KeyHash string `json:"key_hash"`
	Key     string `json:"key,omitempty"`
	// Kind is "readers" (holders of a reader-writer lease's read side,
	// Limit 0: any number) or "permits" (of a counting semaphore of
	// Limit); "none" in inspect for a key without shared holds.
	Kind  string `json:"kind"`
	Count int    `json:"count"`
	Limit int    `json:"limit"`
	// AcquiresWaiting counts acquires of the key waiting in the database
	// (as a lease row's), for a key without an exclusive row.
	AcquiresWaiting int `json:"acquires_waiting"`
	// Holders are the holds shown (all of them, but for --limit), the
	// latest-expiring first.
	Holders []sharedHoldView `json:"holders"`
	// Queued counts the live tickets of the key's fair queue.
	Queued      int `json:"queued"`
	advisoryKey int64
}

// held says how many of the key's shared holds there are.
func (g *sharedKeyView) held() string {
	switch {
	case g.Count == 0:
		return "none"
	case g.Limit == 0:
		return fmt.Sprintf("%d reader(s) (no limit)", g.Count)
	case g.Count >= g.Limit:
		return fmt.Sprintf("%d of %d permits (full)", g.Count, g.Limit)
	}
	return fmt.Sprintf("%d of %d permits", g.Count, g.Limit)
}

// sharedSection is status's shared holds.
type sharedSection struct {
	// Live counts every live shared hold, on Keys keys, listed or not.
	Live int             `json:"live"`
	Keys int             `json:"keys"`
	Rows []sharedKeyView `json:"rows"`
}

// The marks of a key (markView.Mark).
const (
	markExclusiveWaiting = "exclusive_waiting"
	markLockDelay        = "lock_delay"
)

// markView is a key that no acquire of some kind may take now although
// nobody may hold it: a writer's exclusive-waiting mark (shared acquires
// are refused until it lapses) or a lock delay in force (no acquire at
// all until then).
type markView struct {
	KeyHash string    `json:"key_hash"`
	Key     string    `json:"key,omitempty"`
	Mark    string    `json:"mark"` // markExclusiveWaiting or markLockDelay
	Until   time.Time `json:"until"`
	InMs    int64     `json:"in_ms"`
	// Source, for a lock delay: "revoke" (a revoke's or an operator's
	// release's delay) or "expired_lease" (the expired lease's own lock
	// delay, manager.WithLockDelay).
	Source string `json:"source,omitempty"`
}

func (m *markView) what() string {
	switch {
	case m.Mark == markExclusiveWaiting:
		return "exclusive waiting"
	case m.Source == "revoke":
		return "lock delay (revoke)"
	}
	return "lock delay (expired lease)"
}

func (m *markView) meaning() string {
	if m.Mark == markExclusiveWaiting {
		return "a writer waits for the key; new shared holds are refused until then (it lapses unless the writer tries again)"
	}
	return "not grantable before then, to anyone"
}

// guardedView is a table the database guard (migrate.Migrator.Guard)
// guards: its writes need a live exclusive lease of the row's key, the
// value of KeyColumn.
type guardedView struct {
	Table     string `json:"table"` // schema.table
	KeyColumn string `json:"key_column"`
	// Enabled is false when the trigger is disabled (ALTER TABLE …
	// DISABLE TRIGGER): writes are then not checked.
	Enabled bool `json:"enabled"`
}

// guardedLine is one guarded table for people.
func (g guardedView) String() string {
	s := g.Table + " (key column " + g.KeyColumn + ")"
	if !g.Enabled {
		s += " (trigger disabled: writes not checked)"
	}
	return s
}

// keyView is what inspect shows of one key; its JSON is inspect --json.
type keyView struct {
	KeyHash          string         `json:"key_hash"`
	Key              string         `json:"key,omitempty"`
	Lease            *leaseView     `json:"lease"`
	FenceCounter     *string        `json:"fence_counter"`
	Shared           sharedKeyView  `json:"shared"`
	Marks            []markView     `json:"marks"`
	Acquires         []advisoryView `json:"acquires_in_progress"`
	WaitingManagers  []int32        `json:"waiting_manager_pids"`
	WatchingManagers []int32        `json:"watching_manager_pids"`
	GuardedTables    []guardedView  `json:"guarded_tables"`
	Schema           schemaView     `json:"schema"`
	// Queue is the key's fair queue, in order: the head first.
	Queue    []queuedView `json:"queue"`
	time     time.Time    // the snapshot's
	found    bool         // the key has a lease row (live or not)
	queueLen int          // the key's live tickets, listed or not
}

// queuedView is one ticket of a key's fair queue (docs/fairness.md): a
// caller waiting in line. Its lockId is never shown, only its hash.
type queuedView struct {
	// Position is the ticket's place among the key's live tickets: 1 is
	// the head, the next to be served.
	Position int `json:"position"`
	// Holder is the waiting process's holder identity, the one its grant
	// will carry ("program[pid]@host" unless configured otherwise).
	Holder string `json:"holder"`
	// Mode is what the ticket waits for: "exclusive", "reader", "permit"
	// (of a semaphore of Limit) or "set" (a key of an all-or-nothing
	// set, exclusive).
	Mode  string `json:"mode"`
	Limit int    `json:"limit,omitempty"`
	// Since is when the caller joined the line (server time); WaitingMs
	// is how long ago that was.
	Since     time.Time `json:"since"`
	WaitingMs int64     `json:"waiting_ms"`
	// ExpiresInMs is the ticket's life left: a waiter refreshes it while
	// it waits; one that stops (a dead process) leaves the line then.
	ExpiresInMs int64 `json:"expires_in_ms"`
	// LockIDHash is pglease.HashKey of the ticket's lockId, which the
	// grant will carry.
	LockIDHash string `json:"lock_id_hash"`
}

// queueKeyView is the fair queue of one key.
type queueKeyView struct {
	KeyHash string `json:"key_hash"`
	Key     string `json:"key,omitempty"`
	// Length counts the key's live tickets, listed or not.
	Length int `json:"length"`
	// Tickets are the tickets shown (all of them, but for --limit), in
	// order.
	Tickets     []queuedView `json:"tickets"`
	advisoryKey int64
}

// queueSection is status's fair queue.
type queueSection struct {
	// Tickets counts every live ticket, on Keys keys, listed or not.
	Tickets int            `json:"tickets"`
	Keys    int            `json:"keys"`
	Rows    []queueKeyView `json:"rows"`
}
