// Package deploy checks the Grafana dashboard and the Prometheus alert
// rules in the repository's deploy/ folder: the rules pass promtool's
// checks and unit tests, and every metric and label they and the
// dashboard use is one a real pglease fleet emits through the
// OpenTelemetry Prometheus exporter.
package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

const (
	rulesDir  = "../../deploy/prometheus"
	rulesFile = "pglease.rules.yml"
	rulesTest = "pglease.rules.test.yml"
	dashboard = "../../deploy/grafana/pglease.json"
)

// promtool returns the promtool binary (Debian's prometheus package), or
// skips the test without it unless PGLEASE_REQUIRE_PROMTOOL=1 (CI), which
// makes its absence a failure.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("PGLEASE_REQUIRE_PROMTOOL") == "1" {
			t.Fatalf("promtool not found (PGLEASE_REQUIRE_PROMTOOL=1): install Debian's prometheus package")
		}
		t.Skip("promtool not found: install Debian's prometheus package (apt-get install prometheus) to check the alert rules")
	}
	return p
}

// TestAlertRules: the rules parse (promtool check rules) and fire, and
// stay quiet, as their unit test's scenario says (promtool test rules).
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTest}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = rulesDir
		out, err := cmd.CombinedOutput()
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("promtool %s: %v", strings.Join(args, " "), err)
		}
	}
}

// metricWord is a metric or label name of pglease's (or the semantic
// conventions' db.* ones) in PromQL or YAML text.
var metricWord = regexp.MustCompile(`\b(?:pglease|db)_[a-z0-9_]+\b`)

// used returns every pglease/db name in the rules, their unit test's
// series, and the dashboard's queries.
func used(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	add := func(where, text string) {
		for _, w := range metricWord.FindAllString(text, -1) {
			if !slices.Contains(out[w], where) {
				out[w] = append(out[w], where)
			}
		}
	}
	for _, f := range []string{rulesFile, rulesTest} {
		b, err := os.ReadFile(filepath.Join(rulesDir, f))
		if err != nil {
			t.Fatal(err)
		}
		add(f, string(b))
	}
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	if len(d.Panels) == 0 {
		t.Fatalf("%s: no panels", dashboard)
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			add("dashboard panel "+p.Title, q.Expr)
		}
	}
	return out
}

// TestEveryMetricUsedIsEmitted: every metric (a histogram's _bucket,
// _sum, _count included) and every label the dashboard, the rules and
// the rules' unit test name is one a real fleet run emitted, so neither
// queries something that does not exist.
func TestEveryMetricUsedIsEmitted(t *testing.T) {
	families, labels, _ := emitted(t)
	names := used(t)
	if len(names) < 10 {
		t.Fatalf("only %d pglease names found in the dashboard and rules: %v", len(names), names)
	}
	for w, where := range names {
		base := w
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(w, suf); ok && families[b] {
				base = b
			}
		}
		if !families[base] && !labels[w] {
			t.Errorf("%s (in %s) is neither a metric nor a label a fleet emitted", w, strings.Join(where, ", "))
		}
	}
	var missing []string
	for f := range families {
		if _, ok := names[f]; !ok && strings.HasPrefix(f, "pglease_") {
			found := false
			for w := range names {
				if strings.HasPrefix(w, f+"_") {
					found = true
				}
			}
			if !found {
				missing = append(missing, f)
			}
		}
	}
	slices.Sort(missing)
	t.Logf("emitted pglease metrics the dashboard and rules do not use: %v", missing)
}

// TestAlertRulesOnRecordedFleet: the rules evaluated by promtool on what a
// real fleet exported — the scrape while a lock was held and an acquire
// waited, then the scrape after a revocation, each repeated a minute
// apart — fire PgleaseLockLost for the revocation (the loss counter's
// series appears only with its first loss, which increase() alone does
// not count) and nothing else.
func TestAlertRulesOnRecordedFleet(t *testing.T) {
	bin := promtool(t)
	_, _, scrapes := emitted(t)
	if len(scrapes) != 2 {
		t.Fatalf("%d scrapes, want 2", len(scrapes))
	}
	const before, after = 5, 15 // samples of each scrape, one a minute
	type series struct {
		name   string
		labels map[string]string
		values [2]string // per scrape: the value, or "" when absent
	}
	all := map[string]*series{}
	for i, fams := range scrapes {
		for _, f := range fams {
			name := f.GetName()
			if !strings.HasPrefix(name, "pglease_") || f.GetType() == dto.MetricType_HISTOGRAM {
				continue
			}
			for _, m := range f.GetMetric() {
				ls := map[string]string{"job": "fleet", "instance": "recorded"}
				for _, l := range m.GetLabel() {
					ls[l.GetName()] = l.GetValue()
				}
				var v float64
				switch {
				case m.GetCounter() != nil:
					v = m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					v = m.GetGauge().GetValue()
				default:
					continue
				}
				id := seriesText(name, ls)
				sr := all[id]
				if sr == nil {
					sr = &series{name: name, labels: ls}
					all[id] = sr
				}
				sr.values[i] = strconv.FormatFloat(v, 'g', -1, 64)
			}
		}
	}
	var lostLabels map[string]string
	var b strings.Builder
	b.WriteString("rule_files:\n  - " + rulesFile + "\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n")
	ids := make([]string, 0, len(all))
	for id := range all {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		sr := all[id]
		var vals []string
		for i, n := range []int{before, after} {
			v := sr.values[i]
			if v == "" {
				v = "_"
			}
			for range n {
				vals = append(vals, v)
			}
		}
		fmt.Fprintf(&b, "      - series: '%s'\n        values: '%s'\n", strings.ReplaceAll(id, "'", "''"), strings.Join(vals, " "))
		if sr.name == "pglease_lock_lost_total" && sr.labels["pglease_loss_cause"] == "revoked" {
			lostLabels = sr.labels
		}
	}
	if lostLabels == nil {
		t.Fatal("the recorded fleet shows no revoked loss")
	}
	lost := "{severity: warning, job: fleet, instance: recorded, pglease_loss_cause: revoked}"
	fmt.Fprintf(&b, `    alert_rule_test:
      - eval_time: 3m
        alertname: PgleaseLockLost
        exp_alerts: []
      - eval_time: 7m
        alertname: PgleaseLockLost
        exp_alerts:
          - exp_labels: %s
            exp_annotations:
              summary: '1 pglease lock(s) lost on recorded (revoked)'
              description: 'expired: no extend succeeded in time (database or network trouble, a paused process); not_held: the database no longer had it; revoked: someone revoked it (the audit record of `+"`pglease release`"+` says who); session_ended: an advisory lock''s connection ended.'
`, lost)
	for _, a := range []string{"PgleaseLockHeldTooLong", "PgleaseWaitTooLong", "PgleaseOverloaded", "PgleaseListenerDown"} {
		for _, at := range []string{"4m", "19m"} {
			fmt.Fprintf(&b, "      - eval_time: %s\n        alertname: %s\n        exp_alerts: []\n", at, a)
		}
	}
	dir := t.TempDir()
	rules, err := os.ReadFile(filepath.Join(rulesDir, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, rulesFile), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "recorded.test.yml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "test", "rules", "recorded.test.yml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	t.Logf("promtool test rules (recorded fleet):\n%s", out)
	if err != nil {
		t.Fatalf("promtool: %v\n--- recorded.test.yml\n%s", err, b.String())
	}
}

// seriesText is a series in promtool's input syntax: name{k="v",…}.
func seriesText(name string, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Quote(labels[k])
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}
