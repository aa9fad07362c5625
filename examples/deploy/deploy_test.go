// Package deploy checks the Grafana dashboard and the Prometheus alert
// rules in the repository's deploy/ folder: the rules pass promtool's
// checks and unit tests, and every metric and label they and the
// dashboard use is one a real pglease fleet emits through the
// OpenTelemetry Prometheus exporter.
package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
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
	families, labels := emitted(t)
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
