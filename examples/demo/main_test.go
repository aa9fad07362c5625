package main

import (
	"bytes"
	"context"
	"errors"
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

// workerBin builds examples/worker into the test's temporary directory,
// which the test removes when it ends (a shared directory would outlive
// the test binary: TestMain exits through pgtest.Main).
func workerBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/pglease/pglease/examples/worker").CombinedOutput()
	if err != nil {
		t.Fatalf("building the worker: %v\n%s", err, out)
	}
	return bin
}

// shortOptions: TTL 2 s (the demo's default), not 1 s: on a loaded CI
// box (load ~30 on 2 cores) a 1 s lease's 0.9 s trust window was used up
// by a slow grant and first extend, the worker frozen right after that
// grant had lost its lease before the SIGSTOP, and its late write then
// landed (rightly: nobody had taken the job) instead of being refused.
func shortOptions(t *testing.T) Options {
	return Options{Workers: 3, Jobs: 3, TTL: 2 * time.Second, WorkMin: 1200 * time.Millisecond, WorkMax: 1600 * time.Millisecond,
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
	// Heartbeats are summarized: one explained line, then a count per
	// holding.
	if n := strings.Count(s, " extended "); n != 1 {
		t.Errorf("%d heartbeat lines, want 1 (then counts)", n)
	}
	if !regexp.MustCompile(`heartbeat renewed its lease \d+×`).MatchString(s) {
		t.Error("no holding reports its heartbeat extends")
	}
	// The final table shows each job's final state, not "running".
	_, table, _ := strings.Cut(s, "jobs table at the end")
	table, _, _ = strings.Cut(table, "OK:")
	if strings.Contains(table, "running") || !regexp.MustCompile(`job-\d +\d+ +(done|interrupted) `).MatchString(table) {
		t.Errorf("final table:\n%s", table)
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
