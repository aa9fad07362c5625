package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestSQLDocBlocks runs every ```sql block of docs/sql.md, in order, with
// psql (its \gset included) as the owner role of a schema set up by
// roles.sql, and checks the page's claims about guarded tables that are
// not blocks: INSERT … ON CONFLICT DO NOTHING of an existing row is
// refused, the backfill loaded its rows under the guard's reinstall.
func TestSQLDocBlocks(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql is not installed")
	}
	doc, err := os.ReadFile("../../docs/sql.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) < 4 {
		t.Fatalf("docs/sql.md has %d sql blocks", len(blocks))
	}
	var script strings.Builder
	for _, b := range blocks {
		script.WriteString(b[1])
		script.WriteString("\n")
	}
	rs := pgtest.RoleSchemaForTest(t)
	cfg, err := pgconn.ParseConfig(rs.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	cmd := exec.CommandContext(c, psql, "-X", "-v", "ON_ERROR_STOP=1", "-h", cfg.Host, "-p", fmt.Sprint(cfg.Port),
		"-U", cfg.User, "-d", cfg.Database, "-f", "-")
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+rs.Schema, "PGPASSWORD="+cfg.Password)
	cmd.Stdin = strings.NewReader(script.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql ran docs/sql.md's blocks: %v\n%s", err, out)
	}
	for _, want := range []string{"granted", "still_held"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("psql output lacks %q:\n%s", want, out)
		}
	}

	owner, err := pgx.Connect(c, rs.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owner.Close(context.Background()) })
	var n int
	if err := owner.QueryRow(c, "SELECT count(*) FROM docs_orders").Scan(&n); err != nil || n != 100 {
		t.Fatalf("docs_orders has %d rows (%v), want 100", n, err)
	}
	if err := owner.QueryRow(c, "SELECT count(*) FROM docs_ledger").Scan(&n); err != nil || n != 1 {
		t.Fatalf("docs_ledger has %d rows (%v), want the one docs_post wrote under the strict guard", n, err)
	}
	_, err = owner.Exec(c, "INSERT INTO docs_orders (id, account) VALUES (1, 'acct-1') ON CONFLICT DO NOTHING")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "PGL10" {
		t.Fatalf("INSERT … ON CONFLICT DO NOTHING of an existing row = %v, want PGL10 as docs/sql.md says", err)
	}
	var held bool
	if err := owner.QueryRow(c, "SELECT held FROM syncguard_locks_status('jobs:nightly-export')").Scan(&held); err != nil || held {
		t.Fatalf("the pg_cron example's lease: held %v (%v), want released", held, err)
	}
}
