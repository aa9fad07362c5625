package migrate_test

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

var update = flag.Bool("update", false, "TestSQLFiles: rewrite pg/migrate/sql from migrate.SQL(pg.Config{})")

// readAll returns every file of fsys by path.
func readAll(t *testing.T, fsys fs.FS) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		out[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSQLFiles: the files in pg/migrate/sql are exactly what SQL renders
// for the default names (nothing in the tree is copied by hand); -update
// rewrites them.
func TestSQLFiles(t *testing.T) {
	fsys, err := migrate.SQL(pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := readAll(t, fsys)
	if *update {
		if err := os.RemoveAll("sql"); err != nil {
			t.Fatal(err)
		}
		for p, s := range want {
			f := filepath.Join("sql", filepath.FromSlash(p))
			if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	have := readAll(t, os.DirFS("sql"))
	var wantPaths, havePaths []string
	for p := range want {
		wantPaths = append(wantPaths, p)
	}
	for p := range have {
		havePaths = append(havePaths, p)
	}
	slices.Sort(wantPaths)
	slices.Sort(havePaths)
	if !slices.Equal(havePaths, wantPaths) {
		t.Fatalf("pg/migrate/sql holds %v, want %v: run go test ./pg/migrate -run TestSQLFiles -update", havePaths, wantPaths)
	}
	for _, p := range wantPaths {
		if have[p] != want[p] {
			t.Fatalf("pg/migrate/sql/%s is stale: run go test ./pg/migrate -run TestSQLFiles -update", p)
		}
	}
}

// TestSQLFS: the file system SQL returns behaves as io/fs requires (the
// migration tools walk it), with and without the release trigger's files.
func TestSQLFS(t *testing.T) {
	for _, cfg := range []pg.Config{{}, {LockTable: "app.locks", FenceTable: "app.fences", NotifyChannel: "app_release"}} {
		fsys, err := migrate.SQL(cfg)
		if err != nil {
			t.Fatal(err)
		}
		files := []string{"schema.sql", "roles.sql", "migrations/0001_syncguard_tables.up.sql", "migrations/0003_acquire_holder_expiry.down.sql",
			"goose/0002_pglease_functions.sql", "designs/migrations/0001_advisory_design_functions.up.sql", "designs/goose/0001_advisory_design_functions.sql"}
		if cfg.NotifyChannel != "" {
			files = append(files, "release_trigger.sql", "release_trigger_drop.sql")
		} else if _, err := fs.Stat(fsys, "release_trigger.sql"); err == nil {
			t.Fatal("release_trigger.sql without a NotifyChannel")
		}
		if err := fstest.TestFS(fsys, files...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrate.SQL(pg.Config{LockTable: "bad name"}); err == nil {
		t.Fatal("SQL accepted a bad table name")
	}
}
