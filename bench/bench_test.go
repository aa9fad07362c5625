package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
		// One caller: its cycle splits into its statements' time and the
		// time outside them, both positive and adding up to the cycle.
		if r.Callers == 1 && (r.Impl == "manager" || r.Impl == "pg-single") {
			st, out := r.Extra["stmt_us_per_cycle"], r.Extra["outside_us_per_cycle"]
			if cycle := 1e6 / r.CyclesPerSec; st <= 0 || out <= 0 || st >= cycle {
				t.Errorf("%s C=1: statements %.0f µs and outside %.0f µs per cycle of %.0f µs", r.Impl, st, out, cycle)
			}
		}
	}
	if !strings.Contains(table, "time outside the statements") {
		t.Errorf("targets lack the single caller's time outside the statements:\n%s", table)
	}
	for _, want := range []string{"actor floor (the shape alone", "manager against the actor floor, C=1", "manager against the actor floor, C=5"} {
		if !strings.Contains(table, want) {
			t.Errorf("targets lack %q:\n%s", want, table)
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
	// The smoke checks that the scenario works, not how fast: on a loaded
	// 2-core machine a 200 ms window over two processes can see a single
	// section, so a window too short to see two in every point is measured
	// again, longer.
	cfg := smokeConfig(t, "hotkey")
	var res []Result
	var table string
	for _, d := range []time.Duration{200 * time.Millisecond, time.Second, 4 * time.Second} {
		cfg.duration = d
		res, table = runSmoke(t, cfg)
		if len(res) != 7 || (res[0].Cycles >= 2 && res[1].Cycles >= 2) {
			break
		}
		t.Logf("window %v saw %d and %d sections (machine busy); measuring again, longer", d, res[0].Cycles, res[1].Cycles)
	}
	if len(res) != 7 {
		t.Fatalf("got %d results, want 2 hot-key points, the flush bound, the handoff chain, the grant floor and the actor relay with both statements:\n%s", len(res), table)
	}
	for _, r := range res[:2] {
		if r.Scenario != "hotkey" || r.Cycles < 2 || r.Errors != 0 || r.P50Ms <= 0 || r.Extra["duplicate_fences"] != 0 ||
			r.Latency != "handoff" || r.Extra["max_share"] <= 0 {
			t.Errorf("bad result %+v", r)
		}
		if _, ok := r.Extra["fifo_inversions"]; !ok {
			t.Errorf("no fifo_inversions in %+v", r)
		}
		if _, ok := r.Extra["xproc_handoffs"]; ok != (r.Processes > 1) {
			t.Errorf("xproc stats present=%v for P=%d", ok, r.Processes)
		}
	}
	f := res[2]
	if f.Scenario != "flush" || f.Cycles < 10 || f.P50Ms <= 0 || f.Extra["before_per_s"] <= 0 || f.Extra["after_per_s"] <= 0 {
		t.Errorf("bad flush bound %+v", f)
	}
	if c := res[3]; c.Scenario != "flush" || c.Impl != "handoff-chain" || c.Cycles < 2 || c.P50Ms <= 0 || c.Errors != 0 {
		t.Errorf("bad handoff chain %+v", c)
	}
	if g := res[4]; g.Scenario != "flush" || g.Impl != "grant-floor" || g.Cycles < 2 || g.P50Ms <= 0 || g.Errors != 0 {
		t.Errorf("bad grant floor %+v", g)
	}
	for i, impl := range []string{"actor-relay", "actor-relay-floor"} {
		if a := res[5+i]; a.Scenario != "flush" || a.Impl != impl || a.Callers != 4 || a.Cycles < 2 || a.P50Ms <= 0 || a.Errors != 0 {
			t.Errorf("bad %s %+v", impl, a)
		}
	}
	for _, want := range []string{"flush bound", "hot-key statement alone", "grant floor", "actor relay:", "actor relay, grant floor", "hot key against the actor relay, C=4 P=1", "hot key against the statement alone, C=4 P=1", "hot key ≥ 80 % of the flush bound, C=4 P=1", "hot key ≥ 70 % of the flush bound, C=4 P=2", "FIFO"} {
		if !strings.Contains(table, want) {
			t.Errorf("targets lack %q:\n%s", want, table)
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
		r.Extra["heap_B_per_lock"] <= 0 || r.Cycles < 300 || r.Latency != "lag" || r.MaxMs < r.P50Ms {
		t.Errorf("bad result %+v", r)
	}
	if strings.Contains(table, "p50   0.00 ms") {
		t.Errorf("heartbeat row prints a meaningless zero latency:\n%s", table)
	}
}

func TestAdvisorySmokeJSON(t *testing.T) {
	t.Parallel()
	cfg := smokeConfig(t, "advisory")
	cfg.json = true
	res, out := runSmoke(t, cfg)
	var lines []string // result lines; targets follow them
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.Contains(l, `"target"`) {
			lines = append(lines, l)
		}
	}
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
		if r.Impl == "session" && r.Extra["stmts_per_cycle"] != 2 {
			t.Errorf("session lock+unlock took %v round trips, want 2", r.Extra["stmts_per_cycle"])
		}
	}
	if !strings.Contains(out, `"name":"advisory session: 1 round trip per operation, C=1","measured":"1.000","met":true`) {
		t.Errorf("no round-trip target in the JSON output:\n%s", out)
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
		r.Extra["xproc_handoffs"] != 3 || r.Extra["xproc_p50_ms"] != 2 || r.Extra["fifo_inversions"] != 0 || r.Extra["max_share"] != 0.5 {
		t.Fatalf("got %+v", r)
	}
}

func TestFIFOInversions(t *testing.T) {
	t.Parallel()
	ms := int64(time.Millisecond)
	// Process 0: callers called at 0, 10, 20 ms and were granted in the
	// order 0, 20, 10: the 10 ms caller was overtaken by one 10 ms younger.
	// Process 1's order is its own; a 3 ms difference is within tolerance.
	recs := []csRecord{
		{Fence: 1, CallNs: 0, Proc: 0},
		{Fence: 2, CallNs: 50 * ms, Proc: 1},
		{Fence: 3, CallNs: 20 * ms, Proc: 0},
		{Fence: 4, CallNs: 10 * ms, Proc: 0},
		{Fence: 5, CallNs: 47 * ms, Proc: 1},
	}
	n, worst := fifoInversions(recs, 5*time.Millisecond)
	if n != 1 || worst != 10*time.Millisecond {
		t.Fatalf("fifoInversions = %d, %v; want 1, 10ms", n, worst)
	}
	if n, _ := fifoInversions(recs, 20*time.Millisecond); n != 0 {
		t.Fatalf("inversions within tolerance counted: %d", n)
	}
}

func TestFormatResultLatency(t *testing.T) {
	t.Parallel()
	hb := formatResult(Result{Scenario: "heartbeat", Impl: "manager", Callers: 10, CyclesPerSec: 10})
	if strings.Contains(hb, "p50") || !strings.Contains(hb, " - ") {
		t.Errorf("row without latency: %q", hb)
	}
	lag := formatResult(Result{Scenario: "heartbeat", Impl: "manager", Callers: 10, CyclesPerSec: 10, Latency: "lag", P50Ms: 1.5, P99Ms: 2, MaxMs: 3})
	if !strings.Contains(lag, "lag     p50   1.50 ms") {
		t.Errorf("lag row: %q", lag)
	}
}

func TestMedianRun(t *testing.T) {
	t.Parallel()
	runs := []Result{{CyclesPerSec: 3, P50Ms: 3, Extra: map[string]float64{"pool": 3}}, {CyclesPerSec: 1}, {CyclesPerSec: 2, P50Ms: 2, Extra: map[string]float64{"pool": 3}}}
	r := medianRun(runs)
	if r.CyclesPerSec != 2 || r.P50Ms != 2 || r.Extra["rounds"] != 3 || r.Extra["min_per_s"] != 1 || r.Extra["max_per_s"] != 3 {
		t.Fatalf("medianRun = %+v", r)
	}
	if _, ok := runs[2].Extra["rounds"]; ok {
		t.Fatal("medianRun changed its input")
	}
}

func TestComputeTargets(t *testing.T) {
	t.Parallel()
	res := resultSet{
		{Scenario: "uncontended", Impl: "pg-single", Callers: 1, CyclesPerSec: 1000, P50Ms: 0.5, Extra: map[string]float64{"stmts_per_cycle": 2}},
		{Scenario: "uncontended", Impl: "manager", Callers: 1, CyclesPerSec: 1100, P50Ms: 0.56, Extra: map[string]float64{"stmts_per_cycle": 2}},
		{Scenario: "uncontended", Impl: "pg-single", Callers: 64, CyclesPerSec: 3000},
		{Scenario: "uncontended", Impl: "pg-setbased", Callers: 64, CyclesPerSec: 10000},
		{Scenario: "uncontended", Impl: "manager", Callers: 64, CyclesPerSec: 8000, Extra: map[string]float64{"stmts_per_cycle": 0.25}},
		{Scenario: "flush", Impl: "one-row-commit", Callers: 1, CyclesPerSec: 2000},
		{Scenario: "hotkey", Impl: "manager", Callers: 8, Processes: 1, CyclesPerSec: 1500, Extra: map[string]float64{"timeouts": 0, "fifo_inversions": 0}},
		{Scenario: "hotkey", Impl: "manager", Callers: 8, Processes: 2, CyclesPerSec: 1300, Extra: map[string]float64{"timeouts": 1, "fifo_inversions": 0}},
		{Scenario: "heartbeat", Impl: "manager", Callers: 10000, Extra: map[string]float64{"heap_B_per_lock": 1100}},
		{Scenario: "heartbeat", Impl: "manager", Callers: 100000, Latency: "lag", Extra: map[string]float64{"stmts_per_tick": 10, "lost": 0}},
		{Scenario: "advisory", Impl: "session", Callers: 1, CyclesPerSec: 850, Extra: map[string]float64{"stmts_per_cycle": 2}},
	}
	base := resultSet{{Scenario: "advisory", Impl: "session", Callers: 1, CyclesPerSec: 1000}}
	got := map[string]string{}
	for _, tg := range computeTargets(res, base) {
		got[tg.Name] = tg.verdict()
	}
	want := map[string]string{
		"manager ≥ pg-single, C=1":                                   "met",
		"single-caller p50 ≤ pg-single's + 0.05 ms":                  "MISSED", // 0.56 > 0.55
		"manager ≥ pg-single, C=64":                                  "met",
		"manager ≥ 80 % of pg-setbased, C=64":                        "met",
		"hot key ≥ 80 % of the flush bound, C=8 P=1":                 "MISSED", // 75 %
		"hot key ≥ 70 % of the flush bound, C=8 P=2":                 "MISSED", // 65 %
		"hot key acquisition timeouts = 0":                           "MISSED",
		"Go heap per held lock ≤ 1 KiB at 10,000 locks":              "MISSED",
		"100,000 locks: ≤ 10 statements per tick":                    "met",
		"100,000 locks: 0 losses":                                    "met",
		"manager: ≤ 1 round trip per operation (uncontended, all C)": "met",
		"advisory session C=1 ≥ 90 % of the baseline":                "MISSED", // 85 %
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s: %q, want %q", name, got[name], v)
		}
	}
}

// TestPeersSmoke builds and runs the peers module (cirello pglock; bsm
// redislock when redis-server is installed). It downloads the peers'
// modules, so it runs only with PGLEASE_BENCH_PEERS=1.
func TestPeersSmoke(t *testing.T) {
	if os.Getenv("PGLEASE_BENCH_PEERS") == "" {
		t.Skip("set PGLEASE_BENCH_PEERS=1 to build and run the peers module")
	}
	cfg := smokeConfig(t, "peers")
	cfg.scenarios["uncontended"], cfg.scenarios["hotkey"] = true, true
	cfg.callers, cfg.hotCallers = []int{2}, []int{3}
	cfg.duration = time.Second
	cfg.peersDir = "peers"
	var res []Result
	var out bytes.Buffer
	note := func(f string, a ...any) { fmt.Fprintf(&out, f+"\n", a...) }
	err := runPeers(context.Background(), cfg, func(r Result) { res = append(res, r) }, note)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range res {
		seen[r.Impl+"/"+r.Scenario] = true
		if r.Cycles <= 0 || r.Errors != 0 {
			t.Errorf("bad peer result %+v", r)
		}
	}
	if !seen["pglock/uncontended"] || !seen["pglock/hotkey"] {
		t.Errorf("pglock results missing: %+v", res)
	}
	if _, err := exec.LookPath("redis-server"); (err == nil) != seen["redislock/uncontended"] {
		t.Errorf("redislock results %v with redis-server installed %v; notes: %s", seen["redislock/uncontended"], err == nil, out.String())
	}
	if _, err := exec.LookPath("redis-server"); err != nil && !strings.Contains(out.String(), "redis-server is not installed") {
		t.Errorf("no note about the missing redis-server: %q", out.String())
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

func TestWriteMarkdown(t *testing.T) {
	t.Parallel()
	res := resultSet{
		{Scenario: "uncontended", Impl: "manager", Callers: 1, CyclesPerSec: 1361.2, P50Ms: 0.72},
		{Scenario: "uncontended", Impl: "pglock", Callers: 1, CyclesPerSec: 1012, P50Ms: 0.9},
		{Scenario: "uncontended", Impl: "manager", Callers: 64, CyclesPerSec: 10807},
		{Scenario: "hotkey", Impl: "manager", Callers: 8, Processes: 2, CyclesPerSec: 1120, Latency: "handoff", P50Ms: 0.86, Extra: map[string]float64{"max_share": 0.13}},
		{Scenario: "heartbeat", Impl: "manager", Callers: 100000, Extra: map[string]float64{"ttl_s": 30, "stmts_per_tick": 10, "heap_B_per_lock": 990}},
	}
	path := filepath.Join(t.TempDir(), "r.md")
	ts := []Target{{ID: "4", Name: "heap", Measured: "990 B", Met: boolp(true)}, {ID: "1", Name: "x", Measured: "y", Met: boolp(false)}}
	if err := writeMarkdown(path, "Measured by me.", res, ts); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, want := range []string{"Measured by me.", "| C | pglock | manager |", "| 1 | 1,012 (0.90 ms) | 1,361 (0.72 ms) |", "| 64 | – | 10,807 (0.00 ms) |",
		"| manager | 8 | 2 | 1,120 | handoff 0.86", "| 100,000 | 30 s | 10.00 | – | 0 | 990 B |", "| 4 | heap | 990 B | met |", "| 1 | x | y | **missed** |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
