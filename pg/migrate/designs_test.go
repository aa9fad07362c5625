package migrate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
)

// The design functions give pg/advisory's ids on the same inputs, reject
// what Go rejects, share one lock space with Go callers, and go
// up/down/up cleanly.
func TestDesignFunctionsEqualGo(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t)
	c := ctx(t)
	ms := migrations(t, pg.Config{}, "designs/migrations")
	if len(ms) != 1 || ms[0].version != 1 || ms[0].name != "advisory_design_functions" {
		t.Fatalf("design migrations = %+v", ms)
	}
	// Next to the lease schema, with a lease and its fence counter: the
	// design's down must leave them.
	e, err := newEnv(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.mg.Up(c); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, e, "lease-next-to-designs", time.Minute)
	countersAndLeases := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(c, `SELECT (SELECT count(*) FROM syncguard_fence_counters) + (SELECT count(*) FROM syncguard_locks)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := countersAndLeases(); n != 2 {
		t.Fatalf("%d fence counters + leases, want 2", n)
	}
	empty := snapshot(t, pool, schema)
	if _, err := pool.Exec(c, ms[0].up); err != nil {
		t.Fatal(err)
	}
	up := snapshot(t, pool, schema)
	for _, f := range []string{"email_to_lock_id(text)", "generate_lock_id(text,text)", "acquire_cleanup_lock(text)", "release_cleanup_lock(text)"} {
		if !strings.Contains(up, "function "+f) {
			t.Fatalf("missing %s:\n%s", f, up)
		}
	}
	inputs := []string{
		"user@example.com", "  User@Example.COM  ", "USER@EXAMPLE.COM", "\tuser@example.com", "user@example.com\n",
		"Élodie@exemple.fr", "ÉLODIE@EXEMPLE.FR", "jürgen@straße.de", "😀@x.io", "a", " ", "", "x:y", strings.Repeat("A", 1000),
	}
	for _, in := range inputs {
		want, goErr := advisory.SHA256Key(in)
		var got int64
		sqlErr := pool.QueryRow(c, "SELECT email_to_lock_id($1)", in).Scan(&got)
		if (goErr != nil) != (sqlErr != nil) {
			t.Fatalf("email_to_lock_id(%q): Go err %v, SQL err %v", in, goErr, sqlErr)
		}
		if id, _ := want.Int64(); goErr == nil && got != id {
			t.Fatalf("email_to_lock_id(%q) = %d, SHA256Key = %d", in, got, id)
		}
		for _, ns := range []string{"cleanup", "registration", "Cleanup", "", "a:b", "ns with space"} {
			want, goErr := advisory.NamespacedKey(ns, in)
			sqlErr := pool.QueryRow(c, "SELECT generate_lock_id($1, $2)", ns, in).Scan(&got)
			if (goErr != nil) != (sqlErr != nil) {
				t.Fatalf("generate_lock_id(%q, %q): Go err %v, SQL err %v", ns, in, goErr, sqlErr)
			}
			if id, _ := want.Int64(); goErr == nil && got != id {
				t.Fatalf("generate_lock_id(%q, %q) = %d, NamespacedKey = %d", ns, in, got, id)
			}
		}
	}

	// Also when the caller's text carries a collation whose lower() maps
	// non-ASCII capitals (the functions lower under "C", like Go).
	var icu bool
	if err := pool.QueryRow(c, "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu')").Scan(&icu); err != nil {
		t.Fatal(err)
	}
	if icu {
		for _, in := range []string{"ÉLODIE@EXEMPLE.FR", "Ärger@x.de"} {
			want, _ := advisory.SHA256Key(in)
			id, _ := want.Int64()
			var got int64
			if err := pool.QueryRow(c, `SELECT email_to_lock_id($1::text COLLATE "und-x-icu")`, in).Scan(&got); err != nil || got != id {
				t.Fatalf("email_to_lock_id(%q COLLATE und-x-icu) = %d, %v; SHA256Key = %d", in, got, err, id)
			}
			if err := pool.QueryRow(c, `SELECT generate_lock_id('ns', $1::text COLLATE "und-x-icu")`, in).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want, _ := advisory.NamespacedKey("ns", in); got != func() int64 { i, _ := want.Int64(); return i }() {
				t.Fatalf("generate_lock_id(ns, %q COLLATE und-x-icu) differs from NamespacedKey", in)
			}
		}
	} else {
		t.Log("no ICU collation: the collation case is not checked")
	}

	// One lock space: SQL's acquire_cleanup_lock holds the key Go derives.
	sqlConn, err := pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlConn.Release()
	var ok bool
	if err := sqlConn.QueryRow(c, "SELECT acquire_cleanup_lock($1)", " Ann@Example.com").Scan(&ok); err != nil || !ok {
		t.Fatalf("acquire_cleanup_lock = %v, %v", ok, err)
	}
	sess, err := advisory.Open(c, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sess.Close(ctx(t)) }()
	k, err := advisory.SHA256Key("ann@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, got, err := sess.TryLock(c, k); err != nil || got {
		t.Fatalf("Go TryLock while SQL holds = %v, %v", got, err)
	}
	if err := sqlConn.QueryRow(c, "SELECT release_cleanup_lock($1)", "ann@example.com").Scan(&ok); err != nil || !ok {
		t.Fatalf("release_cleanup_lock = %v, %v", ok, err)
	}
	lk, got, err := sess.TryLock(c, k)
	if err != nil || !got {
		t.Fatalf("Go TryLock after SQL release = %v, %v", got, err)
	}
	if err := sqlConn.QueryRow(c, "SELECT acquire_cleanup_lock($1)", "ANN@example.com").Scan(&ok); err != nil || ok {
		t.Fatalf("acquire_cleanup_lock while Go holds = %v, %v", ok, err)
	}
	if err := lk.Release(c); err != nil {
		t.Fatal(err)
	}

	// Rollback, and up again.
	if _, err := pool.Exec(c, ms[0].down); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, pool, schema); got != empty {
		t.Fatalf("after down:\n%s\nwant:\n%s", got, empty)
	}
	if n := countersAndLeases(); n != 2 {
		t.Fatalf("after the design's down: %d fence counters + leases, want 2", n)
	}
	if _, err := pool.Exec(c, ms[0].up); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, pool, schema); got != up {
		t.Fatalf("up/down/up:\n%s\nwant:\n%s", got, up)
	}
}
