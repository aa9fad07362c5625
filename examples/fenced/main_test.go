package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestFenced: the whole output is deterministic; run also fails by itself
// if the stale write was accepted or the row lacks B's fence.
func TestFenced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, pgtest.URL(t)); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	want := `A holds the lock (fence A) and claims the invoice row: accepted=true
A pauses past its lease …
B acquires the lock once A's lease (0.5 s) + 1 s tolerance have passed: fence B > fence A: true
B claims the row with its fence: accepted=true
B marks the invoice sent: accepted=true
A wakes up and writes with its old fence: accepted=false
invoice row: state=sent sent_by=B, fence is B's: true
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
