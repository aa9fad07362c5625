package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// workerBin builds examples/worker once for the package's tests.
func workerBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "pglease-demo-test-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "worker")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/pglease/pglease/examples/worker").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func shortOptions(t *testing.T) Options {
	return Options{Workers: 3, Jobs: 3, TTL: time.Second, WorkMin: 1200 * time.Millisecond, WorkMax: 1600 * time.Millisecond,
		Normal: 2 * time.Second, Tail: 500 * time.Millisecond, WorkerBin: workerBin(t)}
}

// lockIDLike matches a standalone 22-character base64url token: the shape
// of a lockId (hashes are 24 hex digits and do not match).
var lockIDLike = regexp.MustCompile(`(^|[^A-Za-z0-9_-])[A-Za-z0-9_-]{22}([^A-Za-z0-9_-]|$)`)

// TestDemo runs the whole scenario in a shortened configuration: run
// returns an error unless the frozen worker's loss was reported after
// SIGCONT, another worker took over with a higher fence, the late write
// was refused, fences grew strictly per job and the rows carry the last
// granted fence.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	start := time.Now()
	err := run(ctx, &out, pgtest.URL(t), shortOptions(t))
	t.Logf("demo took %v", time.Since(start))
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"SIGSTOP", "TAKEOVER", "SIGCONT", "LOST", "REFUSED by the fenced UPDATE", "late writes refused by the fence: 1, accepted: 0", "OK:"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if m := lockIDLike.FindString(s); m != "" {
		t.Errorf("output contains a lockId-like token %q", m)
	}
	assertNoLiveLocks(t)
}

// TestDemoInterrupted cancels the demo (Ctrl-C) while the workers hold
// locks: run returns promptly, every worker has exited (run waits for
// them) and released its locks.
func TestDemoInterrupted(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := shortOptions(t)
	o.SkipIntro = true
	done := make(chan error, 1)
	go func() { done <- run(ctx, &syncWriter{w: &out}, pgtest.URL(t), o) }()
	// Cancel once some worker holds a job.
	deadline := time.After(20 * time.Second)
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	since := time.Now()
	for held := false; !held; {
		select {
		case <-deadline:
			t.Fatal("no worker acquired a job")
		case <-time.After(50 * time.Millisecond):
		}
		_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pglease_demo_jobs WHERE status = 'running' AND updated_at > $1)`, since).Scan(&held)
	}
	t.Logf("a worker holds a job after %v; cancelling", time.Since(since))
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("run = %v, want context.Canceled", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	assertNoLiveLocks(t)
}

func assertNoLiveLocks(t *testing.T) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM syncguard_locks WHERE user_key LIKE 'demo:job-%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d job locks still held after the demo", n)
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
