package store

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Default table names, SyncGuard's (pg.Config says them in words).
const (
	DefaultLockTable  = "syncguard_locks"
	DefaultFenceTable = "syncguard_fence_counters"
)

// fnVersion and acquireVersion are part of the server functions' names
// (their hash input): functions with a new body or signature get new
// names, so code of one schema version never calls another version's
// functions. fnVersion names the release, extend and handoff functions
// (schema version 2), acquireVersion the acquire function (schema version
// 3; version 2's stays, named with fnVersion). See the migration
// templates of package pg/migrate for when to change them.
const (
	fnVersion      = "v2"
	acquireVersion = "v3"
	// v4Version names every function schema version 4 added or
	// replaced (the acquire, release, extend and handoff functions that
	// also know shared holds, lock delays and watchers; the shared, set,
	// revoke and snapshot functions).
	v4Version = "v4"
)

// identRe is the rule for every name pglease puts into SQL: an unquoted
// identifier.
var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ValidIdent reports whether s matches ^[A-Za-z_][A-Za-z0-9_]{0,62}$.
func ValidIdent(s string) bool { return identRe.MatchString(s) }

// Names holds everything derived from a validated Config: the quoted
// names the store's statements and the migration templates use.
type Names struct {
	Lock, Fence       string // quoted, possibly schema-qualified
	LockSchema        string // "" when unqualified
	LockIdent         string // unquoted table identifier
	Holders           string // quoted holder identity table, in the lock table's schema
	IdxLockID, IdxExp string // quoted index names (unqualified: indexes live in the table's schema)
	FnAcquire         string // quoted, qualified like the lock table
	FnAcquireV2       string // schema version 2's acquire function, kept for version 2's code
	FnRelease         string
	FnExtend          string
	FnHandOff         string
	FnHash            string
	FnSchema          string // the schema version record
	// v0's functions (SetupSchema before schema versions), dropped by
	// migration 2.
	FnAcquireV0, FnReleaseV0, FnExtendV0 string
	// TriggerFn is the (unquoted) name of the release trigger's function,
	// in the lock table's schema.
	TriggerFn string

	// Schema version 4: the table of shared holds ({lock}_shared) and its
	// index on key.
	Shared, IdxSharedKey string
	// Schema version 4's functions, which the store calls (the v2/v3
	// functions above stay for older code during a rolling upgrade).
	FnAcquire4, FnAcquireShared, FnAcquireSets, FnRelease4, FnExtend4, FnHandOff4, FnHandOff1 string
	FnRevoke, FnSnapshot, FnCheck, FnGrant, FnNotify                                          string
	// FnLockWait waits, within a deadline, for a lock another transaction
	// holds on a key (the acquire functions' bounded lock waits).
	FnLockWait string
	// The fair queue (docs/fairness.md): the ticket table ({lock}_queue),
	// its (key, seq) index, and its functions: acquire or enqueue,
	// refresh, leave, release and serve the head, serve (internal).
	Queue, IdxQueueKey                                                         string
	FnQWait, FnQWait1, FnQRefresh, FnQLeave, FnQRelease, FnQRelease1, FnQServe string
	// FnGuardTrigger is the database guard's trigger function, named
	// without a version so that installed triggers keep it; GuardTrigger
	// the (unquoted) name of the trigger on a guarded table.
	FnGuardTrigger, GuardTrigger string
	// The SQL API: functions and views with stable names derived from the
	// lock table's ({lock}_acquire …), for SQL callers; quoted, qualified
	// like the lock table.
	APIAcquire, APIRelease, APIExtend, APIStatus, APIRevoke, APIRequestRelease, APIGuard, APIUnguard string
	ViewLeases, ViewWaiters                                                                          string
	// ViewAdvisory is pglease_advisory_locks, one per schema (shared by
	// every table pair in it, like the hashKey function).
	ViewAdvisory string
}

// ReleaseTriggerName is the name of the release trigger on the lock table
// (trigger names are per table).
const ReleaseTriggerName = "pglease_release_notify"

// ParseTable splits and validates a table name, `ident` or
// `schema.ident`; what names it in the error.
func ParseTable(op, what, s string) (schema, ident string, err error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return "", "", pgerr.New(pglease.CodeInvalidArgument, op, what+" must be ident or schema.ident", nil)
	}
	for _, p := range parts {
		if !identRe.MatchString(p) {
			return "", "", pgerr.New(pglease.CodeInvalidArgument, op, what+" must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$ (optionally schema-qualified)", nil)
		}
	}
	if len(parts) == 2 {
		return parts[0], parts[1], nil
	}
	return "", parts[0], nil
}

// Quote quotes an identifier, schema-qualified unless schema is "".
func Quote(schema, ident string) string {
	if schema == "" {
		return pgx.Identifier{ident}.Sanitize()
	}
	return pgx.Identifier{schema, ident}.Sanitize()
}

// indexName is SyncGuard's idx_{table}_{suffix}, shortened so that it fits
// PostgreSQL's 63-byte identifiers without the two names colliding (the
// server would truncate both to the same 63 bytes).
func indexName(ident, suffix string) string {
	tail := "_" + suffix
	if len("idx_")+len(ident)+len(tail) > 63 {
		ident = ident[:63-len("idx_")-len(tail)]
	}
	return pgx.Identifier{"idx_" + ident + tail}.Sanitize()
}

// channelRe is the rule for notification channel names: an unquoted
// identifier of at most 60 bytes, so that its wake channels (WakeChannel:
// three bytes more) fit PostgreSQL's 63.
var channelRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,59}$`)

// ChannelRule is channelRe, as error messages quote it.
const ChannelRule = "^[A-Za-z_][A-Za-z0-9_]{0,59}$"

// CheckChannel is the rule for notification channel names
// (Config.NotifyChannel, the release trigger's channel): ChannelRule.
func CheckChannel(op, channel string) error {
	if !channelRe.MatchString(channel) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "channel must match "+ChannelRule, nil)
	}
	return nil
}

// WakeChannel is the channel on which a release of a key whose hashKey
// is keyHash (pglease.HashKey) wakes its waiters: channel, ".", and hex
// digits 7 and 8 of keyHash, the low byte of its first word (the last
// word's low byte, which a first version used, put 2,560 sequential keys
// on 56 channels; this one on 215–256). There are 256 per notify channel; a
// process LISTENs to those of the keys it waits for, so a release wakes
// the processes waiting for its key (and for the keys that share its
// wake channel), not every listener of the fleet. The channel itself
// carries everything else (revocations, release requests, watch events).
func WakeChannel(channel, keyHash string) string {
	return channel + "." + keyHash[6:8]
}

// Names validates c's names (bad ones are InvalidArgument under op) and
// derives the quoted names of the tables, indexes and functions.
func (c Config) Names(op string) (Names, error) {
	lock := cmp.Or(c.LockTable, DefaultLockTable)
	fence := cmp.Or(c.FenceTable, DefaultFenceTable)
	ls, li, err := ParseTable(op, "LockTable", lock)
	if err != nil {
		return Names{}, err
	}
	fs, fi, err := ParseTable(op, "FenceTable", fence)
	if err != nil {
		return Names{}, err
	}
	if maySame(ls, li, fs, fi) {
		// An unqualified name is resolved by the search_path, so "t" and
		// "public.t" may well be the same table.
		return Names{}, pgerr.New(pglease.CodeInvalidArgument, op, fmt.Sprintf(
			"LockTable %q and FenceTable %q may name the same table (an unqualified name is resolved by search_path): qualify both with their schema, or give them different names", lock, fence), nil)
	}
	if maySame(ls, holdersName(li), fs, fi) {
		return Names{}, pgerr.New(pglease.CodeInvalidArgument, op, fmt.Sprintf(
			"FenceTable %q may be the lock table's holder table %q: give it another name", fence, holdersName(li)), nil)
	}
	if maySame(ls, suffixName(li, "_shared"), fs, fi) {
		return Names{}, pgerr.New(pglease.CodeInvalidArgument, op, fmt.Sprintf(
			"FenceTable %q may be the lock table's shared-hold table %q: give it another name", fence, suffixName(li, "_shared")), nil)
	}
	if maySame(ls, suffixName(li, "_queue"), fs, fi) {
		return Names{}, pgerr.New(pglease.CodeInvalidArgument, op, fmt.Sprintf(
			"FenceTable %q may be the lock table's queue table %q: give it another name", fence, suffixName(li, "_queue")), nil)
	}
	if c.NotifyChannel != "" {
		if err := CheckChannel(op, c.NotifyChannel); err != nil {
			return Names{}, err
		}
	}
	n := Names{
		Lock: Quote(ls, li), Fence: Quote(fs, fi), LockSchema: ls, LockIdent: li,
		IdxLockID: indexName(li, "lock_id"), IdxExp: indexName(li, "expires"),
		Holders: Quote(ls, holdersName(li)),
	}
	h := func(version string) string {
		sum := sha256.Sum256([]byte(version + "\x00" + n.Lock + "\x00" + n.Fence))
		return hex.EncodeToString(sum[:5])
	}
	cur, v0 := h(fnVersion), h("v1")
	n.FnAcquire = Quote(ls, "pglease_acquire_"+h(acquireVersion))
	n.FnAcquireV2 = Quote(ls, "pglease_acquire_"+cur)
	n.FnRelease = Quote(ls, "pglease_release_"+cur)
	n.FnExtend = Quote(ls, "pglease_extend_"+cur)
	n.FnHandOff = Quote(ls, "pglease_handoff_"+cur)
	n.FnAcquireV0 = Quote(ls, "pglease_acquire_"+v0)
	n.FnReleaseV0 = Quote(ls, "pglease_release_"+v0)
	n.FnExtendV0 = Quote(ls, "pglease_extend_"+v0)
	// One per schema, shared by every table pair in it (and by release
	// triggers): its body never changes, so neither does its name.
	n.FnHash = Quote(ls, "pglease_hashkey_v1")
	n.FnSchema = Quote(ls, "pglease_schema_"+h("schema"))
	// "v1" is fixed: installed triggers keep their function's name.
	tsum := sha256.Sum256([]byte("v1\x00" + li))
	n.TriggerFn = "pglease_release_notify_" + hex.EncodeToString(tsum[:5])

	v4 := h(v4Version)
	shared := suffixName(li, "_shared")
	n.Shared = Quote(ls, shared)
	n.IdxSharedKey = indexName(shared, "key")
	n.FnAcquire4 = Quote(ls, "pglease_acquire_"+v4)
	n.FnAcquireShared = Quote(ls, "pglease_acquire_shared_"+v4)
	n.FnAcquireSets = Quote(ls, "pglease_acquire_sets_"+v4)
	n.FnRelease4 = Quote(ls, "pglease_release_"+v4)
	n.FnExtend4 = Quote(ls, "pglease_extend_"+v4)
	n.FnHandOff4 = Quote(ls, "pglease_handoff_"+v4)
	n.FnHandOff1 = Quote(ls, "pglease_handoff1_"+v4)
	n.FnRevoke = Quote(ls, "pglease_revoke_"+v4)
	n.FnSnapshot = Quote(ls, "pglease_snapshot_"+v4)
	n.FnCheck = Quote(ls, "pglease_check_"+v4)
	n.FnGrant = Quote(ls, "pglease_grant_"+v4)
	n.FnNotify = Quote(ls, "pglease_notify_"+v4)
	n.FnLockWait = Quote(ls, "pglease_lockwait_"+v4)
	queue := suffixName(li, "_queue")
	n.Queue = Quote(ls, queue)
	n.IdxQueueKey = indexName(queue, "key")
	n.FnQWait = Quote(ls, "pglease_qwait_"+v4)
	n.FnQWait1 = Quote(ls, "pglease_qwait1_"+v4)
	n.FnQRelease1 = Quote(ls, "pglease_qrelease1_"+v4)
	n.FnQRefresh = Quote(ls, "pglease_qrefresh_"+v4)
	n.FnQLeave = Quote(ls, "pglease_qleave_"+v4)
	n.FnQRelease = Quote(ls, "pglease_qrelease_"+v4)
	n.FnQServe = Quote(ls, "pglease_qserve_"+v4)
	guard := h("guard")
	n.FnGuardTrigger = "pglease_guard_" + guard // created in the lock table's schema
	n.GuardTrigger = "pglease_guard_" + guard
	for _, a := range []struct {
		dst    *string
		suffix string
	}{
		{&n.APIAcquire, "_acquire"}, {&n.APIRelease, "_release"}, {&n.APIExtend, "_extend"}, {&n.APIStatus, "_status"},
		{&n.APIRevoke, "_revoke"}, {&n.APIRequestRelease, "_request_release"}, {&n.APIGuard, "_guard"}, {&n.APIUnguard, "_unguard"},
		{&n.ViewLeases, "_leases"}, {&n.ViewWaiters, "_waiters"},
	} {
		*a.dst = Quote(ls, suffixName(li, a.suffix))
	}
	n.ViewAdvisory = Quote(ls, "pglease_advisory_locks")
	return n, nil
}

// maySame reports whether schema-qualified-or-not names s1.i1 and s2.i2
// may resolve to the same table: the same identifier, and the same schema
// or at least one of them unqualified (resolved by search_path).
func maySame(s1, i1, s2, i2 string) bool {
	return i1 == i2 && (s1 == s2 || s1 == "" || s2 == "")
}

// holdersName is the holder identity table of lock table ident:
// ident_holders, or, when that would not fit PostgreSQL's 63 bytes, a
// prefix of ident and a hash of it.
func holdersName(ident string) string { return suffixName(ident, "_holders") }

// suffixName is ident+suffix (suffix starts with "_"), or, when that
// would not fit PostgreSQL's 63 bytes, a prefix of ident, a hash of
// ident and suffix: the names of the objects schema version 2 and later
// put next to a lock table.
func suffixName(ident, suffix string) string {
	if len(ident)+len(suffix) <= 63 {
		return ident + suffix
	}
	sum := sha256.Sum256([]byte(ident))
	tail := "_" + hex.EncodeToString(sum[:4]) + suffix
	return ident[:63-len(tail)] + tail
}

// Names returns the names derived from the Store's Config.
func (s *Store) Names() Names { return s.n }
