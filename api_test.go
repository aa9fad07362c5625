package pglease_test

// The exported API is recorded in api/v0.1.0.txt, one line per exported
// name with its signature, the way Go records its own API (api/go1.N.txt).
// TestAPI fails when the code's API differs from the file, so no exported
// name changes without somebody saying so: when a change is intended,
// refresh the file with
//
//	go test -run TestAPI . -update-api
//
// and say what users do differently in CHANGELOG.md.

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update-api", false, "TestAPI: rewrite api/v0.1.0.txt from the code")

const (
	apiFile    = "api/v0.1.0.txt"
	modulePath = "github.com/pglease/pglease"
)

func TestAPI(t *testing.T) {
	got := strings.Join(apiLines(t, "."), "\n") + "\n"
	if *updateAPI {
		if err := os.MkdirAll(filepath.Dir(apiFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(apiFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	wantB, err := os.ReadFile(apiFile)
	if err != nil {
		t.Fatalf("%v: record the API with go test -run TestAPI . -update-api", err)
	}
	want := strings.Split(strings.TrimSuffix(string(wantB), "\n"), "\n")
	have := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	var added, removed []string
	for _, l := range have {
		if !slices.Contains(want, l) {
			added = append(added, l)
		}
	}
	for _, l := range want {
		if !slices.Contains(have, l) {
			removed = append(removed, l)
		}
	}
	if len(added)+len(removed) > 0 {
		t.Errorf("the exported API differs from %s (an unannounced API change):\n+ %s\n- %s\n"+
			"If the change is intended, run go test -run TestAPI . -update-api and add a line to CHANGELOG.md.",
			apiFile, strings.Join(added, "\n+ "), strings.Join(removed, "\n- "))
	}
}

// apiLines lists the exported API of every public package of the module
// rooted at root: packages that are not internal, not main, not under
// examples/, bench/ or testdata/, and not in another module.
func apiLines(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		base := d.Name()
		if p != root {
			if strings.HasPrefix(base, ".") || base == "internal" || base == "testdata" || base == "examples" || base == "bench" || base == "cmd" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		dirs = append(dirs, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, dir := range dirs {
		fset := token.NewFileSet()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var files []*ast.File
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		if len(files) == 0 || files[0].Name.Name == "main" {
			continue
		}
		path := modulePath
		if dir != root {
			path += "/" + filepath.ToSlash(dir)
		}
		for _, l := range packageAPI(fset, files) {
			lines = append(lines, "pkg "+path+", "+l)
		}
	}
	slices.Sort(lines)
	return lines
}

// packageAPI returns one line per exported declaration of a package's
// files.
func packageAPI(fset *token.FileSet, files []*ast.File) []string {
	src := func(n ast.Node) string {
		var b bytes.Buffer
		_ = printer.Fprint(&b, fset, n)
		return strings.Join(strings.Fields(b.String()), " ")
	}
	exportedType := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, s := range g.Specs {
					if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
						exportedType[ts.Name.Name] = true
					}
				}
			}
		}
	}
	var out []string
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				sig := strings.TrimPrefix(src(d.Type), "func")
				if d.Recv == nil {
					out = append(out, "func "+d.Name.Name+sig)
					continue
				}
				recv := src(d.Recv.List[0].Type)
				if !exportedType[strings.TrimPrefix(recv, "*")] {
					continue
				}
				out = append(out, "method ("+recv+") "+d.Name.Name+sig)
			case *ast.GenDecl:
				var lastType ast.Expr // a const without a type repeats the one before it (iota)
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						out = append(out, typeAPI(s, src)...)
					case *ast.ValueSpec:
						kind := "var"
						if d.Tok == token.CONST {
							kind = "const"
						}
						typ := s.Type
						if d.Tok == token.CONST {
							if typ == nil && len(s.Values) == 0 {
								typ = lastType
							}
							if len(s.Values) > 0 || s.Type != nil {
								lastType = s.Type
							}
						}
						for _, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							l := kind + " " + n.Name
							if typ != nil {
								l += " " + src(typ)
							}
							out = append(out, l)
						}
					}
				}
			}
		}
	}
	return out
}

// typeAPI describes an exported type: its kind, and for structs and
// interfaces each exported field or method on a line of its own.
func typeAPI(s *ast.TypeSpec, src func(ast.Node) string) []string {
	name := s.Name.Name
	if s.TypeParams != nil {
		name += src(s.TypeParams)
	}
	if s.Assign.IsValid() {
		return []string{"type " + name + " = " + src(s.Type)}
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		out := []string{"type " + name + " struct"}
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 { // embedded
				e := src(f.Type)
				if ast.IsExported(strings.TrimPrefix(e[strings.LastIndex(e, ".")+1:], "*")) {
					out = append(out, fmt.Sprintf("type %s struct, embedded %s", name, e))
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					out = append(out, fmt.Sprintf("type %s struct, %s %s", name, n.Name, src(f.Type)))
				}
			}
		}
		return out
	case *ast.InterfaceType:
		out := []string{"type " + name + " interface"}
		for _, m := range t.Methods.List {
			if len(m.Names) == 0 {
				out = append(out, fmt.Sprintf("type %s interface, embedded %s", name, src(m.Type)))
				continue
			}
			for _, n := range m.Names {
				if n.IsExported() {
					out = append(out, fmt.Sprintf("type %s interface, %s%s", name, n.Name, strings.TrimPrefix(src(m.Type), "func")))
				}
			}
		}
		return out
	default:
		return []string{"type " + name + " " + src(s.Type)}
	}
}
