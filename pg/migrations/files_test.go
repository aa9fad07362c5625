package migrations_test

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"testing"

	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrations"
)

var update = flag.Bool("update", false, "rewrite the migration files from pg.Migrations and pg.DesignMigrations")

// wantFiles is every file the package should hold, by path.
func wantFiles(t *testing.T) map[string]string {
	t.Helper()
	ms, err := pg.Migrations(pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	add := func(dir, gooseDir string, ms []pg.Migration) {
		for _, m := range ms {
			base := fmt.Sprintf("%04d_%s", m.Version, m.Name)
			files[path.Join(dir, base+".up.sql")] = m.Up
			files[path.Join(dir, base+".down.sql")] = m.Down
			files[path.Join(gooseDir, base+".sql")] = "-- +goose Up\n-- +goose StatementBegin\n" + m.Up +
				"-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n" + m.Down + "-- +goose StatementEnd\n"
		}
	}
	add(migrations.Dir, migrations.GooseDir, ms)
	add(migrations.DesignsDir, migrations.DesignsGooseDir, pg.DesignMigrations())
	return files
}

// The files are exactly what pg renders for the default names; -update
// rewrites them.
func TestFilesUpToDate(t *testing.T) {
	want := wantFiles(t)
	if *update {
		for p, s := range want {
			if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	var have []string
	err := fs.WalkDir(migrations.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		have = append(have, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var wantPaths []string
	for p := range want {
		wantPaths = append(wantPaths, p)
	}
	slices.Sort(wantPaths)
	if !slices.Equal(have, wantPaths) && !*update {
		t.Fatalf("files %v, want %v: run go test ./pg/migrations -update", have, wantPaths)
	}
	for _, p := range wantPaths {
		b, err := os.ReadFile(p) // the source tree, not the embedded copy: -update just wrote it
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != want[p] {
			t.Fatalf("%s is stale: run go test ./pg/... -run 'TestSchemaFile|TestFilesUpToDate' -update", p)
		}
	}
}
