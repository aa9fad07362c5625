package pg_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// wantSchemaMissing checks that err is InvalidArgument, says how to create
// the schema, keeps the SQLSTATE reachable and has one "pglease:" prefix.
func wantSchemaMissing(t *testing.T, what string, err error, sqlstate string) {
	t.Helper()
	if !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("%s: %v, want InvalidArgument", what, err)
	}
	if !strings.Contains(err.Error(), "run SetupSchema or apply pg/migrate/sql/schema.sql") {
		t.Fatalf("%s: %q does not say how to create the schema", what, err)
	}
	if n := strings.Count(err.Error(), "pglease:"); n != 1 {
		t.Fatalf("%s: %q has %d prefixes", what, err, n)
	}
	var st interface{ SQLState() string }
	if !errors.As(err, &st) || st.SQLState() != sqlstate {
		t.Fatalf("%s: %v: SQLSTATE not %s", what, err, sqlstate)
	}
}

// TestMissingSchemaSaysHowToCreateIt: operations on a database where
// SetupSchema never ran, or whose lock table is gone, say how to create
// the schema, with one "pglease:" prefix: an acquire's schema check
// (migrate.SchemaError) before the first acquire, and for statements that
// meet a missing function (42883) or table (42P01) "run SetupSchema or
// apply pg/migrate/sql/schema.sql" — through pg.Store and through the
// Manager.
func TestMissingSchemaSaysHowToCreateIt(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	pool, _ := pgtest.Pool(t) // a fresh, empty schema
	s, err := pg.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wantSchemaCheck := func(what string, err error) {
		t.Helper()
		var se *migrate.SchemaError
		if !errors.Is(err, pglease.ErrInvalidArgument) || !errors.As(err, &se) || se.Found != 0 ||
			!strings.Contains(err.Error(), "SetupSchema") || strings.Count(err.Error(), "pglease:") != 1 {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err = s.Acquire(c, "k", time.Second)
	wantSchemaCheck("pg.Acquire without schema", err)
	_, err = s.Release(c, "AAAAAAAAAAAAAAAAAAAAAA")
	wantSchemaMissing(t, "pg.Release without schema", err, "42883")
	_, err = s.IsLocked(c, "k")
	wantSchemaMissing(t, "pg.IsLocked without schema", err, "42P01")

	m, err := manager.New(pool, manager.Config{DisableNotify: true, AcquireTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(c)
	_, _, err = m.TryAcquire(c, "k")
	wantSchemaCheck("manager.TryAcquire without schema", err)

	// Schema set up, then the lock table dropped behind pglease's back.
	if err := m.SetupSchema(c); err != nil {
		t.Fatal(err)
	}
	// (CASCADE: the SQL API's views depend on it.)
	if _, err := pool.Exec(c, "DROP TABLE syncguard_locks CASCADE"); err != nil {
		t.Fatal(err)
	}
	_, _, err = m.TryAcquire(c, "k")
	wantSchemaMissing(t, "manager.TryAcquire without lock table", err, "42P01")
	setupSchema(t, pool, pg.Config{}) // the recorded version is current: nothing to do
	_, err = s.Acquire(c, "k", time.Second)
	wantSchemaMissing(t, "pg.Acquire without lock table", err, "42P01")
}

// TestMissingUserTableIsNotSchemaAdvice: a FenceGuard on the user's own
// table that does not exist gets the plain server error, not advice about
// pglease's schema.
func TestMissingUserTableIsNotSchemaAdvice(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	g, err := pg.NewFenceGuard("no_such_table", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Update(ctx(t), pool, 1, pglease.Fence(1), pg.Set{Column: "x", Value: 1})
	if !errors.Is(err, pglease.ErrInvalidArgument) || strings.Contains(err.Error(), pgerr.SchemaMissing) {
		t.Fatalf("FenceGuard on a missing table: %v", err)
	}
}
