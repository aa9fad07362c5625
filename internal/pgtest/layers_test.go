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
// The Manager's own rooms (manager/internal: the kernel, the listening
// service) sit below the public manager package and import none of the
// packages built on it.
func TestNoImportUpTheLayers(t *testing.T) {
	root := filepath.Join("..", "..")
	layers := []struct {
		dir string   // under the module root
		up  []string // import paths (and the paths under them) it must not import
		min int      // files the walk must find
	}{
		{"internal", []string{"pg", "manager", "telemetry", "cmd", "soak", "bench", "examples"}, 20},
		{"manager/internal", []string{"manager", "election", "pgleasetest", "pg/migrate", "pg/advisory", "cmd", "soak", "bench", "examples"}, 10},
	}
	for _, l := range layers {
		checkLayer(t, root, l.dir, l.up, l.min)
	}
}

func checkLayer(t *testing.T, root, dir string, up []string, min int) {
	const mod = "github.com/pglease/pglease/"
	checked := 0
	err := filepath.WalkDir(filepath.Join(root, filepath.FromSlash(dir)), func(p string, d fs.DirEntry, err error) error {
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
			if strings.HasPrefix(rest, "manager/internal/") && !strings.HasPrefix(dir, "internal") {
				continue // a room of the Manager's using another
			}
			for _, u := range up {
				if rest == u || strings.HasPrefix(rest, u+"/") {
					t.Errorf("%s imports %s: up the package layers", p, path)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < min {
		t.Fatalf("checked %d files under %s/: the walk did not find the tree", checked, dir)
	}
}
