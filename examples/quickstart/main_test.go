package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var wantOutput = regexp.MustCompile(`^charging payment 123 under fence 0000000000000\d\d
writing the daily report
running job 42 under fence 0000000000000\d\d
$`)

// TestRun runs the quick start in-process (with -race) against the
// package's database.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := captureStdout(t, func() {
		if err := run(ctx, pgtest.URL(t)); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	if !wantOutput.MatchString(out) {
		t.Fatalf("output:\n%s", out)
	}
}

// TestRunReportHeldElsewhere: when another holder has report:daily,
// TryAcquire's ok is false and the quick start neither fails nor touches a
// nil lock.
func TestRunReportHeldElsewhere(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	other, err := manager.New(pool, manager.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if err := other.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := other.Acquire(ctx, "report:daily")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	out := captureStdout(t, func() {
		if err := run(ctx, pgtest.URL(t)); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	if !strings.Contains(out, "someone else is writing the daily report\n") || !strings.Contains(out, "running job 42 under fence ") {
		t.Fatalf("output:\n%s", out)
	}
}

// TestQuickStartPastedIntoNewModule does what the README tells a new user:
// the Quick start block, taken from README.md itself, is pasted into a new
// module (go 1.25, pglease replaced by this checkout), `go mod tidy`,
// built and run against the database.
func TestQuickStartPastedIntoNewModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a new module")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	code := readmeBlock(t, string(readme), "examples/quickstart/main.go")
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("main.go", code)
	write("go.mod", "module example.com/quickstart\n\ngo 1.25.0\n\n"+
		"require github.com/pglease/pglease v0.0.0\n\n"+
		"replace github.com/pglease/pglease => "+root+"\n")
	goCmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...) // go test puts its own go first on PATH
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	goCmd("mod", "tidy")
	goCmd("build", "-o", "quickstart", ".")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "quickstart"))
	cmd.Env = append(os.Environ(), "DATABASE_URL="+pgtest.URL(t))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("quickstart: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !wantOutput.MatchString(stdout.String()) {
		t.Fatalf("output:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}

// readmeBlock returns the ```go block that follows <!-- code: src -->.
func readmeBlock(t *testing.T, readme, src string) string {
	t.Helper()
	marker := "<!-- code: " + src + " -->\n```go\n"
	i := strings.Index(readme, marker)
	if i < 0 {
		t.Fatalf("README.md has no block marked %q", marker)
	}
	rest := readme[i+len(marker):]
	j := strings.Index(rest, "\n```\n")
	if j < 0 {
		t.Fatal("README.md: unterminated block")
	}
	return rest[:j+1]
}

// captureStdout runs f with os.Stdout redirected and returns what it
// printed.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	defer func() { os.Stdout = saved }()
	f()
	os.Stdout = saved
	w.Close()
	return <-done
}
