package main

import (
	"strings"
	"testing"
)

// TestMixedTargets: target M is judged from the four mixed rows; the
// Managers' cost is reported, not judged.
func TestMixedTargets(t *testing.T) {
	row := func(impl string, perSec, timeouts float64) Result {
		return Result{Scenario: "mixed", Impl: impl, Callers: 9, Processes: 3, CyclesPerSec: perSec,
			Extra: map[string]float64{"timeouts": timeouts}}
	}
	for _, c := range []struct {
		sgMixed, timeouts float64
		share, zero       bool
	}{
		{sgMixed: 150, timeouts: 0, share: true, zero: true},
		{sgMixed: 90, timeouts: 3, share: false, zero: false},
	} {
		res := resultSet{row("syncguard-alone", 200, 1), row("manager-alone", 600, 0),
			row("syncguard-mixed", c.sgMixed, c.timeouts), row("manager-mixed", 150, 0)}
		ts := mixedTargets(res)
		if len(ts) != 3 {
			t.Fatalf("%d targets, want 3: %+v", len(ts), ts)
		}
		if ts[0].Met == nil || *ts[0].Met != c.share {
			t.Errorf("share target %+v, want met=%t", ts[0], c.share)
		}
		if ts[1].Met == nil || *ts[1].Met != c.zero || !strings.Contains(ts[1].Measured, "alone: 1") {
			t.Errorf("timeouts target %+v, want met=%t and the alone figure", ts[1], c.zero)
		}
		if ts[2].Met != nil || !strings.Contains(ts[2].Measured, "25 %") {
			t.Errorf("cost %+v, want reported (info) as 25 %%", ts[2])
		}
	}
	if ts := mixedTargets(resultSet{row("syncguard-alone", 200, 0)}); len(ts) != 0 {
		t.Errorf("targets without the mixed rows: %+v", ts)
	}
}

// TestSummarizeMixedRounds: a side's rate is its sections over the sum of
// each round's longest worker run.
func TestSummarizeMixedRounds(t *testing.T) {
	r := summarizeMixed([][]mixedReport{
		{{Sections: 100, Seconds: 10, Timeouts: 1}, {Sections: 50, Seconds: 12}},
		{{Sections: 30, Seconds: 8, Timeouts: 2}},
	}, "syncguard-mixed", 9, 3)
	if r.Cycles != 180 || r.Seconds != 20 || r.CyclesPerSec != 9 || r.Extra["timeouts"] != 3 {
		t.Errorf("summary %+v: want 180 sections in 20 s, 9/s, 3 timeouts", r)
	}
}
