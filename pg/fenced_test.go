package pg_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// fencedTable creates jobs(id text primary key, fence bigint, status,
// note) in a fresh schema and returns the pool.
func fencedTable(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := pgtest.Pool(t)
	_, err := pool.Exec(context.Background(),
		`CREATE TABLE jobs (id text PRIMARY KEY, fence bigint, status text NOT NULL DEFAULT 'new', note text)`)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

type jobRow struct {
	fence  *int64
	status string
	note   *string
}

func readJob(t *testing.T, db testDB, id string) (jobRow, bool) {
	t.Helper()
	var r jobRow
	err := db.QueryRow(context.Background(), `SELECT fence, status, note FROM jobs WHERE id = $1`, id).Scan(&r.fence, &r.status, &r.note)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

func mustGuard(t *testing.T) *pg.FenceGuard {
	t.Helper()
	g, err := pg.NewFenceGuard("jobs", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestFenceGuardUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fencedTable(t)
	if _, err := pool.Exec(ctx, `INSERT INTO jobs (id) VALUES ('a'), ('b')`); err != nil {
		t.Fatal(err)
	}
	g := mustGuard(t)
	write := func(fence pglease.Fence, status string) bool {
		t.Helper()
		ok, err := g.Update(ctx, pool, "a", fence, pg.Set{Column: "status", Value: status})
		if err != nil {
			t.Fatalf("Update(fence %d): %v", fence, err)
		}
		return ok
	}
	steps := []struct {
		fence  pglease.Fence
		status string
		want   bool
		stored int64
		after  string
	}{
		{5, "started-5", true, 5, "started-5"},   // NULL fence: first lease claims the row
		{5, "done-5", true, 5, "done-5"},         // the same lease writes again
		{4, "late-4", false, 5, "done-5"},        // stale lease refused
		{7, "started-7", true, 7, "started-7"},   // newer lease
		{5, "late-5", false, 7, "started-7"},     // the old one again, refused
		{6, "between-6", false, 7, "started-7"},  // an intermediate one too
		{8, "started-8", true, 8, "started-8"},   // and so on
		{1, "ancient-1", false, 8, "started-8"},  //
		{8, "finished-8", true, 8, "finished-8"}, //
	}
	for _, s := range steps {
		if got := write(s.fence, s.status); got != s.want {
			t.Fatalf("fence %d: accepted=%v, want %v", s.fence, got, s.want)
		}
		r, _ := readJob(t, pool, "a")
		if r.fence == nil || *r.fence != s.stored || r.status != s.after {
			t.Fatalf("after fence %d: row fence=%v status=%q, want %d %q", s.fence, r.fence, r.status, s.stored, s.after)
		}
	}
	// The other row was never touched.
	if r, _ := readJob(t, pool, "b"); r.fence != nil || r.status != "new" {
		t.Fatalf("row b changed: %+v", r)
	}
	// No row with that key: not accepted, nothing created.
	ok, err := g.Update(ctx, pool, "missing", 9, pg.Set{Column: "status", Value: "x"})
	if err != nil || ok {
		t.Fatalf("Update of a missing row = %v, %v; want false, nil", ok, err)
	}
	if _, found := readJob(t, pool, "missing"); found {
		t.Fatal("Update created a row")
	}
	// No columns: only the fence moves (a claim).
	ok, err = g.Update(ctx, pool, "b", 3)
	if err != nil || !ok {
		t.Fatalf("claim = %v, %v", ok, err)
	}
	if r, _ := readJob(t, pool, "b"); r.fence == nil || *r.fence != 3 || r.status != "new" {
		t.Fatalf("claim: row b = %+v", r)
	}
}

func TestFenceGuardUpsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fencedTable(t)
	g := mustGuard(t)
	upsert := func(fence pglease.Fence, status string, note any) bool {
		t.Helper()
		ok, err := g.Upsert(ctx, pool, "j1", fence, pg.Set{Column: "status", Value: status}, pg.Set{Column: "note", Value: note})
		if err != nil {
			t.Fatalf("Upsert(fence %d): %v", fence, err)
		}
		return ok
	}
	if !upsert(10, "started", nil) {
		t.Fatal("insert refused")
	}
	if r, ok := readJob(t, pool, "j1"); !ok || *r.fence != 10 || r.status != "started" || r.note != nil {
		t.Fatalf("after insert: %+v %v", r, ok)
	}
	if upsert(9, "late", "from 9") {
		t.Fatal("stale upsert accepted")
	}
	if r, _ := readJob(t, pool, "j1"); *r.fence != 10 || r.status != "started" || r.note != nil {
		t.Fatalf("stale upsert changed the row: %+v", r)
	}
	if !upsert(11, "done", "by 11") {
		t.Fatal("newer upsert refused")
	}
	if r, _ := readJob(t, pool, "j1"); *r.fence != 11 || r.status != "done" || r.note == nil || *r.note != "by 11" {
		t.Fatalf("after newer upsert: %+v", r)
	}
	// Upsert only sets the listed columns on update.
	ok, err := g.Upsert(ctx, pool, "j1", 11, pg.Set{Column: "note", Value: "again"})
	if err != nil || !ok {
		t.Fatalf("partial upsert = %v, %v", ok, err)
	}
	if r, _ := readJob(t, pool, "j1"); r.status != "done" || *r.note != "again" {
		t.Fatalf("partial upsert: %+v", r)
	}
}

// TestFenceGuardConcurrent: writers with fences 1..n race on one row;
// whatever the order, the row ends with the highest fence's value, and
// every accepted write carried a fence ≥ all accepted before it.
func TestFenceGuardConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fencedTable(t)
	g := mustGuard(t)
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	accepted := make(chan int, n)
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			ok, err := g.Upsert(ctx, pool, "hot", pglease.Fence(i), pg.Set{Column: "note", Value: fmt.Sprint(i)})
			if err != nil {
				errs <- err
				return
			}
			if ok {
				accepted <- i
			}
		})
	}
	wg.Wait()
	close(errs)
	close(accepted)
	for err := range errs {
		t.Fatal(err)
	}
	sawN := false
	for i := range accepted {
		sawN = sawN || i == n
	}
	if !sawN {
		t.Fatal("the highest fence was refused")
	}
	r, _ := readJob(t, pool, "hot")
	if *r.fence != n || *r.note != fmt.Sprint(n) {
		t.Fatalf("row = fence %d note %q, want %d", *r.fence, *r.note, n)
	}
}

func TestFenceGuardInTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fencedTable(t)
	g := mustGuard(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := g.Upsert(ctx, tx, "tx", 2, pg.Set{Column: "status", Value: "in-tx"})
	if err != nil || !ok {
		t.Fatalf("Upsert in tx = %v, %v", ok, err)
	}
	if _, found := readJob(t, tx, "tx"); !found {
		t.Fatal("row not visible inside the transaction")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, found := readJob(t, pool, "tx"); found {
		t.Fatal("rolled-back write is visible")
	}
}

// TestFenceGuardInjection: hostile names are refused before any I/O, and
// hostile values are stored verbatim.
func TestFenceGuardInjection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fencedTable(t)
	badNames := []string{
		"", "jobs; DROP TABLE jobs", `jobs"`, `"jobs"`, "jobs--", "jobs /*", "a.b.c", "1jobs", "jobs id",
		"jobs\x00", "jöbs", strings.Repeat("a", 64), "jobs)", "fence = 0 --", ".jobs", "jobs.",
	}
	for _, name := range badNames {
		for i, args := range [][3]string{{name, "id", "fence"}, {"jobs", name, "fence"}, {"jobs", "id", name}} {
			if _, err := pg.NewFenceGuard(args[0], args[1], args[2]); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
				t.Errorf("NewFenceGuard arg %d = %q: err %v, want InvalidArgument", i, name, err)
			} else if name != "" && strings.Contains(err.Error(), name) {
				t.Errorf("error echoes the name: %v", err)
			}
		}
	}
	if _, err := pg.NewFenceGuard("jobs", "id", "id"); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("same key and fence column: %v", err)
	}
	if _, err := pg.NewFenceGuard("public.jobs", "id", "fence"); err != nil {
		t.Errorf("schema-qualified table refused: %v", err)
	}

	g := mustGuard(t)
	// A closed pool: any I/O would fail with another code than InvalidArgument.
	closed, _ := pgtest.Pool(t)
	closed.Close()
	many := make([]pg.Set, 101)
	for i := range many {
		many[i] = pg.Set{Column: fmt.Sprintf("c%d", i), Value: i}
	}
	var nilGuard *pg.FenceGuard
	var nilCtx context.Context
	cases := []struct {
		name string
		call func() (bool, error)
		code pglease.Code
	}{
		{"bad column", func() (bool, error) {
			return g.Update(ctx, closed, "a", 1, pg.Set{Column: "status = 'x', fence = 999 --", Value: 1})
		}, pglease.CodeInvalidArgument},
		{"quoted column", func() (bool, error) { return g.Update(ctx, closed, "a", 1, pg.Set{Column: `status"`, Value: 1}) }, pglease.CodeInvalidArgument},
		{"set fence", func() (bool, error) { return g.Update(ctx, closed, "a", 1, pg.Set{Column: "fence", Value: 999}) }, pglease.CodeInvalidArgument},
		{"set key", func() (bool, error) { return g.Upsert(ctx, closed, "a", 1, pg.Set{Column: "id", Value: "b"}) }, pglease.CodeInvalidArgument},
		{"duplicate", func() (bool, error) {
			return g.Update(ctx, closed, "a", 1, pg.Set{Column: "note", Value: 1}, pg.Set{Column: "note", Value: 2})
		}, pglease.CodeInvalidArgument},
		{"too many", func() (bool, error) { return g.Update(ctx, closed, "a", 1, many...) }, pglease.CodeInvalidArgument},
		{"fence 0", func() (bool, error) { return g.Update(ctx, closed, "a", 0) }, pglease.CodeInvalidArgument},
		{"fence < 0", func() (bool, error) { return g.Upsert(ctx, closed, "a", -1) }, pglease.CodeInvalidArgument},
		{"fence > max", func() (bool, error) { return g.Update(ctx, closed, "a", keys.FenceMax+1) }, pglease.CodeInvalidArgument},
		{"nil key", func() (bool, error) { return g.Update(ctx, closed, nil, 1) }, pglease.CodeInvalidArgument},
		{"nil db", func() (bool, error) { return g.Update(ctx, nil, "a", 1) }, pglease.CodeInvalidArgument},
		{"nil guard", func() (bool, error) { return nilGuard.Update(ctx, closed, "a", 1) }, pglease.CodeInvalidArgument},
		{"zero guard", func() (bool, error) { return (&pg.FenceGuard{}).Upsert(ctx, closed, "a", 1) }, pglease.CodeInvalidArgument},
		{"nil ctx", func() (bool, error) { return g.Update(nilCtx, closed, "a", 1) }, pglease.CodeInvalidArgument},
	}
	for _, c := range cases {
		ok, err := c.call()
		if ok || pglease.CodeOf(err) != c.code {
			t.Errorf("%s: %v, %v; want false, %v", c.name, ok, err, c.code)
		}
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.Update(ended, closed, "a", 1); pglease.CodeOf(err) != pglease.CodeAborted {
		t.Errorf("ended ctx: %v, want Aborted", err)
	}

	// Hostile values and keys are data, never SQL.
	if _, err := pool.Exec(ctx, `INSERT INTO jobs (id) VALUES ('a'), ('b')`); err != nil {
		t.Fatal(err)
	}
	evil := `x', fence = 999999 WHERE true; DROP TABLE jobs; --`
	ok, err := g.Update(ctx, pool, "a", 1, pg.Set{Column: "note", Value: evil})
	if err != nil || !ok {
		t.Fatalf("Update with a hostile value = %v, %v", ok, err)
	}
	if r, _ := readJob(t, pool, "a"); *r.note != evil || *r.fence != 1 {
		t.Fatalf("row a = %+v", r)
	}
	ok, err = g.Update(ctx, pool, "b' OR true --", 2, pg.Set{Column: "note", Value: "owned"})
	if err != nil || ok {
		t.Fatalf("Update with a hostile key = %v, %v; want false, nil", ok, err)
	}
	for _, id := range []string{"a", "b"} {
		if r, _ := readJob(t, pool, id); r.note != nil && *r.note == "owned" {
			t.Fatalf("hostile key wrote row %s", id)
		}
	}
	// A value of the wrong type is a server error, mapped, and changes nothing.
	_, err = g.Update(ctx, pool, "a", 5, pg.Set{Column: "status", Value: struct{}{}})
	if err == nil {
		t.Fatal("a struct value was accepted for a text column")
	}
	if r, _ := readJob(t, pool, "a"); *r.fence != 1 {
		t.Fatalf("failed write moved the fence: %+v", r)
	}
}

func ExampleFenceGuard() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE example_invoices (id bigint PRIMARY KEY, fence bigint, state text)`); err != nil {
		panic(err)
	}
	guard, err := pg.NewFenceGuard("example_invoices", "id", "fence")
	if err != nil {
		panic(err)
	}
	// The holder of fence 7 claims the row, then a holder of the older
	// fence 6 (paused until its lease had passed to 7) tries to write.
	ok, _ := guard.Upsert(ctx, pool, 42, 7, pg.Set{Column: "state", Value: "sending"})
	fmt.Println("fence 7 claims:", ok)
	ok, _ = guard.Update(ctx, pool, 42, 6, pg.Set{Column: "state", Value: "sent twice"})
	fmt.Println("fence 6 writes late:", ok)
	ok, _ = guard.Update(ctx, pool, 42, 7, pg.Set{Column: "state", Value: "sent"})
	fmt.Println("fence 7 finishes:", ok)
	var state string
	_ = pool.QueryRow(ctx, `SELECT state FROM example_invoices WHERE id = 42`).Scan(&state)
	fmt.Println("state:", state)
	// Output:
	// fence 7 claims: true
	// fence 6 writes late: false
	// fence 7 finishes: true
	// state: sent
}

// grantTable creates jobs with a grant column in the schema of a Store's
// pool and returns the grant guard.
func grantGuard(t *testing.T, db testDB) (*pg.FenceGuard, *pg.FenceGuard) {
	t.Helper()
	_, err := db.Exec(context.Background(),
		`CREATE TABLE jobs (id text PRIMARY KEY, fence bigint, fence_grant text, status text NOT NULL DEFAULT 'new')`)
	if err != nil {
		t.Fatal(err)
	}
	legacy := mustGuard(t)
	g, err := legacy.WithGrantColumn("fence_grant")
	if err != nil {
		t.Fatal(err)
	}
	return legacy, g
}

func statusOf(t *testing.T, db testDB, id string) string {
	t.Helper()
	var s string
	if err := db.QueryRow(context.Background(), `SELECT status FROM jobs WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFenceGuardRepeatedFence (white-box: the database is made to lose a grant): the
// fence counter is lowered so that the next grant repeats the last fence,
// as after a failover to an asynchronous replica. A guard with a grant
// column refuses the repeated fence from the second grant with a typed
// error and keeps the first grant's write, while the first grant's own
// retries still pass; the guard without one lets the repeat through.
func TestFenceGuardRepeatedFence(t *testing.T) {
	t.Parallel()
	s, pool, _ := newSuperStore(t, pg.Config{})
	c := ctx(t)
	legacy, g := grantGuard(t, pool)
	if _, err := pool.Exec(c, `INSERT INTO jobs (id) VALUES ('legacy')`); err != nil {
		t.Fatal(err)
	}
	key := pgtest.RandomName("job")
	a, err := s.Acquire(c, key, 30*time.Second)
	if err != nil || !a.OK {
		t.Fatal(a, err)
	}
	ga := pg.GrantID(a.LockID)
	for i, status := range []string{"A1", "A2"} { // a write and a retry of the same grant
		if ok, err := g.Upsert(c, pool, "job", a.Fence, gset(ga), pg.Set{Column: "status", Value: status}); err != nil || !ok {
			t.Fatalf("grant A write %d: %v, %v", i, ok, err)
		}
	}
	if ok, err := legacy.Update(c, pool, "legacy", a.Fence, pg.Set{Column: "status", Value: "A"}); err != nil || !ok {
		t.Fatalf("legacy guard, grant A: %v, %v", ok, err)
	}
	if ok, err := s.Release(c, a.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// Lose the last grant's fence increment, as an asynchronous failover would.
	if _, err := pool.Exec(c, `UPDATE syncguard_fence_counters SET fence = fence - 1`); err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(c, key, 30*time.Second)
	if err != nil || !b.OK {
		t.Fatal(b, err)
	}
	if b.Fence != a.Fence {
		t.Fatalf("setup: second grant got fence %s, want the repeated %s", b.Fence, a.Fence)
	}
	gb := pg.GrantID(b.LockID)
	if gb == ga {
		t.Fatal("two grants have the same GrantID")
	}
	for _, write := range []func() (bool, error){
		func() (bool, error) {
			return g.Update(c, pool, "job", b.Fence, gset(gb), pg.Set{Column: "status", Value: "B"})
		},
		func() (bool, error) {
			return g.Upsert(c, pool, "job", b.Fence, gset(gb), pg.Set{Column: "status", Value: "B"})
		},
	} {
		ok, err := write()
		if ok || !errors.Is(err, pglease.ErrFenceRegression) || !errors.Is(err, pg.ErrFenceRepeated) {
			t.Fatalf("repeated fence from another grant: accepted=%v err=%v; want a FenceRegression error (ErrFenceRepeated)", ok, err)
		}
		if strings.Contains(err.Error(), b.LockID) || strings.Contains(err.Error(), gb) {
			t.Fatalf("error text leaks the grant: %v", err)
		}
	}
	if st := statusOf(t, pool, "job"); st != "A2" {
		t.Fatalf("status = %q after the refused repeat, want A2", st)
	}
	// The first grant's retries still pass.
	if ok, err := g.Update(c, pool, "job", a.Fence, gset(ga), pg.Set{Column: "status", Value: "A3"}); err != nil || !ok {
		t.Fatalf("grant A retry after the repeat: %v, %v", ok, err)
	}
	// Without a grant column the repeat goes through: what the column fixes.
	if ok, err := legacy.Update(c, pool, "legacy", b.Fence, pg.Set{Column: "status", Value: "B"}); err != nil || !ok {
		t.Fatalf("legacy guard, repeated fence: %v, %v (documented: accepted)", ok, err)
	}
	// A newer grant takes over; then the older fence is an ordinary refusal.
	if ok, err := s.Release(c, b.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	n, err := s.Acquire(c, key, 30*time.Second)
	if err != nil || !n.OK || n.Fence <= a.Fence {
		t.Fatal(n, err)
	}
	if ok, err := g.Update(c, pool, "job", n.Fence, gset(pg.GrantID(n.LockID)), pg.Set{Column: "status", Value: "N"}); err != nil || !ok {
		t.Fatalf("newer grant: %v, %v", ok, err)
	}
	if ok, err := g.Update(c, pool, "job", a.Fence, gset(ga), pg.Set{Column: "status", Value: "late"}); err != nil || ok {
		t.Fatalf("older fence after a newer grant: %v, %v; want false, nil", ok, err)
	}
	if ok, err := g.Update(c, pool, "missing", n.Fence, gset(pg.GrantID(n.LockID))); err != nil || ok {
		t.Fatalf("missing row: %v, %v; want false, nil", ok, err)
	}
	if st := statusOf(t, pool, "job"); st != "N" {
		t.Fatalf("status = %q, want N", st)
	}
}

// TestFenceGuardGrantBackCompat: a row written before the grant column
// existed (grant NULL) takes an equal fence once from any grant, which
// records it; from then on another grant with that fence is refused.
func TestFenceGuardGrantBackCompat(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	legacy, g := grantGuard(t, pool)
	c := ctx(t)
	if ok, err := legacy.Upsert(c, pool, "j", 7, pg.Set{Column: "status", Value: "old"}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	g1, g2 := pg.GrantID(keys.NewLockID()), pg.GrantID(keys.NewLockID())
	if ok, err := g.Update(c, pool, "j", 7, gset(g1), pg.Set{Column: "status", Value: "g1"}); err != nil || !ok {
		t.Fatalf("equal fence on a row without a grant: %v, %v; want accepted", ok, err)
	}
	if ok, err := g.Update(c, pool, "j", 7, gset(g2)); !errors.Is(err, pg.ErrFenceRepeated) || ok {
		t.Fatalf("second grant, same fence: %v, %v; want ErrFenceRepeated", ok, err)
	}
	var stored string
	if err := pool.QueryRow(c, `SELECT fence_grant FROM jobs WHERE id = 'j'`).Scan(&stored); err != nil || stored != g1 {
		t.Fatalf("stored grant = %q, %v; want g1's", stored, err)
	}
}

// TestFenceGuardNilAndBadInput: nil receivers, nil and
// nil-pointer DBs and bad grants are InvalidArgument, never a panic.
func TestFenceGuardNilAndBadInput(t *testing.T) {
	t.Parallel()
	c := context.Background()
	var nilGuard *pg.FenceGuard
	var nilPool *pgxpool.Pool
	var nilConn *pgx.Conn
	g := mustGuard(t)
	gg, err := g.WithGrantColumn("fence_grant")
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := pgtest.Pool(t)
	grant := pg.GrantID(keys.NewLockID())
	for name, call := range map[string]func() (bool, error){
		"nil guard Update":        func() (bool, error) { return nilGuard.Update(c, pool, "k", 1) },
		"nil guard Upsert":        func() (bool, error) { return nilGuard.Upsert(c, pool, "k", 1) },
		"nil guard Update, grant": func() (bool, error) { return nilGuard.Update(c, pool, "k", 1, gset(grant)) },
		"nil guard Upsert, grant": func() (bool, error) { return nilGuard.Upsert(c, pool, "k", 1, gset(grant)) },
		"zero guard":              func() (bool, error) { return (&pg.FenceGuard{}).Update(c, pool, "k", 1) },
		"nil DB":                  func() (bool, error) { return g.Update(c, nil, "k", 1) },
		"nil *pgxpool.Pool":       func() (bool, error) { return g.Update(c, nilPool, "k", 1) },
		"nil *pgx.Conn Upsert":    func() (bool, error) { return g.Upsert(c, nilConn, "k", 1) },
		"nil pool Update, grant":  func() (bool, error) { return gg.Update(c, nilPool, "k", 1, gset(grant)) },
		//lint:ignore SA1012 testing a nil context
		"nil context":           func() (bool, error) { return g.Update(nil, pool, "k", 1) },
		"raw lockId as grant":   func() (bool, error) { return gg.Update(c, pool, "k", 1, gset(keys.NewLockID())) },
		"empty grant":           func() (bool, error) { return gg.Upsert(c, pool, "k", 1, gset(pg.GrantID("not a lockId"))) },
		"Update on grant guard": func() (bool, error) { return gg.Update(c, pool, "k", 1) },
		"grant of another type": func() (bool, error) {
			return gg.Update(c, pool, "k", 1, pg.Set{Column: "fence_grant", Value: []byte(grant)})
		},
		"grant column set twice": func() (bool, error) {
			return gg.Update(c, pool, "k", 1, gset(grant), pg.Set{Column: "fence_grant", Value: "x"})
		},
		"nil key": func() (bool, error) { return gg.Update(c, pool, nil, 1, gset(grant)) },
		"fence 0": func() (bool, error) { return gg.Upsert(c, pool, "k", 0, gset(grant)) },
	} {
		ok, err := call()
		if ok || !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%s: %v, %v; want InvalidArgument", name, ok, err)
		}
	}
	for name, col := range map[string]string{"bad name": "a-b", "key column": "id", "fence column": "fence"} {
		if _, err := g.WithGrantColumn(col); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("WithGrantColumn(%s): %v; want InvalidArgument", name, err)
		}
	}
	if _, err := nilGuard.WithGrantColumn("fence_grant"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("nil guard WithGrantColumn: %v", err)
	}
	id := keys.NewLockID()
	if gid := pg.GrantID(id); len(gid) != 64 || gid != pg.GrantID(id) || strings.Contains(gid, id) {
		t.Errorf("GrantID = %q: want 64 stable hex digits not containing the lockId", gid)
	}
}

// TestFenceGuardRepeatedFenceRace: two grants with the same fence write
// the same row concurrently. Only one grant's writes are ever accepted,
// every write of the other is reported as a repeat (never as a silent
// "refused"), including one whose statement waited for the winner's.
func TestFenceGuardRepeatedFenceRace(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t, maxConns(8))
	_, g := grantGuard(t, pool)
	c := ctx(t)
	grants := [2]string{pg.GrantID(keys.NewLockID()), pg.GrantID(keys.NewLockID())}
	var mu sync.Mutex
	accepted := map[int]int{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			who := w % 2
			for range 20 {
				ok, err := g.Upsert(c, pool, "race", 5, gset(grants[who]), pg.Set{Column: "status", Value: strconv.Itoa(who)})
				switch {
				case ok && err == nil:
					mu.Lock()
					accepted[who]++
					mu.Unlock()
				case !ok && errors.Is(err, pg.ErrFenceRepeated):
				default:
					t.Errorf("grant %d: %v, %v; want accepted or ErrFenceRepeated", who, ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(accepted) != 1 {
		t.Fatalf("accepted writes per grant: %v; want exactly one grant accepted", accepted)
	}
}

// TestFenceGuardNothingSentIsNotAmbiguous: a write refused by
// pgx before it was executed — a committed transaction, a value it cannot
// encode for its column — is InvalidArgument, not Ambiguous: the caller
// knows it did not happen. And the error does not echo the value.
func TestFenceGuardNothingSentIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fencedTable(t)
	g := mustGuard(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = g.Upsert(ctx, tx, "done", 1, pg.Set{Column: "status", Value: "x"})
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("Upsert on a committed tx: %v, want InvalidArgument", err)
	}
	_, err = g.Update(ctx, tx, "done", 1, pg.Set{Column: "status", Value: "x"})
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("Update on a committed tx: %v, want InvalidArgument", err)
	}
	// A channel cannot be encoded as text.
	_, err = g.Upsert(ctx, pool, "enc", 1, pg.Set{Column: "status", Value: make(chan int)})
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("Upsert of an unencodable value: %v, want InvalidArgument", err)
	}
	secret := struct{ S string }{"s3cr3t-value"}
	_, err = g.Update(ctx, pool, "enc", 1, pg.Set{Column: "note", Value: secret})
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("Update of an unencodable value: %v, want InvalidArgument", err)
	}
	if err != nil && strings.Contains(fmt.Sprintf("%v %+v", err, err), "s3cr3t") {
		t.Errorf("error echoes the value: %v", err)
	}
	if _, found := readJob(t, pool, "enc"); found {
		t.Error("row written")
	}
}

// gset is the Set of a grant guard's grant column: the writer's GrantID.
func gset(grant string) pg.Set { return pg.Set{Column: "fence_grant", Value: grant} }
