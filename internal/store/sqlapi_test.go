package store_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// sqlAcquire runs syncguard_locks_acquire through plain SQL.
func sqlAcquire(t *testing.T, db testDB, key string, ttlMs int64) (id *string, fence, exp *int64) {
	t.Helper()
	if err := db.QueryRow(ctx(t), "SELECT lock_id, fence, expires_at_ms FROM syncguard_locks_acquire($1, $2)", key, ttlMs).Scan(&id, &fence, &exp); err != nil {
		t.Fatalf("syncguard_locks_acquire: %v", err)
	}
	return id, fence, exp
}

// The SQL API next to store-level acquires (both as the runtime role):
// one exclusion, one fence sequence, the same liveness; status, extend
// and release from SQL; bad input is SQLSTATE 22023.
func TestSQLAPIWithStore(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{Holder: "go-side"})
	c := ctx(t)
	key := pgtest.RandomName("sqlapi_")
	id, fence, exp := sqlAcquire(t, pool, key, 60000)
	if id == nil || keys.ValidateLockID(*id) != nil || fence == nil || *fence != 1 || exp == nil {
		t.Fatalf("SQL acquire of a free key = %v %v %v", id, fence, exp)
	}
	if r := exclusive(t, s, key, time.Minute); r.OK || r.ExpiresAt.UnixMilli() != *exp || !strings.HasSuffix(r.Holder, "@sql") {
		t.Fatalf("store acquire of the SQL-held key = %+v; want refused with its expiry and an @sql holder", r)
	}
	if id2, f2, exp2 := sqlAcquire(t, pool, key, 60000); id2 != nil || f2 != nil || exp2 == nil || *exp2 != *exp {
		t.Fatalf("second SQL acquire = %v %v %v; want NULL lock_id and fence, the holder's expiry", id2, f2, exp2)
	}
	var held bool
	var sf, sexp *int64
	var holder *string
	var sh int
	if err := pool.QueryRow(c, "SELECT held, fence, expires_at_ms, holder, shared FROM syncguard_locks_status($1)", key).Scan(&held, &sf, &sexp, &holder, &sh); err != nil ||
		!held || *sf != 1 || *sexp != *exp || holder == nil || !strings.HasSuffix(*holder, "@sql") || sh != 0 {
		t.Fatalf("status = %v %v %v %v %v, %v", held, sf, sexp, holder, sh, err)
	}
	var newExp *int64
	if err := pool.QueryRow(c, "SELECT syncguard_locks_extend($1, 120000)", *id).Scan(&newExp); err != nil || newExp == nil || *newExp <= *exp {
		t.Fatalf("SQL extend = %v, %v", newExp, err)
	}
	// The store releases by lockId what SQL granted, and the other way round.
	if ok, err := s.Release(c, *id); err != nil || !ok {
		t.Fatalf("store release of the SQL grant = %v, %v", ok, err)
	}
	r := exclusive(t, s, key, time.Minute)
	if !r.OK || r.Fence != 2 {
		t.Fatalf("store acquire after = %+v; want fence 2", r)
	}
	var ok bool
	if err := pool.QueryRow(c, "SELECT syncguard_locks_release($1)", r.LockID).Scan(&ok); err != nil || !ok {
		t.Fatalf("SQL release of the store's grant = %v, %v", ok, err)
	}
	if err := pool.QueryRow(c, "SELECT syncguard_locks_release($1)", r.LockID).Scan(&ok); err != nil || ok {
		t.Fatalf("SQL release again = %v, %v", ok, err)
	}
	if err := pool.QueryRow(c, "SELECT syncguard_locks_extend($1, 1000)", r.LockID).Scan(&newExp); err != nil || newExp != nil {
		t.Fatalf("SQL extend of a released lease = %v, %v", newExp, err)
	}
	// Shared holds refuse an SQL acquire as they refuse the store's.
	rd := shared(t, s, key, 0, time.Minute)
	if id, _, _ := sqlAcquire(t, pool, key, 60000); id != nil {
		t.Fatal("SQL acquire granted next to a reader")
	}
	if err := pool.QueryRow(c, "SELECT held, shared FROM syncguard_locks_status($1)", key).Scan(&held, &sh); err != nil || held || sh != 1 {
		t.Fatalf("status with a reader = %v %v, %v", held, sh, err)
	}
	release(t, s, rd.LockID)
	// NFC: the SQL API and the store normalize alike.
	id, _, _ = sqlAcquire(t, pool, key+"-e\u0301", 60000)
	if id == nil {
		t.Fatal("SQL acquire of a decomposed key failed")
	}
	if r := exclusive(t, s, key+"-\u00e9", time.Minute); r.OK {
		t.Fatal("the store took the composed form of a key SQL holds")
	}
	for _, q := range []string{"SELECT * FROM syncguard_locks_acquire('', 1000)", "SELECT * FROM syncguard_locks_acquire('k', 0)",
		"SELECT * FROM syncguard_locks_acquire(repeat('x', 513), 1000)", "SELECT syncguard_locks_extend('AAAAAAAAAAAAAAAAAAAAAA', -1)",
		"SELECT syncguard_locks_revoke('k', -1)"} {
		_, err := pool.Exec(c, q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
			t.Errorf("%s: %v; want SQLSTATE 22023", q, err)
		}
	}
}

// A release from SQL notifies a key that a Manager waits for (its waiter
// lock, on the default channel pglease_release or the session's
// pglease.notify_channel) with the key's hash, as a Manager's release
// does, and only then.
func TestSQLReleaseNotifiesWaiters(t *testing.T) {
	t.Parallel()
	_, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	ch := pgtest.RandomName("sqlch_")
	l := listenOn(t, ch)
	if _, err := l.Exec(c, listenAllSQL("pglease_release")); err != nil {
		t.Fatal(err)
	}
	w := connect(t)
	free, waited := pgtest.RandomName("sqlfree_"), pgtest.RandomName("sqlwaited_")
	if ok, err := store.RegisterWaiters(c, w, []string{waited}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	rel := func(db testDB, key string) {
		t.Helper()
		id, _, _ := sqlAcquire(t, db, key, 60000)
		var ok bool
		if id == nil {
			t.Fatal("not acquired")
		}
		if err := db.QueryRow(c, "SELECT syncguard_locks_release($1)", *id).Scan(&ok); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	rel(pool, free)
	rel(pool, waited)
	if n, err := waitNotification(l); err != nil || n.Channel != store.WakeChannel("pglease_release", pglease.HashKey(waited)) || n.Payload != pglease.HashKey(waited) {
		t.Fatalf("notification %+v, %v; want the waited key's on its wake channel of pglease_release (the free key's release notified nobody)", n, err)
	}
	conn, err := pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(c, "SET pglease.notify_channel = "+ch); err != nil {
		t.Fatal(err)
	}
	rel(conn, waited)
	if n, err := waitNotification(l); err != nil || n.Channel != store.WakeChannel(ch, pglease.HashKey(waited)) || n.Payload != pglease.HashKey(waited) {
		t.Fatalf("notification %+v, %v; want the waited key's on its wake channel of %s", n, err, ch)
	}
}

func waitNotification(l *pgx.Conn) (*pgconn.Notification, error) {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return l.WaitForNotification(c)
}

// The views: leases (exclusive and shared, no lock_id, its hash), the
// keys Managers wait for, and every advisory lock with pglease's waiter
// locks named.
func TestSQLViews(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{Holder: "viewer"})
	c := ctx(t)
	key := pgtest.RandomName("view_")
	x := exclusive(t, s, key+"-x", time.Minute)
	p := shared(t, s, key+"-p", 2, time.Minute)
	rows, err := pool.Query(c, "SELECT * FROM syncguard_locks_leases WHERE key LIKE $1 ORDER BY key", key+"%")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("leases view: %v", got)
	}
	for i, want := range []struct {
		mode   string
		fence  pglease.Fence
		id     string
		expire time.Time
	}{{"permit", p.Fence, p.LockID, p.ExpiresAt}, {"exclusive", x.Fence, x.LockID, x.ExpiresAt}} {
		r := got[i]
		if _, has := r["lock_id"]; has {
			t.Fatal("the leases view shows lock_id")
		}
		if r["mode"] != want.mode || r["holder"] != "viewer" || r["fence"] != int64(want.fence) || r["live"] != true ||
			r["lock_id_hash"] != pglease.HashKey(want.id) || !r["expires_at"].(time.Time).Equal(want.expire) {
			t.Fatalf("leases view row %d = %v; want %+v", i, r, want)
		}
	}
	w := connect(t)
	var pid int
	if err := w.QueryRow(c, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if ok, err := store.RegisterWaiters(c, w, []string{key + "-x"}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	var wk, kind string
	var wpid int
	if err := pool.QueryRow(c, "SELECT key, kind, pid FROM syncguard_locks_waiters WHERE key LIKE $1", key+"%").Scan(&wk, &kind, &wpid); err != nil ||
		wk != key+"-x" || kind != "wait" || wpid != pid {
		t.Fatalf("waiters view = %s %s %d, %v; want the waiter's session on %s", wk, kind, wpid, err, key+"-x")
	}
	var k1, k2 int32
	if err := pool.QueryRow(c, "SELECT key1, key2, kind FROM pglease_advisory_locks WHERE pid = $1", pid).Scan(&k1, &k2, &kind); err != nil ||
		k1 != store.WaiterLockClass || kind != "pglease waiter" {
		t.Fatalf("advisory view = %d %d %s, %v", k1, k2, kind, err)
	}
	var h int32
	if err := pool.QueryRow(c, "SELECT hashtext($1)", key+"-x").Scan(&h); err != nil || h != k2 {
		t.Fatalf("key2 = %d, want hashtext %d (%v)", k2, h, err)
	}
}

// SQL callers and SyncGuard processes share the tables: each sees the
// other's grants, fences continue across them.
func TestSQLAPIWithSyncGuard(t *testing.T) {
	t.Parallel()
	_, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	sg := pgtest.NewSyncGuard(t, pool)
	key := pgtest.RandomName("sqlsg_")
	sgID, ok, err := sg.Acquire(key, time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if id, _, _ := sqlAcquire(t, pool, key, 60000); id != nil {
		t.Fatal("SQL acquire granted a key SyncGuard holds")
	}
	var rel bool
	if err := pool.QueryRow(c, "SELECT syncguard_locks_release($1)", sgID).Scan(&rel); err != nil || !rel {
		t.Fatalf("SQL release of SyncGuard's lease = %v, %v", rel, err)
	}
	id, fence, _ := sqlAcquire(t, pool, key, 60000)
	if id == nil || *fence != 2 {
		t.Fatalf("SQL acquire after SyncGuard = %v %v; want fence 2", id, fence)
	}
	if _, ok, err := sg.Acquire(key, time.Minute); err != nil || ok {
		t.Fatalf("SyncGuard acquire of the SQL-held key = %v, %v", ok, err)
	}
	if ok, err := sg.ExtendOrRelease(*id, 0); err != nil || !ok {
		t.Fatalf("SyncGuard release of the SQL grant = %v, %v", ok, err)
	}
	if _, ok, err := sg.Acquire(key, time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
}

// psqlBin finds the psql binary: the harness's PostgreSQL, or PATH.
func psqlBin(t *testing.T) string {
	t.Helper()
	if dir, err := pgtest.FindBinDir(); err == nil {
		if p := filepath.Join(dir, "psql"); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql binary")
	}
	return p
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// From the psql binary, as the runtime role: acquire, a store that
// cannot take the key, release by the lockId psql printed.
func TestSQLAPIFromPsql(t *testing.T) {
	t.Parallel()
	rs := pgtest.RoleSchemaForTest(t)
	pool := rs.RuntimePool(t)
	s, err := store.New("pg.New", pool, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	psql := psqlBin(t)
	key := pgtest.RandomName("psql_")
	// psql takes no search_path in a URI: it goes to PGOPTIONS.
	u, err := url.Parse(rs.RuntimeURL)
	if err != nil {
		t.Skip("the runtime URL is not a URI")
	}
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	run := func(sql string) string {
		t.Helper()
		cmd := exec.Command(psql, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", u.String(), "-c", sql)
		cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+rs.Schema)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql -c %q: %v\n%s", sql, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	out := run("SELECT lock_id || ' ' || fence FROM syncguard_locks_acquire('" + key + "', 60000)")
	id, fence, ok := strings.Cut(out, " ")
	if !ok || keys.ValidateLockID(id) != nil || fence != "1" {
		t.Fatalf("psql acquire printed %q", out)
	}
	if r := exclusive(t, s, key, time.Minute); r.OK {
		t.Fatal("the store took a key psql holds")
	}
	if out := run("SELECT syncguard_locks_release('" + id + "')"); out != "t" {
		t.Fatalf("psql release printed %q", out)
	}
	r := exclusive(t, s, key, time.Minute)
	if !r.OK || r.Fence != 2 {
		t.Fatalf("store acquire after psql's release = %+v", r)
	}
	if out := run("SELECT held::text || ' ' || fence FROM syncguard_locks_status('" + key + "')"); out != "true "+strconv.Itoa(int(r.Fence)) {
		t.Fatalf("psql status printed %q", out)
	}
}
