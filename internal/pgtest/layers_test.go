package pgtest_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNoImportUpTheLayers: the packages under internal/ sit below the
// public packages that use them (pg, pg/migrate, pg/advisory, manager,
// telemetry, the CLI): none of them imports one of those (tests apart: an
// external test package may). Package telemetry registers its recorder
// in internal/obs, as pg/migrate registers the schema set-up in the
// store. The test harness sets the lease schema up with what
// pg/migrate registers in the store (store.Setup), and the programs that
// drive the Manager (the soak, the benchmarks) live beside it, at the top.
func TestNoImportUpTheLayers(t *testing.T) {
	const mod = "github.com/pglease/pglease/"
	up := []string{"pg", "manager", "telemetry", "cmd", "soak", "bench", "examples"}
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			rest, ok := strings.CutPrefix(path, mod)
			if !ok {
				continue
			}
			top, _, _ := strings.Cut(rest, "/")
			for _, u := range up {
				if top == u {
					t.Errorf("%s imports %s: up the package layers", p, path)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Fatalf("checked %d files under internal/: the walk did not find the tree", checked)
	}
}
