package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// programBin builds this example once for the package's tests: run starts
// it as the scheduler processes.
func programBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pglease-registry-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "registry")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/pglease/pglease/examples/registry").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// TestRegistryDesign runs the registry design: the colliding id refused
// in code and at a process's start-up, three scheduler processes with
// exactly one run per tick, bookings serialized per tenant and date and
// parallel across tenants, and the unlocked control racing. run checks
// each of these itself; the test checks the database independently.
func TestRegistryDesign(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	url := pgtest.SchemaURL(t)
	var out bytes.Buffer
	if err := run(ctx, &out, url, Options{Bin: programBin(t)}); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Logf("\n%s", s)
	for _, want := range []string{
		"registering 42424242 again: refused",
		"colliding registry file: exit 2",
		"each tick ran exactly once",
		"1 booked, 2 refused as conflicts",
		"ran in parallel",
		"without the lock",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ticks, maxRuns, procs int
	if err := conn.QueryRow(ctx, `SELECT count(*), max(n), (SELECT count(DISTINCT proc) FROM registry_scheduler_runs)
		FROM (SELECT count(*) AS n FROM registry_scheduler_runs GROUP BY run_id, tick) s`).Scan(&ticks, &maxRuns, &procs); err != nil {
		t.Fatal(err)
	}
	if ticks != 4 || maxRuns != 1 {
		t.Errorf("scheduler: %d ticks ran, at most %d runs per tick; want 4 and 1", ticks, maxRuns)
	}
	t.Logf("the runs were spread over %d of the 3 processes", procs)
	rows, err := conn.Query(ctx, `SELECT left(tenant, 8), count(*) FROM registry_bookings GROUP BY tenant`)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Tenant string
		N      int
	}])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		switch {
		case c.Tenant == "tenant-c" && c.N < 2, c.Tenant != "tenant-c" && c.N != 1:
			t.Errorf("%s has %d bookings", c.Tenant, c.N)
		}
	}
	if len(counts) != 3 {
		t.Errorf("bookings for %d tenants, want 3", len(counts))
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

// TestSchedulerInProcess runs the scheduler function itself as two
// instances in this process (the processes of TestRegistryDesign run the
// same function): at each tick exactly one runs the cleanup.
func TestSchedulerInProcess(t *testing.T) {
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
	reg, err := loadRegistry(registryFile)
	if err != nil {
		t.Fatal(err)
	}
	const ticks = 3
	runID := time.Now().Add(500 * time.Millisecond).UnixNano()
	outs := make([]bytes.Buffer, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() {
			errs[i] = scheduler(ctx, &outs[i], url, reg, fmt.Sprintf("I%d", i+1), runID, ticks, 400*time.Millisecond)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	ran := map[int]int{}
	for _, out := range outs {
		for line := range strings.Lines(out.String()) {
			var l tickLine
			if err := json.Unmarshal([]byte(line), &l); err != nil || l.Err != "" {
				t.Fatalf("line %q: %v", line, err)
			}
			if l.Outcome == "ran" {
				ran[l.Tick]++
			}
		}
	}
	for tick := range ticks {
		if ran[tick] != 1 {
			t.Errorf("tick %d ran %d times", tick, ran[tick])
		}
	}
}
