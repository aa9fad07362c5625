package main

import (
	"fmt"
	"sort"
)

// The fleet targets (docs/scaling.md, "A fleet of processes").
const (
	fleetCPUGrowthMax    = 1.2 // server CPU per grant at N=100 ≤ 1.2 × at N=10
	fleetNotifiedMax     = 1.5 // notifications delivered per grant
	fleetIdleConnsMax    = 3   // server connections per idle worker process
	fleetCPUBaseN        = 10
	fleetCPUCompareN     = 100
	fleetIdleConnsLabel  = "≤ 3 server connections per idle process"
	fleetNotifiedLabel   = "≤ 1.5 notifications delivered per grant"
	fleetClientCPULabel  = "client CPU (reported)"
	fleetFairImplSuffix  = " (FairQueue)"
	fleetImplDefault     = "manager"
	fleetImplFairQueue   = "manager-fair"
	fleetClientCPUFormat = "%.2f ms/grant, %.1f µs/held lease·s loaded, %s µs/held lease·s idle"
)

// fleetTargets judges the fleet steps of the run, for the default
// Managers and, apart, for those with FairQueue (-fleet-fair): no held
// lease lost at any N (the extends alone fit at every N the bench runs:
// each worker sends one extend statement per tick, about 0.3/s, for its
// 100 leases), server CPU per grant at N=100 within 1.2× that at N=10, at
// most 1.5 notifications delivered per grant, at most 3 server
// connections per idle worker (with -fleet-idle); the workers' CPU is
// reported.
func fleetTargets(res resultSet) []Target {
	var ts []Target
	for _, impl := range []string{fleetImplDefault, fleetImplFairQueue} {
		ts = append(ts, fleetImplTargets(res, impl)...)
	}
	return ts
}

func fleetImplTargets(res resultSet, impl string) []Target {
	steps := res.all("fleet", impl)
	sort.Slice(steps, func(i, j int) bool { return steps[i].Callers < steps[j].Callers })
	suffix := ""
	if impl == fleetImplFairQueue {
		suffix = fleetFairImplSuffix
	}
	var ts []Target
	add := func(id, name, measured string, met *bool) {
		ts = append(ts, Target{ID: id, Name: name + suffix, Measured: measured, Met: met})
	}
	for _, r := range steps {
		if _, ok := r.Extra["lost"]; !ok {
			continue // a churn result
		}
		lost := r.Extra["lost"]
		add("F", fmt.Sprintf("0 lost leases, N=%d (extends fit: %.0f extend statements/s)", r.Callers, 0.3*float64(r.Callers)),
			fmt.Sprintf("%.0f", lost), boolp(lost == 0))
	}
	var base, cmp *Result
	for i := range steps {
		switch steps[i].Callers {
		case fleetCPUBaseN:
			base = &steps[i]
		case fleetCPUCompareN:
			cmp = &steps[i]
		}
	}
	if base != nil && cmp != nil {
		b, okb := base.Extra["cpu_ms_per_1k_grants"]
		c, okc := cmp.Extra["cpu_ms_per_1k_grants"]
		if okb && okc && b > 0 {
			add("F", fmt.Sprintf("server CPU/grant N=%d ≤ %.1f × N=%d", fleetCPUCompareN, fleetCPUGrowthMax, fleetCPUBaseN),
				fmt.Sprintf("%.2f× (%.0f vs %.0f ms/1k grants)", c/b, c, b), boolp(c/b <= fleetCPUGrowthMax))
		}
	}
	for _, r := range steps {
		if v, ok := r.Extra["notified_per_grant"]; ok {
			add("F", fmt.Sprintf("%s, N=%d", fleetNotifiedLabel, r.Callers), fmt.Sprintf("%.2f", v), boolp(v <= fleetNotifiedMax))
		}
	}
	for _, r := range steps {
		if v, ok := r.Extra["client_cpu_ms_per_grant"]; ok {
			idle := "n/a"
			if i, ok := r.Extra["idle_client_cpu_us_per_lease_s"]; ok {
				idle = fmt.Sprintf("%.2f", i)
			}
			add("F", fmt.Sprintf("%s, N=%d", fleetClientCPULabel, r.Callers),
				fmt.Sprintf(fleetClientCPUFormat, v, r.Extra["client_cpu_us_per_lease_s"], idle), nil)
		}
	}
	for _, r := range steps {
		if v, ok := r.Extra["idle_conns_per_proc"]; ok {
			add("F", fmt.Sprintf("%s, N=%d (after %.0f s idle)", fleetIdleConnsLabel, r.Callers, r.Extra["idle_s"]),
				fmt.Sprintf("%.2f (%.0f conns, %.0f listening)", v, r.Extra["idle_conns"], r.Extra["idle_listen_conns"]),
				boolp(v <= fleetIdleConnsMax))
		}
	}
	return ts
}
