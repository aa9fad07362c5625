package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
)

// programBin builds this example once: run starts it as the request
// processes.
func programBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pglease-cleanup-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "cleanup")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/pglease/pglease/examples/cleanup").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// TestCleanupDesign runs the cleanup design with request processes: of
// concurrent requests for one address exactly one runs and the others
// answer busy at once; a request killed with SIGKILL mid-cleanup leaves
// the lock free for the next one; the time limit (2 s here) stops a long
// cleanup, which answers 504, and the lock is free once it returned. run
// checks each itself; the test checks the runs table independently, and
// that the address never appears in the output.
func TestCleanupDesign(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	url := pgtest.SchemaURL(t)
	var out bytes.Buffer
	err := run(ctx, &out, url, Options{Bin: programBin(t), Limit: 2 * time.Second, Work: time.Second})
	s := out.String()
	t.Logf("\n%s", s)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, want := range []string{"409 ORPHAN_CLEANUP_009 at once", "Inspect: orphan-cleanup held by backend", "after the kill",
		"stopped at the limit: 504", "released when the timed-out request returned", "never two at once"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(strings.ToLower(s), "orphaned.user") {
		t.Error("the output shows the e-mail address")
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT coalesce(outcome, 'killed') FROM cleanup_runs ORDER BY started`)
	if err != nil {
		t.Fatal(err)
	}
	outcomes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(outcomes, ","), "done,killed,done,stopped,done"; got != want {
		t.Errorf("runs %s, want %s", got, want)
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d advisory locks left", left)
	}
}

// TestCleanupRequestInProcess calls the request handler itself (the
// processes of TestCleanupDesign run the same function): two requests
// for one address that try the lock together, one runs and one answers
// busy; an invalid address is refused before any lock.
func TestCleanupRequestInProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := pgtest.SchemaURL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, schemaSQL); err != nil {
		t.Fatal(err)
	}
	email := fmt.Sprintf("in-process-%d@example.com", time.Now().UnixNano())
	var ready, tryTogether sync.WaitGroup
	ready.Add(2)
	tryTogether.Add(1)
	answers := make([]response, 2)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			answers[i] = cleanupOrphanedUser(ctx, url, email, 10*time.Second, time.Second,
				func() { ready.Done(); tryTogether.Wait() }, func(int32) {})
		})
	}
	ready.Wait()
	tryTogether.Done()
	wg.Wait()
	statuses := []int{answers[0].Status, answers[1].Status}
	slices.Sort(statuses)
	if !slices.Equal(statuses, []int{200, 409}) {
		t.Fatalf("answers %+v, want one 200 and one 409", answers)
	}
	if bad := cleanupOrphanedUser(ctx, url, "   ", time.Second, time.Millisecond, func() {}, func(int32) {}); bad.Status != 400 {
		t.Errorf("an empty address: %+v, want 400", bad)
	}
}
