package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// holderStore is a Store of w's pool with its own holder identity.
func (w *world) holderStore(t *testing.T, holder string) *store.Store {
	t.Helper()
	s, err := store.New("pg.New", w.pool, store.Config{Holder: holder, NotifyChannel: manager.DefaultNotifyChannel})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// share takes a shared hold of key (limit 0: a reader) as holder.
func (w *world) share(t *testing.T, holder, key string, limit int) store.AcquireResult {
	t.Helper()
	r, err := w.holderStore(t, holder).AcquireSharedMany(ctx(t), []store.SharedRequest{{Key: key, TTL: time.Minute, Limit: limit}})
	if err != nil || !r[0].OK {
		t.Fatalf("AcquireSharedMany(%s) = %v, %v", key, r, err)
	}
	return r[0]
}

// noSecrets fails if r's output holds any of secrets (raw keys, lockIds).
func noSecrets(t *testing.T, r result, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(r.stdout+r.stderr, s) {
			t.Fatalf("output holds the secret %q:\n%s", s, r)
		}
	}
}

// listen returns a connection LISTENing on the Managers' channel.
func listen(t *testing.T, w *world) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx(t), w.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx(t), "LISTEN "+manager.DefaultNotifyChannel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// notified waits (bounded) for a notification with payload on conn and
// reports whether it came; other payloads are skipped.
func notified(t *testing.T, conn *pgx.Conn, payload string, within time.Duration) bool {
	t.Helper()
	c, cancel := context.WithTimeout(ctx(t), within)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(c)
		if err != nil {
			return false
		}
		if n.Payload == payload {
			return true
		}
	}
}

// status and inspect show shared holds (readers, permits with their
// limit), the exclusive-waiting mark, lock delays (a revoke's and an
// expired lease's own), the grant's lock delay, watching Managers and the
// guarded tables, in text and JSON; hashes only, raw keys with
// --show-keys, lockIds never.
func TestStatusNewKinds(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	const (
		rw, sem, revoked, expired, delayed, watched = "kinds:rw", "kinds:sem", "kinds:revoked", "kinds:expired", "kinds:delayed", "kinds:watched"
	)
	h := pglease.HashKey
	r1 := w.share(t, "reader[101]@web-1", rw, 0)
	r2 := w.share(t, "reader[102]@web-2", rw, 0)
	p1 := w.share(t, "worker[201]@job-1", sem, 3)
	p2 := w.share(t, "worker[202]@job-2", sem, 3)
	// A revoked lease with a delay of an hour.
	rv := w.acquire(t, revoked, time.Minute)
	if res, err := w.store.Revoke(c, []store.RevokeRequest{{Key: revoked, Delay: time.Hour}}); err != nil || res[0].Revoked != 1 {
		t.Fatalf("Revoke = %v, %v", res, err)
	}
	// A lease that expired unreleased, with a lock delay of an hour, and
	// a live one with a lock delay of 30 s.
	ex, err := w.store.Acquire(c, store.AcquireRequest{Key: expired, TTL: 200 * time.Millisecond, LockDelay: time.Hour})
	if err != nil || !ex.OK {
		t.Fatal(ex, err)
	}
	dl, err := w.store.Acquire(c, store.AcquireRequest{Key: delayed, TTL: time.Minute, LockDelay: 30 * time.Second})
	if err != nil || !dl.OK {
		t.Fatal(dl, err)
	}
	// A Manager's session watching a held key (the watch lock it takes).
	wconn, err := w.pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Release()
	if ok, err := store.RegisterWatchers(c, wconn.Conn(), []string{watched}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	wpid := int32(wconn.Conn().PgConn().PID())
	wl := w.acquire(t, watched, time.Minute)
	// A guarded table (its owner guards it).
	owner, err := pgxpool.New(c, w.ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Exec(c, "CREATE TABLE orders (order_key text PRIMARY KEY, qty int)"); err != nil {
		t.Fatal(err)
	}
	mg, err := migrate.New(owner, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Guard(c, "orders", "order_key"); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := owner.QueryRow(c, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the expired lease past the tolerance", func() bool { return time.Now().After(ex.ExpiresAt.Add(1200 * time.Millisecond)) })
	secrets := []string{rw, sem, revoked, expired, delayed, watched, r1.LockID, r2.LockID, p1.LockID, p2.LockID, rv.LockID, ex.LockID, dl.LockID, wl.LockID}

	// withWriter runs the binary right after a writer's exclusive attempt
	// on rw, refused by the readers, which marks the key for 2 s; again
	// (bounded) should a loaded machine take longer than that.
	withWriter := func(args ...string) result {
		t.Helper()
		var r result
		for range 8 {
			a, err := w.holderStore(t, "writer[301]@web-3").Acquire(c, store.AcquireRequest{Key: rw, TTL: time.Minute})
			if err != nil || a.OK || a.SharedHolders != 2 {
				t.Fatalf("the writer's attempt = %v, %v; want refused by 2 readers", a, err)
			}
			start := time.Now()
			r = run(t, w.url, "", args...)
			if time.Since(start) < 1500*time.Millisecond {
				break
			}
		}
		return r
	}

	r := withWriter("status")
	// (Advisory locks, and so the Managers waiting and watching, are the
	// database's: other tests' may show too.)
	want(t, r, 0, "SHARED HOLDS  4 live on 2 key(s)", "MARKS  3:", "WATCHING MANAGERS  ", "GUARDED TABLES  1:",
		"watching Manager: lease "+h(watched), "lease "+h(rw)+": a writer waits for the key (exclusive waiting)")
	wantLines(t, r,
		regexp.QuoteMeta(h(rw))+`\s+reader\s+2 reader\(s\) \(no limit\)\s+reader\[101\]@web-1\s+0\s+\S+ ago\s+in \S+\s+0`,
		regexp.QuoteMeta(h(rw))+`\s+reader\s+2 reader\(s\) \(no limit\)\s+reader\[102\]@web-2\s+0\s+.*`,
		regexp.QuoteMeta(h(sem))+`\s+permit\s+2 of 3 permits\s+worker\[201\]@job-1\s+`+fmt.Sprint(int64(p1.Fence))+`\s+.*`,
		regexp.QuoteMeta(h(sem))+`\s+permit\s+2 of 3 permits\s+worker\[202\]@job-2\s+`+fmt.Sprint(int64(p2.Fence))+`\s+.*`,
		regexp.QuoteMeta(h(rw))+`\s+exclusive waiting\s+\S+ \S+ UTC \(in \S+\)\s+a writer waits .*`,
		regexp.QuoteMeta(h(revoked))+`\s+lock delay \(revoke\)\s+\S+ \S+ UTC \(in (59m\d\ds|1h0m0s)\)\s+not grantable before then, to anyone`,
		regexp.QuoteMeta(h(expired))+`\s+lock delay \(expired lease\)\s+\S+ \S+ UTC \(in (59m\d\ds|1h0m0s)\)\s+not grantable .*`,
		regexp.QuoteMeta(h(delayed))+`\s+billing\[42\]@web-1\s+1\s+\S+ ago\s+in \S+, lock delay 30\.0s\s+0\s+0`,
		regexp.QuoteMeta(h(watched))+`\s+1\s+`+fmt.Sprint(wpid)+` \S+`, // pid and application_name
		regexp.QuoteMeta(schema)+`\.orders\s+order_key\s+enabled`,
	)
	noSecrets(t, r, secrets...)

	r = withWriter("status", "--show-keys")
	want(t, r, 0)
	wantLines(t, r, regexp.QuoteMeta(rw)+`\s+reader\s+.*`, regexp.QuoteMeta(sem)+`\s+permit\s+.*`, regexp.QuoteMeta(rw)+`\s+exclusive waiting\s+.*`,
		regexp.QuoteMeta(revoked)+`\s+lock delay \(revoke\)\s+.*`, regexp.QuoteMeta(watched)+`\s+1\s+\d+ \S+`)
	noSecrets(t, r, r1.LockID, r2.LockID, p1.LockID, p2.LockID, rv.LockID, ex.LockID, dl.LockID, wl.LockID)

	r = withWriter("status", "--json")
	want(t, r, 0)
	noSecrets(t, r, secrets...)
	var v snapshotView
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r)
	}
	if !v.Schema.SharedTable || !v.Schema.MarkColumns || v.Shared.Live != 4 || v.Shared.Keys != 2 || len(v.Shared.Rows) != 2 {
		t.Fatalf("JSON shared: %+v %+v", v.Schema, v.Shared)
	}
	for _, g := range v.Shared.Rows {
		switch g.KeyHash {
		case h(rw):
			if g.Kind != "readers" || g.Count != 2 || g.Limit != 0 || len(g.Holders) != 2 || g.Holders[0].Fence != "000000000000000" || g.Key != "" {
				t.Fatalf("readers: %+v", g)
			}
		case h(sem):
			if g.Kind != "permits" || g.Count != 2 || g.Limit != 3 || len(g.Holders) != 2 || g.Holders[0].ExpiresInMs <= 0 {
				t.Fatalf("permits: %+v", g)
			}
			fences := map[string]bool{g.Holders[0].Fence: true, g.Holders[1].Fence: true}
			if !fences[p1.Fence.String()] || !fences[p2.Fence.String()] {
				t.Fatalf("permit fences %+v, want %v and %v", g.Holders, p1.Fence, p2.Fence)
			}
		default:
			t.Fatalf("shared row of an unknown key: %+v", g)
		}
	}
	marks := map[string]markView{}
	for _, m := range v.Marks {
		marks[m.KeyHash+" "+m.Mark] = m
	}
	if m, ok := marks[h(rw)+" "+markExclusiveWaiting]; !ok || m.InMs <= 0 || m.InMs > 5000 {
		t.Fatalf("exclusive waiting mark: %+v (all %+v)", m, v.Marks)
	}
	if m, ok := marks[h(revoked)+" "+markLockDelay]; !ok || m.Source != "revoke" || m.InMs < 59*60*1000 {
		t.Fatalf("revoke delay: %+v (all %+v)", m, v.Marks)
	}
	if m, ok := marks[h(expired)+" "+markLockDelay]; !ok || m.Source != "expired_lease" || !m.Until.Equal(ex.ExpiresAt.Add(time.Hour)) {
		t.Fatalf("expired lease's delay: %+v, want until %v (all %+v)", m, ex.ExpiresAt.Add(time.Hour), v.Marks)
	}
	if len(v.Marks) != 3 {
		t.Fatalf("marks: %+v", v.Marks)
	}
	found := false
	for _, m := range v.WatchingManagers {
		if slices.Contains(m.KeyHashes, h(watched)) {
			found = m.Managers == 1 && len(m.PIDs) == 1 && m.PIDs[0] == wpid && len(m.KeyHashes) == 1 && m.Keys == nil
		}
	}
	if !found {
		t.Fatalf("watching managers: %+v", v.WatchingManagers)
	}
	if len(v.GuardedTables) != 1 || v.GuardedTables[0] != (guardedView{Table: schema + ".orders", KeyColumn: "order_key", Enabled: true}) {
		t.Fatalf("guarded tables: %+v", v.GuardedTables)
	}
	for _, l := range v.Leases.Rows {
		switch l.KeyHash {
		case h(delayed):
			if l.LockDelayMs != 30000 {
				t.Fatalf("lease row's lock delay: %+v", l)
			}
		case h(watched):
			if l.ManagersWatching != 1 || l.LockDelayMs != 0 {
				t.Fatalf("watched lease row: %+v", l)
			}
		}
	}

	// inspect, one key each.
	r = withWriter("inspect", rw)
	want(t, r, 0)
	wantLines(t, r, `lease\s+none: no exclusive holder \(see shared holds\)`, `shared holds\s+2 reader\(s\) \(no limit\)`,
		`  reader\s+id [0-9a-f]{24}, holder reader\[101\]@web-1, fence 0, acquired \S+ ago, expires in \S+`,
		`  reader\s+id [0-9a-f]{24}, holder reader\[102\]@web-2, fence 0, .*`,
		`exclusive waiting\s+yes: a writer waits for the key; new shared holds are refused until \S+ \S+ UTC \(in \S+\), unless it tries again`,
		`guarded tables\s+`+regexp.QuoteMeta(schema)+`\.orders \(key column order_key\): .*`)
	noSecrets(t, r, secrets...)
	r = run(t, w.url, "", "inspect", sem)
	want(t, r, 0)
	wantLines(t, r, `shared holds\s+2 of 3 permits`, `  permit\s+id [0-9a-f]{24}, holder worker\[201\]@job-1, fence `+fmt.Sprint(int64(p1.Fence))+`, .*`,
		`exclusive waiting\s+no`, `lock delay\s+none in force`)
	r = run(t, w.url, "", "inspect", revoked)
	want(t, r, exitNotFound)
	wantLines(t, r, `lease\s+none: no holder, but a lock delay holds the key off \(see lock delay\)`,
		`lock delay\s+not grantable before \S+ \S+ UTC \(in \S+\): a revoke's delay`)
	r = run(t, w.url, "", "inspect", expired)
	want(t, r, 0)
	wantLines(t, r, `lease\s+expired \S+ ago: no holder, but a lock delay holds the key off \(see lock delay\)`,
		`lock delay\s+not grantable before \S+ \S+ UTC \(in \S+\): the expired lease's lock delay`)
	r = run(t, w.url, "", "inspect", delayed)
	want(t, r, 0)
	wantLines(t, r, `lock delay\s+none in force; the lease's lock delay is 30\.0s .*`)
	r = run(t, w.url, "", "inspect", watched)
	want(t, r, 0)
	wantLines(t, r, fmt.Sprintf(`watching Managers\s+1 \(listening sessions' pids %d\)`, wpid))
	noSecrets(t, r, secrets...)

	r = withWriter("inspect", "--json", rw)
	want(t, r, 0)
	noSecrets(t, r, secrets...)
	var iv struct {
		Lease  *leaseView    `json:"lease"`
		Shared sharedKeyView `json:"shared"`
		Marks  []markView    `json:"marks"`
		Watch  []int32       `json:"watching_manager_pids"`
		Guard  []guardedView `json:"guarded_tables"`
		Schema schemaView    `json:"schema"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &iv); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r)
	}
	if iv.Lease != nil || iv.Shared.Kind != "readers" || iv.Shared.Count != 2 || len(iv.Shared.Holders) != 2 || len(iv.Marks) != 1 ||
		iv.Marks[0].Mark != markExclusiveWaiting || iv.Watch == nil || len(iv.Guard) != 1 || !iv.Schema.SharedTable {
		t.Fatalf("inspect JSON: %+v\n%s", iv, r)
	}
	r = run(t, w.url, "", "inspect", "--json", "--show-keys", watched)
	want(t, r, 0, `"key":"`+watched+`"`, fmt.Sprintf(`"watching_manager_pids":[%d]`, wpid), `"shared":{"key_hash":"`+h(watched)+`","key":"`+watched+`","kind":"none","count":0`)
	noSecrets(t, r, wl.LockID)
}

// On a schema before version 4 (no shared-hold table, no mark columns),
// status and inspect show what there is and say what is missing.
func TestStatusOlderSchema(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	want(t, run(t, w.url, "", "setup"), 0)
	g := w.acquire(t, "old:1", time.Minute)
	for _, ver := range []int{3, 2} {
		want(t, run(t, w.url, "", "migrate", "--to", fmt.Sprint(ver)), 0)
		r := run(t, w.url, "", "status")
		want(t, r, exitSchema, pglease.HashKey("old:1"), "billing[42]@web-1", "shared-hold table (schema version 4)",
			"lock delay and exclusive-waiting columns of the holder table (schema version 4)",
			fmt.Sprintf("SHARED HOLDS  not shown: no shared-hold table (schema v%d;", ver),
			fmt.Sprintf("MARKS  not shown: the holder table has no columns for lock delays and exclusive waiting (schema v%d;", ver),
			fmt.Sprintf("QUEUE  not shown: no queue table (schema v%d; the fair queue needs v4)", ver), "queue table (schema version 4)",
			"GUARDED TABLES  none")
		r = run(t, w.url, "", "status", "--json")
		want(t, r, exitSchema, `"shared_table":false`, `"mark_columns":false`, `"shared":{"live":0,"keys":0,"rows":[]}`, `"marks":[]`,
			`"queue_table":false`, `"queue":{"tickets":0,"keys":0,"rows":[]}`,
			`"watching_managers":[`, `"guarded_tables":[]`) // advisory locks are the database's: other tests' may show
		r = run(t, w.url, "", "inspect", "old:1")
		want(t, r, 0)
		wantLines(t, r, `holder\s+billing\[42\]@web-1`, fmt.Sprintf(`shared holds\s+not shown: no shared-hold table \(schema v%d; .*`, ver),
			fmt.Sprintf(`lock delay\s+not shown \(schema v%d; needs v4\)`, ver),
			fmt.Sprintf(`queue\s+not shown: no queue table \(schema v%d; the fair queue needs v4\)`, ver))
		noSecrets(t, r, g.LockID)
	}
	// SyncGuard's tables alone: no holder table either.
	want(t, run(t, w.url, "", "migrate", "--to", "0"), 0)
	r := run(t, w.url, "", "status")
	want(t, r, exitSchema, pglease.HashKey("old:1"), "holder table (schema version 2)", "shared-hold table (schema version 4)")
	if strings.Contains(r.stdout, "MARKS") {
		t.Fatalf("status without a holder table spoke of its columns:\n%s", r)
	}
	r = run(t, w.url, "", "inspect", "old:1")
	want(t, r, 0, "shared holds")
}

// release --key revokes: the holder's Manager is told at once ("r:" on
// the channel, heard here by LISTEN), its extend fails, the next grant
// fences it out; one audit record without a secret. --delay keeps every
// acquire off the key (RetryAfter of at least the delay's rest); without
// it, the lease's own lock delay applies. --lock-id revokes that grant.
func TestReleaseRevokes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	conn := listen(t, w)
	h := pglease.HashKey

	g := w.acquire(t, "rv:1", time.Minute)
	r := run(t, w.url, "", "release", "--key", "rv:1")
	want(t, r, exitRefused, "refusing", "ErrRevoked", "ErrLockLost", "--force", "--request", "fence counter is not touched")
	r = run(t, w.url, "y\n", "release", "--key", "rv:1", "--force")
	want(t, r, 0, "revoked lease "+h("rv:1")+" (fence 1, holder billing[42]@web-1); its holder was told on channel pglease_release")
	noSecrets(t, r, "rv:1", g.LockID)
	if !notified(t, conn, "r:"+h("rv:1")+":"+h(g.LockID), 30*time.Second) {
		t.Fatal("no revoke notification r:<key hash>:<lockId hash> on the channel")
	}
	audit := auditRecords(t, r)
	if len(audit) != 1 || audit[0]["action"] != "revoke_lease" || audit[0]["result"] != "revoked" || audit[0]["key_hash"] != h("rv:1") ||
		audit[0]["lock_id_hash"] != h(g.LockID) || audit[0]["fence"] != g.Fence.String() || audit[0]["delay"] != "0s" {
		t.Fatalf("audit records: %v\n%s", audit, r)
	}
	if e, err := w.store.Extend(c, g.LockID, time.Minute); err != nil || e.OK {
		t.Fatalf("the revoked holder's Extend = %+v, %v; want not OK", e, err)
	}
	if n := w.acquire(t, "rv:1", time.Minute); n.Fence != g.Fence+1 { // no delay: free at once
		t.Fatalf("next grant fence %v, want %v", n.Fence, g.Fence+1)
	}

	// --delay: no acquire for an hour after the revoke.
	g = w.acquire(t, "rv:2", time.Minute)
	start := time.Now()
	r = run(t, w.url, "", "release", "--key", "rv:2", "--force", "--yes", "--delay", "1h")
	want(t, r, 0, "revoked lease "+h("rv:2"), "not grantable before", "No acquire (exclusive or shared) takes the key for 1h0m0s")
	if a := auditRecords(t, r); len(a) != 1 || a[0]["delay"] != "1h0m0s" || a[0]["not_grantable_before"] == nil {
		t.Fatalf("audit records: %v\n%s", a, r)
	}
	if !notified(t, conn, "r:"+h("rv:2")+":"+h(g.LockID), 30*time.Second) {
		t.Fatal("no revoke notification with --delay")
	}
	a, err := w.store.Acquire(c, store.AcquireRequest{Key: "rv:2", TTL: time.Minute})
	if err != nil || a.OK || a.RetryAfter < time.Hour-time.Since(start) {
		t.Fatalf("acquire after a revoke with --delay 1h = %v, %v; want refused with RetryAfter >= %v", a, err, time.Hour-time.Since(start))
	}
	sh, err := w.store.AcquireSharedMany(c, []store.SharedRequest{{Key: "rv:2", TTL: time.Minute}})
	if err != nil || sh[0].OK {
		t.Fatalf("a reader during the delay = %v, %v; want refused", sh, err)
	}
	r = run(t, w.url, "", "status")
	wantLines(t, r, regexp.QuoteMeta(h("rv:2"))+`\s+lock delay \(revoke\)\s+.*`)

	// No --delay: the lease's own lock delay.
	g, err = w.store.Acquire(c, store.AcquireRequest{Key: "rv:3", TTL: time.Minute, LockDelay: time.Hour})
	if err != nil || !g.OK {
		t.Fatal(g, err)
	}
	start = time.Now()
	r = run(t, w.url, "", "release", "--key", "rv:3", "--force", "--yes")
	want(t, r, 0, "The lease's own lock delay keeps every acquire off the key for 1h0m0s", "not grantable before")
	if a, err := w.store.Acquire(c, store.AcquireRequest{Key: "rv:3", TTL: time.Minute}); err != nil || a.OK || a.RetryAfter < time.Hour-time.Since(start) {
		t.Fatalf("acquire after revoking a lease with a lock delay = %v, %v", a, err)
	}

	// --lock-id revokes that grant.
	g = w.acquire(t, "rv:4", time.Minute)
	r = run(t, w.url, "", "release", "--lock-id", g.LockID, "--force", "--yes")
	want(t, r, 0, "revoked lease "+h("rv:4"))
	noSecrets(t, r, "rv:4")
	if !strings.Contains(r.stderr, `"action":"revoke_lease"`) || strings.Count(r.stdout+r.stderr, g.LockID) != 0 {
		t.Fatalf("--lock-id:\n%s", r)
	}
	if !notified(t, conn, "r:"+h("rv:4")+":"+h(g.LockID), 30*time.Second) {
		t.Fatal("no revoke notification for --lock-id")
	}
	r = run(t, w.url, "", "release", "--lock-id", g.LockID, "--force", "--yes")
	want(t, r, exitNotFound, "no such lease")

	// A key with shared holds only: they are revoked.
	rd := w.share(t, "reader[1]@x", "rv:shared", 0)
	r = run(t, w.url, "", "release", "--key", "rv:shared", "--force", "--yes")
	want(t, r, 0, "revoked 1 shared hold(s) of "+h("rv:shared"), h(rd.LockID))
	if !notified(t, conn, "r:"+h("rv:shared")+":"+h(rd.LockID), 30*time.Second) {
		t.Fatal("no revoke notification for a reader")
	}
}

// revokeGrant revokes only the grant that was shown: a key granted again
// meanwhile (another lockId) is left alone, nothing notified.
func TestRevokeGrantChangedHands(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	conn := listen(t, w)
	g := w.acquire(t, "hands:1", time.Minute)
	cfg := store.Config{NotifyChannel: manager.DefaultNotifyChannel}
	res, err := revokeGrant(c, w.pool, cfg, "hands:1", pglease.HashKey("some-other-lock-id"), 0)
	if err != nil || res.ok || !res.other || len(res.Fences) != 1 || res.Fences[0] != g.Fence {
		t.Fatalf("revokeGrant of another grant = %+v, %v; want not revoked, other", res, err)
	}
	if info, err := w.store.LookupByKey(c, "hands:1"); err != nil || info == nil || info.LockIDHash != pglease.HashKey(g.LockID) {
		t.Fatalf("the lease after a refused revoke: %v, %v", info, err)
	}
	if notified(t, conn, "r:"+pglease.HashKey("hands:1")+":"+pglease.HashKey(g.LockID), 500*time.Millisecond) {
		t.Fatal("a rolled-back revoke notified")
	}
	res, err = revokeGrant(c, w.pool, cfg, "hands:1", pglease.HashKey(g.LockID), 0)
	if err != nil || !res.ok || res.other {
		t.Fatalf("revokeGrant of the grant = %+v, %v", res, err)
	}
	if !notified(t, conn, "r:"+pglease.HashKey("hands:1")+":"+pglease.HashKey(g.LockID), 30*time.Second) {
		t.Fatal("no revoke notification")
	}
}

// release --request asks the holders ("q:" on the channel) and changes
// nothing; nobody holding the key is exit 3 with nothing sent.
func TestReleaseRequest(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	conn := listen(t, w)
	h := pglease.HashKey
	g := w.acquire(t, "rq:1", time.Minute)
	r := run(t, w.url, "", "release", "--key", "rq:1", "--request")
	want(t, r, 0, "asked the holders of "+h("rq:1")+" to release it (the exclusive holder billing[42]@web-1), on channel pglease_release: nothing was deleted")
	noSecrets(t, r, "rq:1", g.LockID)
	if a := auditRecords(t, r); len(a) != 1 || a[0]["action"] != "request_release" || a[0]["result"] != "sent" || a[0]["key_hash"] != h("rq:1") {
		t.Fatalf("audit records: %v\n%s", a, r)
	}
	if !notified(t, conn, "q:"+h("rq:1"), 30*time.Second) {
		t.Fatal("no release request q:<key hash> on the channel")
	}
	if info, err := w.store.LookupByKey(c, "rq:1"); err != nil || info == nil || info.LockIDHash != h(g.LockID) || info.Fence != g.Fence {
		t.Fatalf("the lease after a request: %v, %v", info, err)
	}
	if e, err := w.store.Extend(c, g.LockID, time.Minute); err != nil || !e.OK {
		t.Fatalf("the holder's extend after a request = %+v, %v", e, err)
	}
	// Shared holders are asked too.
	p := w.share(t, "worker[1]@x", "rq:sem", 2)
	r = run(t, w.url, "", "release", "--key", "rq:sem", "--request", "--notify-channel", "other_channel")
	want(t, r, 0, "(1 shared holder(s)), on channel other_channel")
	noSecrets(t, r, "rq:sem", p.LockID)
	// Nobody holds it: nothing sent.
	r = run(t, w.url, "", "release", "--key", "rq:free", "--request")
	want(t, r, exitNotFound, "nobody holds "+h("rq:free")+": no request sent")
	if notified(t, conn, "q:"+h("rq:free"), 500*time.Millisecond) {
		t.Fatal("a request for a free key was sent")
	}
}

// auditRecords returns the audit records in r's stderr.
func auditRecords(t *testing.T, r result) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(r.stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "pglease release" {
			out = append(out, m)
		}
	}
	return out
}
