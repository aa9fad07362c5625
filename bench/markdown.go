package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// writeMarkdown writes the run's tables in docs/performance.md's form (-markdown):
// uncontended cycles/s per implementation and C, hot key, heartbeat, the
// fleet, the primitives (writePrimMarkdown), and the targets, with the
// command, date and machine, ready to paste.
func writeMarkdown(path, header string, res resultSet, ts []Target) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := func(format string, args ...any) { fmt.Fprintf(f, format, args...) }
	w("<!-- written by `go run ./bench -markdown %s`, %s -->\n", path, time.Now().UTC().Format(time.RFC3339))
	w("%s\n\n", header)
	// Uncontended: one column per implementation, in a fixed order.
	order := []string{"syncguard-protocol", "pglock", "pg-single", "manager", "actor-floor", "pg-setbased", "redislock"}
	var impls []string
	var cs []int
	for _, r := range res {
		if r.Scenario != "uncontended" {
			continue
		}
		if !slices.Contains(impls, r.Impl) {
			impls = append(impls, r.Impl)
		}
		if !slices.Contains(cs, r.Callers) {
			cs = append(cs, r.Callers)
		}
	}
	slices.SortFunc(impls, func(a, b string) int { return rank(order, a) - rank(order, b) })
	slices.Sort(cs)
	if len(impls) > 0 {
		w("Uncontended acquire+release cycles/s (C callers, distinct keys; p50 of a cycle in parentheses):\n\n")
		w("| C | %s |\n|---|%s\n", strings.Join(impls, " | "), strings.Repeat("---|", len(impls)))
		for _, c := range cs {
			cells := make([]string, len(impls))
			for i, impl := range impls {
				cells[i] = "–"
				if r, ok := res.find("uncontended", impl, c, 1); ok {
					cells[i] = fmt.Sprintf("%s (%.2f ms)", thousands(r.CyclesPerSec), r.P50Ms)
				}
			}
			w("| %d | %s |\n", c, strings.Join(cells, " | "))
		}
		w("\n")
	}
	var hot []Result
	for _, r := range res {
		if r.Scenario == "hotkey" {
			hot = append(hot, r)
		}
	}
	if len(hot) > 0 {
		w("Hot key (one key, empty critical section):\n\n| implementation | C | processes | sections/s | latency p50 / p99 | busiest caller's share | timeouts |\n|---|---|---|---|---|---|---|\n")
		for _, r := range hot {
			w("| %s | %d | %d | %s | %s %.2f / %.2f ms | %.0f %% | %.0f |\n", r.Impl, r.Callers, max(r.Processes, 1),
				thousands(r.CyclesPerSec), r.Latency, r.P50Ms, r.P99Ms, 100*r.Extra["max_share"], r.Extra["timeouts"])
		}
		if f, ok := res.find("flush", "one-row-commit", 1, 1); ok {
			w("\nFlush bound (one durable one-row commit round trip, one client): %s/s (p50 %.2f ms).\n", thousands(f.CyclesPerSec), f.P50Ms)
		}
		w("\n")
	}
	var hb []Result
	for _, r := range res {
		if r.Scenario == "heartbeat" {
			hb = append(hb, r)
		}
	}
	if len(hb) > 0 {
		w("Heartbeat (one Manager holding N locks):\n\n| locks | TTL | statements per tick (TTL/3) | extend lag p50 / p99 / max | lost | Go heap per lock |\n|---|---|---|---|---|---|\n")
		for _, r := range hb {
			lag := "–"
			if r.Latency == "lag" {
				lag = fmt.Sprintf("%.1f / %.1f / %.1f ms", r.P50Ms, r.P99Ms, r.MaxMs)
			}
			w("| %s | %.0f s | %.2f | %s | %.0f | %.0f B |\n", thousands(float64(r.Callers)), r.Extra["ttl_s"], r.Extra["stmts_per_tick"], lag,
				r.Extra["lost"], r.Extra["heap_B_per_lock"])
		}
		w("\n")
	}
	var fleet, churn []Result
	for _, r := range res {
		switch r.Scenario {
		case "fleet":
			fleet = append(fleet, r)
		case "fleet-churn":
			churn = append(churn, r)
		}
	}
	if len(fleet) > 0 {
		w("Fleet (N worker processes, each one default Manager, or one with FairQueue in the rows \"N fair\"; see docs/scaling.md for the load and how each column is measured):\n\n")
		w("| %s |\n|%s\n", strings.Join(fleetColumns, " | "), strings.Repeat("---|", len(fleetColumns)))
		for _, r := range fleet {
			w("| %s |\n", strings.Join(fleetCells(r), " | "))
		}
		w("\n")
	}
	for _, r := range churn {
		w("Fleet churn, N=%d: %.0f s, %.0f samples, %s grants/s, %d errors, %.0f lost:\n\n", r.Processes, r.Seconds, r.Extra["samples"],
			thousands(r.CyclesPerSec), r.Errors, r.Extra["lost"])
		w("| %s |\n|%s\n", strings.Join(churnColumns, " | "), strings.Repeat("---|", len(churnColumns)))
		for _, row := range churnRows(r) {
			w("| %s |\n", strings.Join(row, " | "))
		}
		w("\n")
	}
	writePrimMarkdown(w, res)
	if len(ts) > 0 {
		w("Performance targets, judged on this run:\n\n| # | target | measured | |\n|---|---|---|---|\n")
		for _, t := range ts {
			v := t.verdict()
			if v == "MISSED" {
				v = "**missed**"
			}
			w("| %s | %s | %s | %s |\n", t.ID, t.Name, t.Measured, v)
		}
	}
	return nil
}

func rank(order []string, s string) int {
	if i := slices.Index(order, s); i >= 0 {
		return i
	}
	return len(order)
}

// thousands formats v rounded, with commas: 12345.6 → "12,346".
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
