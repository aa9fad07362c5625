package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLongJob: a job three TTLs long survives on heartbeats alone, and a
// job whose lock row is deleted stops within one TTL with LockLost (run
// checks the timing; the output is deterministic).
func TestLongJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, pgtest.URL(t)); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	want := `job 1: 30 of 30 steps done, lock held throughout: true
job 1 ran 3× its 1s TTL under one lease (auto-extended)
job 2: its lock row was deleted after 1 s
job 2: stopped early (true), cause LockLost: true, within one TTL of the deletion: true
job 2: Release reports the loss too (LockLost)
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
