package pg_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
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

func readJob(t *testing.T, db pg.DB, id string) (jobRow, bool) {
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
	many := make([]pg.Set, pg.MaxFencedColumns+1)
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
		{"fence > max", func() (bool, error) { return g.Update(ctx, closed, "a", pglease.FenceMax+1) }, pglease.CodeInvalidArgument},
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
