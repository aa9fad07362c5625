package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRun runs the story and checks the output: the story in words first,
// then the summary telling it as spans (two workers' acquire spans, both
// contended, the second coalesced behind the first, each granted, with
// their round trips and releases), then the metrics with the same
// resource as the traces; the raw spans go to the -spans file only.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	spansFile := filepath.Join(t.TempDir(), "spans.json")
	if err := run(ctx, &out, pgtest.URL(t), spansFile); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	storyPart, rest, ok := strings.Cut(s, "== Trace summary")
	if !ok || !strings.HasPrefix(storyPart, "== The story") {
		t.Fatalf("the output does not start with the story, then the summary:\n%s", s)
	}
	for _, re := range []string{
		`(?m)^ +\d+ ms  billing-b \(another process\) holds the key, fence \d+$`,
		`worker 1 gets the key after \d+ ms, fence \d+`,
		`worker 2 gets the key after \d+ ms, fence \d+`,
		`billing-b releases the key`,
	} {
		if !regexp.MustCompile(re).MatchString(storyPart) {
			t.Errorf("story lacks %s:\n%s", re, storyPart)
		}
	}
	summary, prom, ok := strings.Cut(rest, "== Metrics (Prometheus text format) ==")
	if !ok {
		t.Fatal("no metrics section")
	}
	if !regexp.MustCompile(`server\.address=\S+ server\.port=\d+ db\.namespace=\S+`).MatchString(summary) {
		t.Errorf("summary does not name the database server:\n%s", summary)
	}
	if strings.Contains(s, `"Name":`) {
		t.Error("raw spans printed to the output")
	}
	raw, err := os.ReadFile(spansFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"Name":"pglease.acquire"`) || !strings.Contains(string(raw), `"Value":"billing-a"`) {
		t.Error("raw export lacks the acquire span or the resource")
	}
	if !strings.Contains(prom, `service_name="billing-a"`) || strings.Contains(prom, "unknown_service") {
		t.Errorf("metrics do not carry the traces' resource (service.name=billing-a)")
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
	for _, m := range []string{"pglease_acquire_duration_seconds_bucket", "pglease_acquire_contended", "pglease_manager_queue_depth", "db_client_operation_duration_seconds"} {
		if !strings.Contains(prom, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	if testing.Verbose() {
		t.Log("\n" + summary)
	}
}
