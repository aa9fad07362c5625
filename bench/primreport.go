package main

import (
	"fmt"
	"slices"
	"strings"
)

// sharedShare is the primitives' target P1: a reader's and a permit's
// uncontended acquire+release cycles/s at least this share of the
// exclusive lease's, at the same C, in the same run.
const sharedShare = 0.80

// usPerStep is the mean time one caller spends per step at r's rate:
// C / (steps per second), in µs.
func usPerStep(r Result) float64 {
	sps := r.Extra["steps_per_s"]
	if sps <= 0 {
		sps = r.CyclesPerSec
	}
	if sps <= 0 {
		return 0
	}
	return 1e6 * float64(r.Callers) / sps
}

// primTargets judges the primitives' scenarios (IDs P1–P5, apart from the
// project's targets 1–5): P1 is judged (shared holds within 80 % of the
// exclusive lease), P2 judges only that nothing broke (no violation, no
// timeout, no error); the rest are figures, reported.
func primTargets(res resultSet) []Target {
	var ts []Target
	add := func(id, name, measured string, met *bool) {
		ts = append(ts, Target{ID: id, Name: name, Measured: measured, Met: met})
	}
	// P1: reader and permit against the exclusive lease.
	for _, ex := range res.all("shared", "exclusive") {
		for _, impl := range []string{"reader", "semaphore"} {
			r, ok := res.find("shared", impl, ex.Callers, 1)
			if !ok || ex.CyclesPerSec <= 0 {
				continue
			}
			share := r.CyclesPerSec / ex.CyclesPerSec
			add("P1", fmt.Sprintf("%s ≥ %.0f %% of the exclusive lease, C=%d", impl, 100*sharedShare, ex.Callers),
				fmt.Sprintf("%.0f %% (%.0f vs %.0f/s)", 100*share, r.CyclesPerSec, ex.CyclesPerSec), boolp(share >= sharedShare))
		}
	}
	// P2: hot shared keys against the flush bound.
	if f, ok := res.find("hotshared", "flush-bound", 1, 1); ok && f.CyclesPerSec > 0 {
		add("P2", "hotshared flush bound (one durable one-row commit round trip, one client)",
			fmt.Sprintf("%.0f/s (p50 %.3f ms)", f.CyclesPerSec, f.P50Ms), nil)
		for _, r := range res {
			if r.Scenario != "hotshared" || r.Impl == "flush-bound" {
				continue
			}
			name := fmt.Sprintf("hot semaphore (N=%.0f) against the flush bound, C=%d", r.Extra["limit"], r.Callers)
			detail := ""
			if r.Impl == "rwlock" {
				name = fmt.Sprintf("hot reader-writer key (%.0f %% writers) against the flush bound, C=%d", 100*r.Extra["write_share"], r.Callers)
				detail = fmt.Sprintf("; reads %.0f, writes %.0f/s", r.Extra["reads_per_s"], r.Extra["writes_per_s"])
			}
			add("P2", name, fmt.Sprintf("%.0f %% (%.0f/s%s)", 100*r.CyclesPerSec/f.CyclesPerSec, r.CyclesPerSec, detail), nil)
		}
	}
	var viol, to, errs float64
	hot := false
	for _, r := range res {
		if r.Scenario == "hotshared" && r.Impl != "flush-bound" {
			hot = true
			viol += r.Extra["violations"]
			to += r.Extra["timeouts"]
			errs += float64(r.Errors)
		}
	}
	if hot {
		add("P2", "hot shared keys: 0 violations (too many holders at once), 0 timeouts, 0 errors",
			fmt.Sprintf("%.0f, %.0f, %.0f", viol, to, errs), boolp(viol == 0 && to == 0 && errs == 0))
	}
	// P3: sets against single-key cycles.
	for _, s := range res.all("sets", "single") {
		for _, impl := range []string{"set2", "set8"} {
			r, ok := res.find("sets", impl, s.Callers, 1)
			if !ok || s.CyclesPerSec <= 0 {
				continue
			}
			add("P3", fmt.Sprintf("%s against single-key cycles, C=%d", impl, s.Callers),
				fmt.Sprintf("%.0f keys/s = %.0f sets/s (%.0f %% of %.0f keys/s)", r.CyclesPerSec, r.Extra["steps_per_s"],
					100*r.CyclesPerSec/s.CyclesPerSec, s.CyclesPerSec), nil)
		}
	}
	// P4: cost per write.
	for _, tl := range res.all("txlease", "tx-lease") {
		p, ok1 := res.find("txlease", "plain-lease", tl.Callers, 1)
		w, ok2 := res.find("txlease", "write-only", tl.Callers, 1)
		if !ok1 || !ok2 {
			continue
		}
		add("P4", fmt.Sprintf("lease in the write's transaction against a plain lease, per write, C=%d", tl.Callers),
			fmt.Sprintf("%.0f vs %.0f µs (write alone %.0f)", usPerStep(tl), usPerStep(p), usPerStep(w)), nil)
	}
	for _, g := range res.all("guard", "guarded") {
		u, ok := res.find("guard", "unguarded", g.Callers, 1)
		if !ok {
			continue
		}
		m := fmt.Sprintf("%+.0f µs per write (%.0f vs %.0f µs)", usPerStep(g)-usPerStep(u), usPerStep(g), usPerStep(u))
		if c, ok := res.find("guard", "guard-call-only", g.Callers, 1); ok {
			m += fmt.Sprintf("; Lock.Guard alone %+.0f", usPerStep(c)-usPerStep(u))
		}
		add("P4", fmt.Sprintf("guarded write (Lock.Guard + database guard) against unguarded, C=%d", g.Callers), m, nil)
	}
	// P5: round trips per operation, the worst over C (batching lowers
	// them as C grows; C=1 shows one caller's).
	rt := func(scenario, impl, what string, per float64) {
		worst, n := 0.0, 0
		var cs []string
		for _, r := range res.all(scenario, impl) {
			if v, ok := r.Extra["stmts_per_step"]; ok {
				worst = max(worst, v/per)
				n++
				cs = append(cs, fmt.Sprintf("C=%d %.2f", r.Callers, v/per))
			}
		}
		if n > 0 {
			add("P5", fmt.Sprintf("round trips per %s: %s", what, impl), strings.Join(cs, ", "), nil)
		}
	}
	rt("shared", "exclusive", "operation (acquire or release)", 2)
	rt("shared", "reader", "operation (acquire or release)", 2)
	rt("shared", "semaphore", "operation (acquire or release)", 2)
	rt("sets", "set2", "set (AcquireAll + releases)", 1)
	rt("sets", "set8", "set (AcquireAll + releases)", 1)
	rt("txlease", "tx-lease", "write (BEGIN … COMMIT)", 1)
	rt("txlease", "plain-lease", "write (acquire, write, release)", 1)
	rt("guard", "guarded", "write (BEGIN … COMMIT)", 1)
	rt("guard", "guard-call-only", "write (BEGIN … COMMIT)", 1)
	rt("guard", "unguarded", "write (BEGIN … COMMIT)", 1)
	for _, r := range res {
		if r.Scenario == "hotshared" && r.Impl != "flush-bound" {
			add("P5", fmt.Sprintf("round trips per section: hot %s, C=%d", r.Impl, r.Callers),
				fmt.Sprintf("%.2f (%.1f waiters per shared acquire)", r.Extra["stmts_per_section"], r.Extra["shared_batch"]), nil)
		}
	}
	return ts
}

// writePrimMarkdown writes the primitives' tables (-markdown).
func writePrimMarkdown(w func(format string, args ...any), res resultSet) {
	table := func(scenario, title string, impls []string, cell func(r Result) string) {
		var cs []int
		for _, r := range res {
			if r.Scenario == scenario && !slices.Contains(cs, r.Callers) {
				cs = append(cs, r.Callers)
			}
		}
		if len(cs) == 0 {
			return
		}
		w("%s\n\n| C | %s |\n|---|%s\n", title, strings.Join(impls, " | "), strings.Repeat("---|", len(impls)))
		for _, c := range cs {
			cells := make([]string, len(impls))
			for i, impl := range impls {
				cells[i] = "–"
				if r, ok := res.find(scenario, impl, c, 1); ok {
					cells[i] = cell(r)
				}
			}
			w("| %d | %s |\n", c, strings.Join(cells, " | "))
		}
		w("\n")
	}
	cycle := func(r Result) string {
		return fmt.Sprintf("%s (%.2f ms; %.2f rt)", thousands(r.CyclesPerSec), r.P50Ms, r.Extra["stmts_per_step"])
	}
	table("shared", "Shared holds, uncontended acquire+release cycles/s (C callers, distinct keys; p50 of a cycle; round trips per cycle):",
		[]string{"exclusive", "reader", "semaphore"}, cycle)
	var hot []Result
	for _, r := range res {
		if r.Scenario == "hotshared" && r.Impl != "flush-bound" {
			hot = append(hot, r)
		}
	}
	if len(hot) > 0 {
		w("Hot shared key (one key, one process, empty critical section):\n\n| kind | C | sections/s | share of the flush bound | wait p50 / p99 | round trips per section | waiters per shared acquire | timeouts | violations |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range hot {
			kind := fmt.Sprintf("semaphore, N=%.0f", r.Extra["limit"])
			if r.Impl == "rwlock" {
				kind = fmt.Sprintf("reader-writer, %.0f %% writers (reads %s/s, writes %s/s; wait p99 %.1f / %.1f ms)", 100*r.Extra["write_share"],
					thousands(r.Extra["reads_per_s"]), thousands(r.Extra["writes_per_s"]), r.Extra["read_wait_p99_ms"], r.Extra["write_wait_p99_ms"])
			}
			w("| %s | %d | %s | %.0f %% | %.2f / %.2f ms | %.2f | %.1f | %.0f | %.0f |\n", kind, r.Callers, thousands(r.CyclesPerSec),
				100*r.Extra["flush_share"], r.P50Ms, r.P99Ms, r.Extra["stmts_per_section"], r.Extra["shared_batch"], r.Extra["timeouts"], r.Extra["violations"])
		}
		if f, ok := res.find("hotshared", "flush-bound", 1, 1); ok {
			w("\nFlush bound around these points: %s/s (p50 %.2f ms).\n", thousands(f.CyclesPerSec), f.P50Ms)
		}
		w("\n")
	}
	table("sets", "All-or-nothing sets, keys/s (sets/s; p50 of a set; round trips per set):",
		[]string{"single", "set2", "set8"}, func(r Result) string {
			return fmt.Sprintf("%s (%s; %.2f ms; %.2f rt)", thousands(r.CyclesPerSec), thousands(r.Extra["steps_per_s"]), r.P50Ms, r.Extra["stmts_per_step"])
		})
	perWrite := func(r Result) string {
		return fmt.Sprintf("%s/s (%s µs per write; %.2f rt)", thousands(r.CyclesPerSec), thousands(usPerStep(r)), r.Extra["stmts_per_step"])
	}
	table("txlease", "Lease in the caller's transaction (writes/s; a caller's mean time per write; round trips per write):",
		[]string{"tx-lease", "plain-lease", "write-only"}, perWrite)
	table("guard", "Guarded write: Lock.Guard and the database guard, Lock.Guard alone (a table without the trigger), neither (writes/s; a caller's mean time per write; round trips per write):",
		[]string{"guarded", "guard-call-only", "unguarded"}, perWrite)
}
