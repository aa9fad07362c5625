package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Target is one line of the performance targets table: what is asked, what
// this run measured, and whether it is met. Met is nil for a figure that is
// reported, not judged.
type Target struct {
	ID       string `json:"target"`
	Name     string `json:"name"`
	Measured string `json:"measured"`
	Met      *bool  `json:"met,omitempty"`
}

func (t Target) verdict() string {
	switch {
	case t.Met == nil:
		return "info"
	case *t.Met:
		return "met"
	default:
		return "MISSED"
	}
}

// Tolerances of the targets.
const (
	p50Slack          = 0.05  // ms: Manager single-caller p50 may exceed pg-single's by this
	setbasedShare     = 0.80  // target 2
	hotShare1         = 0.80  // target 3, one process
	hotShare2         = 0.70  // target 3, two processes
	heapPerLockMax    = 1024  // B, target 4 at 10,000 locks
	stmtsPerTickMax   = 10    // target 4 at 100,000 locks
	advisoryRegress   = 0.90  // target 5: advisory figures ≥ 90 % of the baseline's (run-to-run noise)
	roundTripsPerOpOK = 1.001 // target 5: round trips per operation
)

// results indexes a run's results.
type resultSet []Result

func (rs resultSet) find(scenario, impl string, callers, procs int) (Result, bool) {
	for _, r := range rs {
		if r.Scenario == scenario && r.Impl == impl && r.Callers == callers && max(r.Processes, 1) == procs {
			return r, true
		}
	}
	return Result{}, false
}

func (rs resultSet) all(scenario, impl string) []Result {
	var out []Result
	for _, r := range rs {
		if r.Scenario == scenario && r.Impl == impl {
			out = append(out, r)
		}
	}
	return out
}

func boolp(b bool) *bool { return &b }

// computeTargets judges the run's results against the performance targets.
// base holds earlier results (the baseline) for target 5; it may be empty.
func computeTargets(res, base resultSet) []Target {
	var ts []Target
	add := func(id, name, measured string, met *bool) {
		ts = append(ts, Target{ID: id, Name: name, Measured: measured, Met: met})
	}
	// 1. Manager ≥ pg-single at every C; single-caller p50 within 0.05 ms.
	for _, m := range res.all("uncontended", "manager") {
		if s, ok := res.find("uncontended", "pg-single", m.Callers, 1); ok {
			add("1", fmt.Sprintf("manager ≥ pg-single, C=%d", m.Callers),
				fmt.Sprintf("%.0f vs %.0f/s (%.0f %%)", m.CyclesPerSec, s.CyclesPerSec, 100*m.CyclesPerSec/s.CyclesPerSec),
				boolp(m.CyclesPerSec >= s.CyclesPerSec))
		}
	}
	if m, ok := res.find("uncontended", "manager", 1, 1); ok {
		if s, ok := res.find("uncontended", "pg-single", 1, 1); ok {
			add("1", fmt.Sprintf("single-caller p50 ≤ pg-single's + %.2f ms", p50Slack),
				fmt.Sprintf("%.3f vs %.3f ms (%+.3f)", m.P50Ms, s.P50Ms, m.P50Ms-s.P50Ms),
				boolp(m.P50Ms <= s.P50Ms+p50Slack))
			if mo, ok := m.Extra["outside_us_per_cycle"]; ok {
				if so, ok := s.Extra["outside_us_per_cycle"]; ok {
					add("1", "single caller, per cycle (acquire + release): time outside the statements; the statements' time",
						fmt.Sprintf("manager %.0f µs, pg-single %.0f µs; %.0f vs %.0f µs", mo, so, m.Extra["stmt_us_per_cycle"], s.Extra["stmt_us_per_cycle"]), nil)
				}
			}
		}
	}
	// The actor floor (actor.go): the Manager's shape without its kernel,
	// against the same references.
	for _, a := range res.all("uncontended", "actor-floor") {
		if a.Callers == 1 {
			if s, ok := res.find("uncontended", "pg-single", 1, 1); ok {
				add("1", "actor floor (the shape alone: channels, one actor goroutine, statement workers; no kernel) against pg-single, C=1",
					fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*a.CyclesPerSec/s.CyclesPerSec, a.CyclesPerSec, s.CyclesPerSec), nil)
			}
		}
		if m, ok := res.find("uncontended", "manager", a.Callers, 1); ok {
			add("1", fmt.Sprintf("manager against the actor floor, C=%d", a.Callers),
				fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*m.CyclesPerSec/a.CyclesPerSec, m.CyclesPerSec, a.CyclesPerSec), nil)
		}
	}
	// 2. Manager ≥ 80 % of pg-setbased at C ≥ 64.
	for _, m := range res.all("uncontended", "manager") {
		if m.Callers < 64 {
			continue
		}
		if c, ok := res.find("uncontended", "pg-setbased", m.Callers, 1); ok {
			share := m.CyclesPerSec / c.CyclesPerSec
			add("2", fmt.Sprintf("manager ≥ %.0f %% of pg-setbased, C=%d", 100*setbasedShare, m.Callers),
				fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*share, m.CyclesPerSec, c.CyclesPerSec), boolp(share >= setbasedShare))
			if a, ok := res.find("uncontended", "actor-floor", m.Callers, 1); ok {
				add("2", fmt.Sprintf("actor floor's share of pg-setbased, C=%d", m.Callers),
					fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*a.CyclesPerSec/c.CyclesPerSec, a.CyclesPerSec, c.CyclesPerSec), nil)
			}
		}
	}
	// 3. Hot key as a share of the flush bound; FIFO; no timeouts.
	hot := res.all("hotkey", "manager")
	if f, ok := res.find("flush", "one-row-commit", 1, 1); ok && f.CyclesPerSec > 0 {
		add("3", "flush bound: 1 / (one durable one-row commit round trip, one client)",
			fmt.Sprintf("%.0f/s (mean %.3f ms, p50 %.3f ms)", f.CyclesPerSec, 1000/f.CyclesPerSec, f.P50Ms), nil)
		if c, ok := res.find("flush", "handoff-chain", 1, 1); ok && c.CyclesPerSec > 0 {
			add("3", "hot-key statement alone: one client chaining the handoff statement (internal/store HandOff) on one key, no Manager",
				fmt.Sprintf("%.0f/s (%.0f %% of the flush bound, p50 %.3f ms)", c.CyclesPerSec, 100*c.CyclesPerSec/f.CyclesPerSec, c.P50Ms), nil)
			for _, h := range hot {
				add("3", fmt.Sprintf("hot key against the statement alone, C=%d P=%d", h.Callers, max(h.Processes, 1)),
					fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*h.CyclesPerSec/c.CyclesPerSec, h.CyclesPerSec, c.CyclesPerSec), nil)
			}
		}
		if g, ok := res.find("flush", "grant-floor", 1, 1); ok && g.CyclesPerSec > 0 {
			add("3", "grant floor: one client chaining one plain statement that writes what every grant on SyncGuard's tables writes (fence counter, lock row), no pglease",
				fmt.Sprintf("%.0f/s (%.0f %% of the flush bound, p50 %.3f ms)", g.CyclesPerSec, 100*g.CyclesPerSec/f.CyclesPerSec, g.P50Ms), nil)
		}
		for _, a := range res.all("flush", "actor-relay-floor") {
			add("3", fmt.Sprintf("actor relay, grant floor's statement: each grant handed to another of %d goroutines through the actor floor", a.Callers),
				fmt.Sprintf("%.0f/s (%.0f %% of the flush bound)", a.CyclesPerSec, 100*a.CyclesPerSec/f.CyclesPerSec), nil)
		}
		for _, a := range res.all("flush", "actor-relay") {
			add("3", fmt.Sprintf("actor relay: the handoff statement, each grant handed to another of %d goroutines through the actor floor, no pglease kernel", a.Callers),
				fmt.Sprintf("%.0f/s (%.0f %% of the flush bound)", a.CyclesPerSec, 100*a.CyclesPerSec/f.CyclesPerSec), nil)
			for _, h := range hot {
				if max(h.Processes, 1) == 1 {
					add("3", fmt.Sprintf("hot key against the actor relay, C=%d P=1", h.Callers),
						fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*h.CyclesPerSec/a.CyclesPerSec, h.CyclesPerSec, a.CyclesPerSec), nil)
				}
			}
		}
		for _, h := range hot {
			want := hotShare1
			if max(h.Processes, 1) > 1 {
				want = hotShare2
			}
			share := h.CyclesPerSec / f.CyclesPerSec
			add("3", fmt.Sprintf("hot key ≥ %.0f %% of the flush bound, C=%d P=%d", 100*want, h.Callers, max(h.Processes, 1)),
				fmt.Sprintf("%.0f %% (%.0f/s)", 100*share, h.CyclesPerSec), boolp(share >= want))
		}
		// With the fair queue (-hot-fair): reported, not judged (the
		// targets above are the default's).
		for _, h := range res.all("hotkey", "manager-fair") {
			add("3", fmt.Sprintf("with FairQueue: hot key's share of the flush bound, C=%d P=%d", h.Callers, max(h.Processes, 1)),
				fmt.Sprintf("%.0f %% (%.0f/s, %.0f timeouts)", 100*h.CyclesPerSec/f.CyclesPerSec, h.CyclesPerSec, h.Extra["timeouts"]), nil)
		}
	}
	if len(hot) > 0 {
		var inv, to float64
		for _, h := range hot {
			inv += h.Extra["fifo_inversions"]
			to += h.Extra["timeouts"]
		}
		add("3", fmt.Sprintf("hot key FIFO among one process's waiters (inversions beyond %v)", fifoTolerance),
			fmt.Sprintf("%.0f", inv), boolp(inv == 0))
		add("3", "hot key acquisition timeouts = 0", fmt.Sprintf("%.0f", to), boolp(to == 0))
	}
	// 4. Heartbeat.
	if h, ok := res.find("heartbeat", "manager", 10000, 1); ok {
		b := h.Extra["heap_B_per_lock"]
		add("4", "Go heap per held lock ≤ 1 KiB at 10,000 locks", fmt.Sprintf("%.0f B (%.2f KiB)", b, b/1024), boolp(b <= heapPerLockMax))
	}
	if h, ok := res.find("heartbeat", "manager", 100000, 1); ok {
		spt := h.Extra["stmts_per_tick"]
		add("4", fmt.Sprintf("100,000 locks: ≤ %d statements per tick", stmtsPerTickMax), fmt.Sprintf("%.2f", spt), boolp(spt <= stmtsPerTickMax))
		add("4", "100,000 locks: 0 losses", fmt.Sprintf("%.0f", h.Extra["lost"]), boolp(h.Extra["lost"] == 0))
		lag := "no extend in the window"
		if h.Latency == "lag" {
			lag = fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms", h.P50Ms, h.P99Ms, h.MaxMs)
		}
		add("4", "100,000 locks: extend lag (negative: sent early, at most TTL/12, to share a statement)", lag, nil)
		add("4", "100,000 locks: Go heap per held lock", fmt.Sprintf("%.0f B", h.Extra["heap_B_per_lock"]), nil)
	}
	// 5. No regression: round trips per operation, advisory figures.
	for _, impl := range []string{"manager", "pg-single"} {
		worst := 0.0
		n := 0
		for _, r := range res.all("uncontended", impl) {
			if v, ok := r.Extra["stmts_per_cycle"]; ok {
				worst = max(worst, v/2) // a cycle is two operations
				n++
			}
		}
		if n > 0 {
			add("5", fmt.Sprintf("%s: ≤ 1 round trip per operation (uncontended, all C)", impl),
				fmt.Sprintf("%.3f", worst), boolp(worst <= roundTripsPerOpOK))
		}
	}
	for _, r := range res.all("advisory", "session") {
		if v, ok := r.Extra["stmts_per_cycle"]; ok {
			add("5", fmt.Sprintf("advisory session: 1 round trip per operation, C=%d", r.Callers),
				fmt.Sprintf("%.3f", v/2), boolp(v/2 <= roundTripsPerOpOK))
		}
	}
	for _, r := range res {
		if r.Scenario != "advisory" {
			continue
		}
		b, ok := base.find("advisory", r.Impl, r.Callers, 1)
		if !ok || b.CyclesPerSec <= 0 {
			continue
		}
		share := r.CyclesPerSec / b.CyclesPerSec
		add("5", fmt.Sprintf("advisory %s C=%d ≥ %.0f %% of the baseline", r.Impl, r.Callers, 100*advisoryRegress),
			fmt.Sprintf("%.0f vs %.0f/s (%.0f %%)", r.CyclesPerSec, b.CyclesPerSec, 100*share), boolp(share >= advisoryRegress))
	}
	ts = append(ts, mixedTargets(res)...)
	ts = append(ts, primTargets(res)...)
	ts = append(ts, fairTargets(res)...)    // bench/fairness.go
	return append(ts, fleetTargets(res)...) // bench/fleet_targets.go
}

// mixedTargets judges target M (bench/mixed.go): with the release trigger
// installed, the SyncGuard side keeps ≥ mixedTargetShare of its alone
// throughput next to the Managers, with no acquisition timeout; the
// Managers' mixed throughput against theirs alone is the cost, reported.
func mixedTargets(res resultSet) []Target {
	var ts []Target
	add := func(name, measured string, met *bool) {
		ts = append(ts, Target{ID: "M", Name: name, Measured: measured, Met: met})
	}
	one := func(impl string) (Result, bool) { // the run's one row of impl
		rs := res.all("mixed", impl)
		if len(rs) == 0 {
			return Result{}, false
		}
		return rs[0], true
	}
	sgA, okA := one("syncguard-alone")
	sgM, okM := one("syncguard-mixed")
	if okA && okM && sgA.CyclesPerSec > 0 {
		share := sgM.CyclesPerSec / sgA.CyclesPerSec
		add(fmt.Sprintf("SyncGuard next to Managers ≥ %.0f %% of SyncGuard alone", 100*mixedTargetShare),
			fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*share, sgM.CyclesPerSec, sgA.CyclesPerSec), boolp(share >= mixedTargetShare))
	}
	if okM {
		alone := "-"
		if okA {
			alone = fmt.Sprintf("%.0f", sgA.Extra["timeouts"])
		}
		n := sgM.Extra["timeouts"]
		add("SyncGuard next to Managers: 0 acquisition timeouts",
			fmt.Sprintf("%.0f (alone: %s)", n, alone), boolp(n == 0))
	}
	mA, okMA := one("manager-alone")
	mM, okMM := one("manager-mixed")
	if okMA && okMM && mA.CyclesPerSec > 0 {
		add("Managers next to SyncGuard against Managers alone (the cost)",
			fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*mM.CyclesPerSec/mA.CyclesPerSec, mM.CyclesPerSec, mA.CyclesPerSec), nil)
	}
	return ts
}

// loadBaseline reads results printed by an earlier `bench -json` run (lines
// that are not results are skipped). A missing file is no baseline.
func loadBaseline(path string) (resultSet, string, error) {
	if path == "" {
		return nil, "", nil
	}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	var rs resultSet
	var about string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var v struct {
			Result
			Note string `json:"note"`
		}
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		if v.Note != "" && about == "" {
			about = v.Note
		}
		if v.Scenario != "" {
			rs = append(rs, v.Result)
		}
	}
	return rs, about, sc.Err()
}

// printTargets prints the targets table (or one JSON object per target)
// and returns the targets.
func printTargets(out io.Writer, cfg config, res []Result, note noteFunc) []Target {
	base, about, err := loadBaseline(cfg.baseline)
	if err != nil {
		note("baseline: %v", err)
	}
	ts := computeTargets(res, base)
	if len(ts) == 0 {
		return nil
	}
	before := map[string]string{} // the same targets judged on the baseline's figures
	for _, t := range computeTargets(base, nil) {
		before[t.ID+t.Name] = t.Measured
	}
	if cfg.json {
		enc := json.NewEncoder(out)
		for _, t := range ts {
			_ = enc.Encode(t)
		}
		return ts
	}
	fmt.Fprintln(out, "\n# performance targets, measured in this run")
	if len(base) > 0 {
		fmt.Fprintf(out, "# baseline (last column, and target 5's advisory figures): %s: %s\n", cfg.baseline, about)
	}
	fmt.Fprintf(out, "%-2s %-66s %-40s %-7s %s\n", "#", "target", "measured", "verdict", "baseline")
	for _, t := range ts {
		b := before[t.ID+t.Name]
		if b == "" {
			b = "-"
		}
		fmt.Fprintf(out, "%-2s %-66s %-40s %-7s %s\n", t.ID, t.Name, t.Measured, t.verdict(), b)
	}
	return ts
}
