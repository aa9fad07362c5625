package exampledb

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSchemaLeavesNothingInPublic: what an example creates through the
// schema URL (pglease's tables and its own) lands in the example's schema,
// nothing in public, and drop removes it all.
func TestSchemaLeavesNothingInPublic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := pgtest.URL(t)
	for _, form := range []string{base, "dbname=" + dbName(t, base) + " " + hostPort(t, base)} {
		surl, name, drop, err := Schema(ctx, form, "pglease_example")
		if err != nil {
			t.Fatal(err)
		}
		m, err := manager.Open(ctx, surl, manager.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetupSchema(ctx); err != nil {
			t.Fatal(err)
		}
		lk, err := m.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if n := tables(t, base, name); n < 2 {
			t.Fatalf("%d tables in %s, want pglease's two", n, name)
		}
		if n := tables(t, base, "public"); n != 0 {
			t.Fatalf("%d tables in public", n)
		}
		if err := drop(ctx); err != nil {
			t.Fatal(err)
		}
		if n := tables(t, base, name); n != 0 {
			t.Fatalf("%d tables left in %s after drop", n, name)
		}
	}
}

func tables(t *testing.T, url, schema string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func dbName(t *testing.T, url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// hostPort returns "host=… port=… user=…" of url, for the keyword/value form.
func hostPort(t *testing.T, url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	s := "host=" + cfg.Host + " port=" + strconv.Itoa(int(cfg.Port)) + " user=" + cfg.User
	if cfg.Password != "" {
		s += " password=" + cfg.Password
	}
	return s
}
