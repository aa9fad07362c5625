package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestMain lets the test binary serve as a hotkey worker process (the
// hotkey scenario re-executes os.Args[0]) and otherwise runs the tests
// against a throwaway database.
func TestMain(m *testing.M) {
	if runWorkerMode() {
		return
	}
	pgtest.Main(m)
}

// smokeConfig runs one scenario briefly with small sizes.
func smokeConfig(t *testing.T, scenario string) config {
	t.Helper()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		t.Fatal("DATABASE_URL unset")
	}
	return config{
		url:        url,
		duration:   200 * time.Millisecond,
		callers:    []int{1, 5},
		hotCallers: []int{4},
		hotProcs:   []int{1, 2},
		hbN:        []int{300},
		hbDuration: 1500 * time.Millisecond, // > TTL/3: at least one extend round
		advCallers: []int{1, 3},
		scenarios:  map[string]bool{scenario: true},
	}
}

func runSmoke(t *testing.T, cfg config) ([]Result, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	return res, out.String()
}

func TestUncontendedSmoke(t *testing.T) {
	t.Parallel()
	cfg := smokeConfig(t, "uncontended")
	cfg.plot = filepath.Join(t.TempDir(), "out", "throughput.svg")
	res, table := runSmoke(t, cfg)
	var impls []string
	for _, impl := range uncontendedImpls {
		if !impl.optional {
			impls = append(impls, impl.name)
		}
	}
	if len(res) != len(cfg.callers)*len(impls) {
		t.Fatalf("got %d results, want %d:\n%s", len(res), len(cfg.callers)*len(impls), table)
	}
	for _, r := range res {
		if r.Cycles <= 0 || r.Errors != 0 || r.P50Ms <= 0 || r.Extra["pool"] != float64(uncontendedPoolSize(r.Callers)) {
			t.Errorf("bad result %+v", r)
		}
		if !strings.Contains(table, r.Impl) {
			t.Errorf("table lacks %s:\n%s", r.Impl, table)
		}
	}
	svg, err := os.ReadFile(cfg.plot)
	if err != nil {
		t.Fatal(err)
	}
	for _, impl := range impls {
		if !bytes.Contains(svg, []byte(">"+impl+"<")) {
			t.Errorf("plot lacks series %s", impl)
		}
	}
}

func TestHotKeySmoke(t *testing.T) {
	t.Parallel()
	res, table := runSmoke(t, smokeConfig(t, "hotkey"))
	if len(res) != 2 {
		t.Fatalf("got %d results, want 2:\n%s", len(res), table)
	}
	for _, r := range res {
		if r.Cycles < 2 || r.Errors != 0 || r.P50Ms <= 0 || r.Extra["duplicate_fences"] != 0 {
			t.Errorf("bad result %+v", r)
		}
		if _, ok := r.Extra["xproc_handoffs"]; ok != (r.Processes > 1) {
			t.Errorf("xproc stats present=%v for P=%d", ok, r.Processes)
		}
	}
}

func TestHeartbeatSmoke(t *testing.T) {
	t.Parallel()
	res, table := runSmoke(t, smokeConfig(t, "heartbeat"))
	if len(res) != 1 {
		t.Fatalf("got %d results:\n%s", len(res), table)
	}
	r := res[0]
	if r.Extra["lost"] != 0 || r.Extra["stmts_per_tick"] <= 0 || r.Extra["items_per_stmt"] <= 0 ||
		r.Extra["heap_B_per_lock"] <= 0 || r.Cycles < 300 {
		t.Errorf("bad result %+v", r)
	}
}

func TestAdvisorySmokeJSON(t *testing.T) {
	t.Parallel()
	cfg := smokeConfig(t, "advisory")
	cfg.json = true
	res, out := runSmoke(t, cfg)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(res) != 4 || len(lines) != len(res) {
		t.Fatalf("got %d results, %d lines:\n%s", len(res), len(lines), out)
	}
	for i, line := range lines {
		var r Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %d is not a Result: %v", i, err)
		}
		if r.Scenario != "advisory" || r.Cycles <= 0 || r.Errors != 0 || r.Impl != res[i].Impl || r.Callers != res[i].Callers {
			t.Errorf("bad result %+v", r)
		}
	}
}

func TestSummarizeHotKey(t *testing.T) {
	t.Parallel()
	ms := int64(time.Millisecond)
	// Grants in fence order alternate processes; handoffs 1, 2, 3 ms.
	reps := []workerReport{
		{Records: []csRecord{{Fence: 1, GrantNs: 0, RelNs: 10 * ms, Proc: 0}, {Fence: 3, GrantNs: 13 * ms, RelNs: 20 * ms, Proc: 0}}, Timeouts: 1},
		{Records: []csRecord{{Fence: 2, GrantNs: 11 * ms, RelNs: 11 * ms, Proc: 1}, {Fence: 4, GrantNs: 23 * ms, RelNs: 30 * ms, Proc: 1}}},
	}
	r := summarizeHotKey(reps, 2, 2, 2)
	if r.Cycles != 4 || r.CyclesPerSec != 2 || r.P50Ms != 2 || r.MaxMs != 3 || r.Extra["timeouts"] != 1 ||
		r.Extra["xproc_handoffs"] != 3 || r.Extra["xproc_p50_ms"] != 2 {
		t.Fatalf("got %+v", r)
	}
}

func TestParseInts(t *testing.T) {
	t.Parallel()
	if got, err := parseInts("1, 8,64"); err != nil || len(got) != 3 || got[2] != 64 {
		t.Fatalf("parseInts = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "x", "1,,2", "-3"} {
		if _, err := parseInts(bad); err == nil {
			t.Errorf("parseInts(%q) accepted", bad)
		}
	}
}
