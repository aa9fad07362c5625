package pglease_test

// README code is compiled and run: how it works, and how to add a block.
//
// Every ```go block in a Markdown file of this module (README.md, docs/*.md,
// examples/README.md, …) is a copy of Go code that the test suite compiles
// and runs against a real PostgreSQL. TestMarkdownGoBlocks fails when a
// block drifts from its source, or when a block has no source.
//
//  1. Write the code where a test runs it:
//     - a whole program: package main in examples/<name>/main.go, whose
//       main_test.go (with pgtest.Main) calls it — see examples/quickstart;
//     - a snippet: a region of an Example function with an // Output:
//       comment (Examples without one are compiled, never run), of a Test
//       function, or of a function that one of those calls (directly or
//       through other functions of the same directory). Packages with
//       database examples use pgtest.Main, so DATABASE_URL is a real
//       database of their own.
//     Mark a region with two comment lines (the block is the lines between
//     them, with the indentation of the begin line removed; marker lines of
//     other regions inside it are left out):
//
//     // readme:begin store
//     store, err := pg.New(pool, pg.Config{})
//     …
//     // readme:end store
//
//  2. In the Markdown file, put the source on the line before the block:
//
//     <!-- code: pg/example_test.go#store -->
//     ```go
//     …
//     ```
//
//     (no #region: the whole file). Paths are relative to the module root.
//
//  3. Fill in or refresh the block from the source with
//
//     go test -run TestMarkdownGoBlocks . -update
//
//     and check that the source runs: go run ./internal/cmd/withpg -- go test ./<its package>.
//
// A block that is not Go code (shell, SQL, output) uses another fence tag
// (```sh, ```sql, ```text). Blocks inside lists or quotes (indented fences)
// are refused: keep Go blocks at the top level.

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update", false, "TestMarkdownGoBlocks: rewrite Markdown Go blocks from their sources")

var (
	codeMarker  = regexp.MustCompile(`^<!--\s*code:\s*([^\s#]+)(?:#([A-Za-z0-9_.-]+))?\s*-->\s*$`)
	goFence     = regexp.MustCompile("^(\\s*)```+\\s*(go|golang)\\s*$")
	anyFence    = regexp.MustCompile("^(\\s*)(```+)")
	regionBegin = regexp.MustCompile(`^(\s*)// readme:begin ([A-Za-z0-9_.-]+)\s*$`)
	regionEnd   = regexp.MustCompile(`^\s*// readme:end ([A-Za-z0-9_.-]+)\s*$`)
	anyRegion   = regexp.MustCompile(`^\s*// readme:(begin|end) `)
)

// goBlock is one ```go block of a Markdown file.
type goBlock struct {
	file        string // Markdown file, relative to the module root
	line        int    // 1-based line of the opening fence
	src, region string // from the code marker; src is "" when there is none
	start, end  int    // 0-based line indexes of the block's content [start, end)
	text        string
}

func TestMarkdownGoBlocks(t *testing.T) {
	mdFiles := markdownFiles(t)
	if len(mdFiles) == 0 || !contains(mdFiles, "README.md") {
		t.Fatalf("found no README.md among %v", mdFiles)
	}
	n := 0
	for _, md := range mdFiles {
		data, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		blocks, errs := parseGoBlocks(md, lines)
		for _, e := range errs {
			t.Error(e)
		}
		changed := false
		// Replace from the last block backwards so earlier indexes stay valid.
		for i := len(blocks) - 1; i >= 0; i-- {
			b := blocks[i]
			n++
			if b.src == "" {
				t.Errorf("%s:%d: ```go block without a source: put <!-- code: path/to/file.go#region --> on the line before it (see readme_test.go)", b.file, b.line)
				continue
			}
			want, err := sourceText(b.src, b.region)
			if err != nil {
				t.Errorf("%s:%d: %v", b.file, b.line, err)
				continue
			}
			if err := checkRuns(b.src, b.region); err != nil {
				t.Errorf("%s:%d: %s is not run by the tests: %v", b.file, b.line, b.src, err)
			}
			if want == b.text {
				continue
			}
			if *updateDocs {
				repl := strings.Split(strings.TrimSuffix(want, "\n"), "\n")
				lines = append(lines[:b.start], append(repl, lines[b.end:]...)...)
				changed = true
				continue
			}
			t.Errorf("%s:%d: the block differs from %s%s (run: go test -run TestMarkdownGoBlocks . -update)\n%s",
				b.file, b.line, b.src, regionSuffix(b.region), firstDifference(b.text, want))
		}
		if changed {
			if err := os.WriteFile(md, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("updated %s", md)
		}
	}
	if n == 0 {
		t.Fatal("no ```go block found: the README lost its code?")
	}
}

// TestMarkdownGoBlocksCheck proves the check can fail: a drifted block, a
// block without source, and a region outside anything the tests run.
func TestMarkdownGoBlocksCheck(t *testing.T) {
	md := []string{
		"intro",
		"<!-- code: readme_test.go#selftest -->",
		"```go",
		"x := 1",
		"```",
		"",
		"```go",
		"y := 2",
		"```",
		"  ```go",
		"  z := 3",
		"  ```",
	}
	blocks, errs := parseGoBlocks("x.md", md)
	if len(blocks) != 2 || len(errs) != 1 {
		t.Fatalf("blocks %+v errs %v: want 2 blocks and 1 error (the indented fence)", blocks, errs)
	}
	if blocks[0].src != "readme_test.go" || blocks[0].region != "selftest" || blocks[0].text != "x := 1\n" {
		t.Fatalf("block 0: %+v", blocks[0])
	}
	if blocks[1].src != "" {
		t.Fatalf("block 1 has a source: %+v", blocks[1])
	}
	got, err := sourceText("readme_test.go", "selftest")
	if err != nil {
		t.Fatal(err)
	}
	if got != "if len(md) == 0 {\n\tt.Fatal(\"unreachable\")\n}\n" {
		t.Fatalf("region selftest = %q", got)
	}
	if got == blocks[0].text {
		t.Fatal("a drifted block compares equal")
	}
	// readme:begin selftest
	if len(md) == 0 {
		t.Fatal("unreachable")
	}
	// readme:end selftest
	if err := checkRuns("readme_test.go", "selftest"); err != nil {
		t.Fatalf("a region of a Test function: %v", err)
	}
	if err := checkRuns("readme_test.go", "notrun"); err == nil {
		t.Fatal("a region of a function no test calls passes the check")
	}
	if _, err := sourceText("readme_test.go", "missing"); err == nil {
		t.Fatal("a missing region passes")
	}
}

// notRunByTests holds a region that no test or example reaches.
func notRunByTests() int {
	// readme:begin notrun
	return 1
	// readme:end notrun
}

var _ = notRunByTests

func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			if path != "." {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module: its own tests check its Markdown
				}
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			files = append(files, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// parseGoBlocks finds the ```go blocks of a Markdown file and the code
// marker before each.
func parseGoBlocks(file string, lines []string) ([]goBlock, []error) {
	var blocks []goBlock
	var errs []error
	for i := 0; i < len(lines); i++ {
		m := anyFence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		fence := m[2]
		isGo := goFence.FindStringSubmatch(lines[i])
		// Find the closing fence (same or longer run of backticks).
		end := i + 1
		for end < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[end]), fence) {
			end++
		}
		if isGo != nil && isGo[1] != "" {
			errs = append(errs, fmt.Errorf("%s:%d: indented ```go block: keep Go blocks at the top level so the check can compare them", file, i+1))
		} else if isGo != nil {
			b := goBlock{file: file, line: i + 1, start: i + 1, end: min(end, len(lines))}
			for j := i - 1; j >= 0; j-- {
				if strings.TrimSpace(lines[j]) == "" {
					continue
				}
				if mm := codeMarker.FindStringSubmatch(lines[j]); mm != nil {
					b.src, b.region = mm[1], mm[2]
				}
				break
			}
			if b.end > b.start {
				b.text = strings.Join(lines[b.start:b.end], "\n") + "\n"
			}
			blocks = append(blocks, b)
		}
		i = end
	}
	return blocks, errs
}

// sourceText returns a region of a file (or the whole file), dedented,
// without region marker lines.
func sourceText(path, region string) (string, error) {
	data, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	indent := ""
	if region != "" {
		from, to := -1, -1
		for i, l := range lines {
			if m := regionBegin.FindStringSubmatch(l); m != nil && m[2] == region {
				if from >= 0 {
					return "", fmt.Errorf("%s: region %q begins twice", path, region)
				}
				from, indent = i+1, m[1]
			}
			if m := regionEnd.FindStringSubmatch(l); m != nil && m[1] == region && from >= 0 && to < 0 {
				to = i
			}
		}
		if from < 0 || to < 0 {
			return "", fmt.Errorf("%s: no region %q (// readme:begin %s … // readme:end %s)", path, region, region, region)
		}
		lines = lines[from:to]
	}
	var b strings.Builder
	for _, l := range lines {
		if anyRegion.MatchString(l) {
			continue
		}
		if strings.TrimSpace(l) == "" {
			b.WriteString("\n")
			continue
		}
		if !strings.HasPrefix(l, indent) {
			return "", fmt.Errorf("%s: region %q: line %q is less indented than its begin marker", path, region, l)
		}
		b.WriteString(strings.TrimPrefix(l, indent))
		b.WriteString("\n")
	}
	return b.String(), nil
}

// checkRuns reports whether the code of path#region is run by the test
// suite: the function around the region (for a whole file: any function of
// it) is a Test function, an Example with output, or reachable from one
// through calls between top-level functions of the same directory.
func checkRuns(path, region string) error {
	if !strings.HasSuffix(path, ".go") {
		return fmt.Errorf("not a Go file")
	}
	dir := filepath.Dir(filepath.FromSlash(path))
	fset := token.NewFileSet()
	pkgFiles := map[string]*ast.File{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		if err != nil {
			return err
		}
		pkgFiles[e.Name()] = f
	}
	target := pkgFiles[filepath.Base(path)]
	if target == nil {
		return fmt.Errorf("not found")
	}
	for _, cg := range target.Comments {
		for _, c := range cg.List {
			if strings.HasPrefix(c.Text, "//go:build") && fset.Position(c.Pos()).Line < fset.Position(target.Package).Line {
				return fmt.Errorf("has a build constraint (%s): the suite may not compile it", c.Text)
			}
		}
	}
	// Top-level functions of the directory, and the names each one uses.
	funcs := map[string]*ast.FuncDecl{}
	for _, f := range pkgFiles {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				funcs[fd.Name.Name] = fd
			}
		}
	}
	var roots []string
	for name, f := range pkgFiles {
		if !strings.HasSuffix(name, "_test.go") {
			continue
		}
		for _, ex := range doc.Examples(f) {
			if ex.Output != "" || ex.EmptyOutput {
				roots = append(roots, "Example"+ex.Name)
			}
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
				roots = append(roots, fd.Name.Name)
			}
		}
	}
	reached := map[string]bool{}
	queue := append([]string(nil), roots...)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		fd := funcs[name]
		if reached[name] || fd == nil {
			continue
		}
		reached[name] = true
		ast.Inspect(fd, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && funcs[id.Name] != nil && !reached[id.Name] {
				queue = append(queue, id.Name)
			}
			return true
		})
	}
	// The functions that hold the region (or, for a whole file, all of them).
	var holders []string
	for _, d := range target.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil {
			continue
		}
		if region == "" {
			holders = append(holders, fd.Name.Name)
			continue
		}
		for _, cg := range target.Comments {
			for _, c := range cg.List {
				if c.Text == "// readme:begin "+region && c.Pos() > fd.Body.Lbrace && c.Pos() < fd.Body.Rbrace {
					holders = append(holders, fd.Name.Name)
				}
			}
		}
	}
	if len(holders) == 0 {
		return fmt.Errorf("region %q is not inside a function", region)
	}
	for _, h := range holders {
		if reached[h] {
			return nil
		}
	}
	return fmt.Errorf("no Test function or Example with // Output: in %s reaches %v", dir, holders)
}

func regionSuffix(region string) string {
	if region == "" {
		return ""
	}
	return "#" + region
}

func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			var b bytes.Buffer
			fmt.Fprintf(&b, "  first difference at block line %d:\n    README: %q\n    source: %q", i+1, gl, wl)
			return b.String()
		}
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
