package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRun runs the story and checks the summary tells it: two workers'
// acquire spans, both contended, the second coalesced behind the first,
// each granted, with their round trips and releases; the raw export and
// the Prometheus exposition follow.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	summary, rest, ok := strings.Cut(s, "== Raw spans (stdouttrace) ==")
	if !ok {
		t.Fatalf("no raw spans section:\n%s", s)
	}
	raw, prom, ok := strings.Cut(rest, "== Metrics (Prometheus text format) ==")
	if !ok {
		t.Fatal("no metrics section")
	}
	for _, re := range []string{
		`worker 1: charge payment \[internal\]`,
		`worker 2: charge payment \[internal\]`,
		`pglease\.acquire \[internal\] [0-9.]+ms key\.hash=a422dabe… .*outcome=granted .*acquire\.contended=true`,
		`acquire\.coalesced=true`,
		`acquire\.coalesced=false`,
		`event pglease\.attempt attempt=1 outcome=contended`,
		`event pglease\.queued .*queue\.position=1`,
		`pglease\.acquire_many \[client\] [0-9.]+ms batch\.size=1 batch\.ok=1`,
		`pglease\.release \[internal\] .*outcome=ok`,
		`pglease\.release_many \[client\]`,
		`links → #\d+ pglease\.acquire_many`,
	} {
		if !regexp.MustCompile(re).MatchString(summary) {
			t.Errorf("summary lacks %s", re)
		}
	}
	if n := strings.Count(summary, "pglease.acquire [internal]"); n != 2 {
		t.Errorf("%d acquire spans in the summary", n)
	}
	if strings.Contains(s, "payment:123") {
		t.Error("the raw key appears in the output")
	}
	if !strings.Contains(raw, `"Name":"pglease.acquire"`) {
		t.Error("raw export lacks the acquire span")
	}
	for _, m := range []string{"pglease_acquire_duration_seconds_bucket", "pglease_acquire_contended", "pglease_manager_queue_depth", "db_client_operation_duration_seconds"} {
		if !strings.Contains(prom, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	if testing.Verbose() {
		t.Log("\n" + summary)
	}
}
