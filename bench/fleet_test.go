package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// fleetSmokeConfig runs the fleet scenario at N=2 briefly.
func fleetSmokeConfig(t *testing.T) config {
	t.Helper()
	cfg := smokeConfig(t, "fleet")
	cfg.fleet = fleetConfig{n: []int{2}, duration: 3 * time.Second, warmup: time.Second, hold: 5 * time.Millisecond, sample: 500 * time.Millisecond}
	return cfg
}

// TestFleetSmoke runs one step of two worker processes, then the churn
// mode briefly (one after the other: no worker may be left behind by
// either), and checks that every column was measured.
func TestFleetSmoke(t *testing.T) {
	t.Parallel()
	t.Run("step", testFleetStep)
	t.Run("fair", testFleetFair)
	t.Run("churn", testFleetChurn)
	assertNoFleetWorkers(t)
}

func testFleetStep(t *testing.T) {
	cfg := fleetSmokeConfig(t)
	cfg.markdown = filepath.Join(t.TempDir(), "r.md")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if len(res) != 1 {
		t.Fatalf("got %d results:\n%s", len(res), out.String())
	}
	t.Log("\n" + out.String())
	r := res[0]
	x := r.Extra
	// 2 workers × 100 held leases were granted before the window; in it,
	// each worker cycles its own keys at 20/s and loops on the shared keys.
	if r.Scenario != "fleet" || r.Processes != 2 || r.Cycles < 20 || r.Latency != "wait" || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
		t.Errorf("bad result %+v", r)
	}
	if x["listen_conns"] != 2 || x["conns"] < 4 || x["conns_max"] < x["conns"] || x["server_conns"] < x["conns"] {
		t.Errorf("connections: %v conns, %v listening, %v max, %v in the database; want 2 listening among ≥ 4", x["conns"], x["listen_conns"], x["conns_max"], x["server_conns"])
	}
	if x["lost"] != 0 || x["own_per_s"] <= 0 || x["shared_per_s"] <= 0 || x["releases_per_s"] <= 0 || x["xact_per_s"] <= 0 || x["wal_kB_per_s"] <= 0 {
		t.Errorf("bad rates %v", x)
	}
	if x["attempts_per_grant"] <= 0 || x["client_stmts_per_grant"] <= 0 || x["xact_per_grant"] <= 0 {
		t.Errorf("statements per grant: %v attempts, %v statements, %v transactions", x["attempts_per_grant"], x["client_stmts_per_grant"], x["xact_per_grant"])
	}
	// Two processes contend for the shared keys, so some releases notify;
	// never more than one notification per release, delivered to at most
	// the two workers (counted by them, over their own windows).
	if v, ok := x["notify_per_release"]; !ok || v <= 0 || v > 1 || x["deliveries_per_release"] <= 0 || x["deliveries_per_release"] > 2*v+0.05 {
		t.Errorf("notifications: %v per release, %v deliveries per release", x["notify_per_release"], x["deliveries_per_release"])
	}
	// The workers' listeners read the notifications of each other's
	// releases of the shared keys.
	if x["notified_per_grant"] <= 0 || x["notified_per_s"] <= 0 {
		t.Errorf("notifications delivered: %v per grant, %v/s", x["notified_per_grant"], x["notified_per_s"])
	}
	if runtime.GOOS == "linux" {
		if x["cpu_ms_per_1k_grants"] <= 0 || x["rss_MB"] <= 0 {
			t.Errorf("server CPU %v ms/1k grants, client RSS %v MB: want both measured", x["cpu_ms_per_1k_grants"], x["rss_MB"])
		}
		if x["client_cpu_ms_per_s"] <= 0 || x["client_cpu_ms_per_grant"] <= 0 || x["client_cpu_us_per_lease_s"] <= 0 {
			t.Errorf("client CPU %v ms/s, %v ms/grant, %v µs/lease·s: want all measured", x["client_cpu_ms_per_s"], x["client_cpu_ms_per_grant"], x["client_cpu_us_per_lease_s"])
		}
	}
	if table := out.String(); !strings.Contains(table, "# fleet: ") || !strings.Contains(table, "deliveries/release") {
		t.Errorf("no fleet table:\n%s", table)
	}
	md, err := os.ReadFile(cfg.markdown)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| "+strings.Join(fleetColumns, " | ")+" |") || !strings.Contains(string(md), "| 2 | ") {
		t.Errorf("markdown lacks the fleet table:\n%s", md)
	}
}

// testFleetFair runs the step with FairQueue Managers and an idle phase,
// and profiles worker 0.
func testFleetFair(t *testing.T) {
	cfg := fleetSmokeConfig(t)
	cfg.fleet.fair, cfg.fleet.idle, cfg.fleet.profile = true, 2*time.Second, t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if len(res) != 1 || res[0].Impl != "manager-fair" {
		t.Fatalf("got %+v:\n%s", res, out.String())
	}
	t.Log("\n" + out.String())
	x := res[0].Extra
	if x["lost"] != 0 || res[0].Cycles < 20 || !strings.Contains(out.String(), "FairQueue Manager") || !strings.Contains(out.String(), "\n2 fair ") {
		t.Errorf("bad fair step %+v:\n%s", res[0], out.String())
	}
	if _, ok := x["notified_per_grant"]; !ok {
		t.Errorf("notifications delivered not measured: %v", x)
	}
	if runtime.GOOS == "linux" {
		if x["idle_client_cpu_us_per_lease_s"] <= 0 || x["idle_client_cpu_ms_per_s"] <= 0 {
			t.Errorf("idle client CPU %v µs/lease·s, %v ms/s: want both measured", x["idle_client_cpu_us_per_lease_s"], x["idle_client_cpu_ms_per_s"])
		}
	}
	for _, name := range []string{"w0-2-report.pprof", "w0-4-report.pprof"} {
		if st, err := os.Stat(filepath.Join(cfg.fleet.profile, name)); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", name, err)
		}
	}
}

// testFleetChurn runs the churn mode for 3 s, sampled every 0.5 s: a
// verdict per series.
func testFleetChurn(t *testing.T) {
	cfg := fleetSmokeConfig(t)
	cfg.fleet.churn = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if len(res) != 1 || res[0].Scenario != "fleet-churn" {
		t.Fatalf("got %+v:\n%s", res, out.String())
	}
	t.Log("\n" + out.String())
	x := res[0].Extra
	if x["samples"] < 6 || res[0].Cycles <= 0 {
		t.Errorf("bad churn result %+v", res[0])
	}
	// Unique own keys: every cycle adds a fence counter.
	if x["fence_rows_last"] <= x["fence_rows_first"] || x["listen_conns_last"] != 2 {
		t.Errorf("fence rows %v → %v, listening %v", x["fence_rows_first"], x["fence_rows_last"], x["listen_conns_last"])
	}
	for _, s := range []string{"adv_locks", "pg_locks", "lock_rows", "conns"} {
		if _, ok := x[s+"_grows"]; !ok {
			t.Errorf("no verdict for %s: %v", s, x)
		}
	}
	if !strings.Contains(out.String(), "fleet churn N=2 t=") || !strings.Contains(out.String(), "fence_rows") {
		t.Errorf("no churn samples or table:\n%s", out.String())
	}
}

// assertNoFleetWorkers fails if a child of this process is still running
// as a fleet worker.
func assertNoFleetWorkers(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		return
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ok := readProcStat(pid)
		if !ok || st.ppid != os.Getpid() {
			continue
		}
		if env, _ := os.ReadFile("/proc/" + e.Name() + "/environ"); bytes.Contains(env, []byte(fleetWorkerEnv+"=")) {
			t.Errorf("fleet worker %d is still there (running, or a zombie never waited for)", pid)
		}
	}
}

// TestFleetWorkerKilledWithParent starts a fleet from a child bench
// process and kills that process with SIGKILL: its workers must die with
// it (parent-death signal), leaving none behind.
func TestFleetWorkerKilledWithParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	t.Parallel()
	// The child is this test binary running TestFleetHelperParent.
	cmd := exec.Command(os.Args[0], "-test.run=^TestFleetHelperParent$", "-test.v")
	cmd.Env = append(os.Environ(), "PGLEASE_FLEET_HELPER_PARENT=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// Surviving workers would hold the stderr pipe open: do not wait for
	// them in Wait, find them below.
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The helper prints "workers: pid pid" once its fleet is ready.
	var pids []int
	buf := make([]byte, 0, 4096)
	deadline := time.Now().Add(60 * time.Second)
	for len(pids) == 0 && time.Now().Before(deadline) {
		chunk := make([]byte, 512)
		n, err := stdout.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if i := bytes.Index(buf, []byte("workers:")); i >= 0 {
			if j := bytes.IndexByte(buf[i:], '\n'); j >= 0 {
				for _, f := range strings.Fields(string(buf[i+len("workers:") : i+j])) {
					p, _ := strconv.Atoi(f)
					pids = append(pids, p)
				}
			}
		}
		if err != nil {
			break
		}
	}
	if len(pids) != 2 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper did not report its workers: %q\n%s", buf, stderr.String())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for _, pid := range pids {
		gone := false
		for range 100 {
			if _, ok := readProcStat(pid); !ok {
				gone = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !gone {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("worker %d outlived its killed parent", pid)
		}
	}
}

// TestFleetHelperParent is TestFleetWorkerKilledWithParent's child: it
// starts a fleet of two, prints their pids, and waits to be killed.
func TestFleetHelperParent(t *testing.T) {
	if os.Getenv("PGLEASE_FLEET_HELPER_PARENT") == "" {
		t.Skip("run by TestFleetWorkerKilledWithParent")
	}
	cfg := fleetSmokeConfig(t)
	f, err := startFleet(context.Background(), cfg, 2, fleetOwnKeys)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.broadcast("go"); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("workers:")
	for _, p := range f.workers {
		b.WriteString(" " + strconv.Itoa(p.cmd.Process.Pid))
	}
	os.Stdout.WriteString(b.String() + "\n")
	time.Sleep(60 * time.Second) // killed before this ends
	f.close()
}

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	line := "4242 (postgres: a) b) S 100 4242 4242 0 -1 4194560 1 2 3 4 7 11 13 17 20 0 1 0 5 6 7"
	st, ok := parseProcStat(line)
	if !ok || st.comm != "postgres: a) b" || st.ppid != 100 || st.ticks != 7+11+13+17 {
		t.Fatalf("parseProcStat = %+v, %v", st, ok)
	}
	if _, ok := parseProcStat("1 (x) S 0"); ok {
		t.Fatal("short line accepted")
	}
}

func TestParseLSN(t *testing.T) {
	t.Parallel()
	if n, err := parseLSN("16/B374D848"); err != nil || n != 0x16<<32|0xB374D848 {
		t.Fatalf("parseLSN = %x, %v", n, err)
	}
	if _, err := parseLSN("16B374D848"); err == nil {
		t.Fatal("bad LSN accepted")
	}
}

func TestWithConnParams(t *testing.T) {
	t.Parallel()
	u, err := withConnParams("postgres://u:secret@h:5/db?sslmode=disable", [][2]string{{"application_name", "a b"}, {"search_path", "s"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	if c.RuntimeParams["application_name"] != "a b" || c.RuntimeParams["search_path"] != "s" || c.Database != "db" || c.Password != "secret" {
		t.Errorf("URL form: %v %q %q", c.RuntimeParams, c.Database, c.Password)
	}
	kv, err := withConnParams("host=h dbname=db", [][2]string{{"application_name", `it's`}})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.ParseConfig(kv); err != nil || c.RuntimeParams["application_name"] != "it's" || c.Database != "db" {
		t.Errorf("keyword form %q: %v %v", kv, c, err)
	}
}

func TestJudgeGrowth(t *testing.T) {
	t.Parallel()
	ramp := func(n int, f func(i int) float64) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = f(i)
		}
		return xs
	}
	for _, tc := range []struct {
		name          string
		xs            []float64
		rising, grows bool
	}{
		{"flat", ramp(60, func(int) float64 { return 100 }), false, false},
		{"noise", ramp(60, func(i int) float64 { return 100 + float64(i%3) }), false, false},
		{"steps up once then flat (pools filling)", ramp(60, func(i int) float64 { return 100 + 50*float64(min(i, 3)) }), false, false},
		{"linear", ramp(60, func(i int) float64 { return 100 + 10*float64(i) }), true, true},
		{"slow but steady", ramp(60, func(i int) float64 { return 1000 + 5*float64(i) }), true, true},
		{"slower: 4 % in the run", ramp(60, func(i int) float64 { return 1000 + float64(i) }), true, false},
	} {
		v := judgeGrowth(tc.xs, 20)
		if !v.known || v.grows != tc.grows || v.rising != tc.rising {
			t.Errorf("%s: %+v, want rising=%v grows=%v", tc.name, v, tc.rising, tc.grows)
		}
	}
	if v := judgeGrowth([]float64{1, 2, 3}, 0); v.known {
		t.Errorf("3 samples judged: %+v", v)
	}
}

func TestSummarizeFleetStep(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	s0 := serverSnap{at: t0, xacts: 100, walBytes: 0, cpuTicks: 1000}
	s1 := serverSnap{at: t0.Add(10 * time.Second), xacts: 2100, walBytes: 10 * 1024 * 1024, cpuTicks: 1500}
	before := []fleetReport{{Grants: 100, Releases: 10, Errors: map[string]int64{"acquire:AcquisitionTimeout": 1}, CPUMs: 50, Notified: 7}, {Grants: 100, CPUMs: 100}}
	after := []fleetReport{
		{Grants: 1100, OwnGrants: 900, SharedGrants: 100, Releases: 1010, Errors: map[string]int64{"acquire:AcquisitionTimeout": 3}, SharedMs: []float64{1, 2, 3}, RSSKB: 10240,
			Stmts: fleetStmts{All: 500, Acquire: 300, AcqItems: 600}, CPUMs: 1050, Notified: 507},
		{Grants: 1100, OwnGrants: 900, SharedGrants: 100, Releases: 1000, SharedMs: []float64{4}, RSSKB: 10240, Stmts: fleetStmts{All: 500, Acquire: 300, AcqItems: 600},
			CPUMs: 1100, Notified: 500},
	}
	d := fleetDiff(before, after)
	r := summarizeFleetStep(2, s0, s1, d, 0, 400, serverCounts{conns: 8, listen: 2, clients: 10, advisory: 1}, 3, 9)
	x := r.Extra
	// 500 ticks = 5 s of CPU for 2,000 grants: 2,500 ms per 1,000. 2,000
	// transactions, 1,000 of them the pools' statements: 100/s from
	// elsewhere.
	if r.Cycles != 2000 || r.CyclesPerSec != 200 || x["cpu_ms_per_1k_grants"] != 2500 || x["server_cpu_cores"] != 0.5 ||
		x["xact_per_s"] != 200 || x["wal_kB_per_s"] != 1024 || x["notify_per_release"] != 0.2 || x["deliveries_per_release"] != 0.5 ||
		x["adv_locks_max"] != 3 || x["rss_MB"] != 20 || x["client_stmts_per_grant"] != 0.5 || x["attempts_per_grant"] != 0.6 || x["xact_per_grant"] != 1 ||
		x["nonpool_xact_per_s"] != 100 || x["err_acquire:AcquisitionTimeout"] != 2 || r.Errors != 2 || r.P50Ms != 2 || r.MaxMs != 4 {
		t.Fatalf("got %+v", r)
	}
	// 2 s of the workers' CPU in 10 s, for 2,000 grants and 2 × 100
	// leases; 1,000 notifications delivered.
	if x["client_cpu_ms_per_s"] != 200 || x["client_cpu_ms_per_grant"] != 1 || x["client_cpu_us_per_lease_s"] != 1000 ||
		x["notified_per_grant"] != 0.5 || x["notified_per_s"] != 100 {
		t.Fatalf("client figures %v", x)
	}
	// One worker's unknown figure makes the sum unknown.
	after[1].CPUMs, after[1].Notified = -1, -1
	if d := fleetDiff(before, after); d.cpuMs != -1 || d.notified != -1 {
		t.Fatalf("unknown figures summed: %+v", d)
	}
	cells := fleetCells(r)
	if len(cells) != len(fleetColumns) || cells[3] != "2500" || cells[len(cells)-1] != "acquire:AcquisitionTimeout=2" {
		t.Fatalf("cells %q", cells)
	}
}

// TestFleetConnectionBudget: a fleet the server has no connections for is
// refused before any worker starts, with a way out.
func TestFleetConnectionBudget(t *testing.T) {
	t.Parallel()
	cfg := fleetSmokeConfig(t)
	cfg.fleet.n = []int{1, 100000}
	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out)
	if err == nil || !strings.Contains(err.Error(), "with N=100000") || !strings.Contains(err.Error(), "-max-connections") || len(res) != 0 {
		t.Fatalf("run = %v, %v; want the budget refused before N=1 ran", res, err)
	}
}

// TestFleetTargets: the fleet targets are judged from the steps' figures.
func TestFleetTargets(t *testing.T) {
	step := func(n int, x map[string]float64) Result {
		return Result{Scenario: "fleet", Impl: "manager", Callers: n, Processes: n, Extra: x}
	}
	res := resultSet{
		step(10, map[string]float64{"lost": 0, "cpu_ms_per_1k_grants": 1000, "idle_conns_per_proc": 3, "idle_conns": 30, "idle_listen_conns": 10, "idle_s": 45,
			"notified_per_grant": 1.5, "client_cpu_ms_per_grant": 0.5, "client_cpu_us_per_lease_s": 40, "idle_client_cpu_us_per_lease_s": 2}),
		step(100, map[string]float64{"lost": 2, "cpu_ms_per_1k_grants": 1250, "idle_conns_per_proc": 3.2, "idle_conns": 320, "idle_listen_conns": 100, "idle_s": 45,
			"notified_per_grant": 9}),
	}
	fair := step(10, map[string]float64{"lost": 0, "cpu_ms_per_1k_grants": 1000, "notified_per_grant": 0.2})
	fair.Impl = "manager-fair"
	res = append(res, fair, step(100, map[string]float64{"lost": 0, "cpu_ms_per_1k_grants": 1200}))
	res[len(res)-1].Impl = "manager-fair"
	got := map[string]string{}
	for _, tg := range fleetTargets(res) {
		got[tg.Name] = tg.verdict()
	}
	want := map[string]string{
		"0 lost leases, N=10 (extends fit: 3 extend statements/s)":               "met",
		"0 lost leases, N=100 (extends fit: 30 extend statements/s)":             "MISSED",
		"server CPU/grant N=100 ≤ 1.2 × N=10":                                    "MISSED",
		"≤ 1.5 notifications delivered per grant, N=10":                          "met",
		"≤ 1.5 notifications delivered per grant, N=100":                         "MISSED",
		"client CPU (reported), N=10":                                            "info",
		"0 lost leases, N=10 (extends fit: 3 extend statements/s) (FairQueue)":   "met",
		"0 lost leases, N=100 (extends fit: 30 extend statements/s) (FairQueue)": "met",
		"server CPU/grant N=100 ≤ 1.2 × N=10 (FairQueue)":                        "met",
		"≤ 1.5 notifications delivered per grant, N=10 (FairQueue)":              "met",
		"≤ 3 server connections per idle process, N=10 (after 45 s idle)":        "met",
		"≤ 3 server connections per idle process, N=100 (after 45 s idle)":       "MISSED",
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s: %q, want %q (all: %v)", name, got[name], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d targets, want %d: %v", len(got), len(want), got)
	}
}
