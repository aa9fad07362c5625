package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(m.Run()) // a child of TestPgBouncerGoneWhenParentKilled: no database of its own
	}
	pgtest.Main(m)
}

func TestPoolIsolatedSchema(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t)
	var got string
	if err := pool.QueryRow(context.Background(), "SELECT current_schema()").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != schema {
		t.Fatalf("current_schema = %q, want %q", got, schema)
	}
	if _, err := pool.Exec(context.Background(), "CREATE TABLE x (a int)"); err != nil {
		t.Fatal(err)
	}
}

func TestServerRunsUnprivileged(t *testing.T) {
	t.Parallel()
	c := pgtest.ClusterForTest()
	if c == nil {
		t.Skip("tests run on DATABASE_URL; no throwaway cluster")
	}
	pool, _ := pgtest.Pool(t)
	var pid int
	if err := pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			if f[1] == "0" {
				t.Fatalf("server backend runs as root")
			}
			return
		}
	}
	t.Fatal("no Uid line in /proc status")
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u@h:5/a?sslmode=disable": "postgres://u@h:5/b?sslmode=disable",
		"postgresql://h/":                    "postgresql://h/b",
		"host=h dbname=a":                    "host=h dbname=a dbname=b",
	} {
		if got := pgtest.WithDatabase(in, "b"); got != want {
			t.Errorf("WithDatabase(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSchemaURL(t *testing.T) {
	t.Parallel()
	u := pgtest.SchemaURL(t)
	conn, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var got string
	if err := conn.QueryRow(context.Background(), "SELECT current_schema()").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "t_") {
		t.Fatalf("current_schema = %q, want a fresh t_ schema", got)
	}
}
