package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestWebhook runs the example twice (a second run must not be affected
// by the first) and checks, in the database, that every event's side
// effect happened exactly once — independently of run's own checks.
func TestWebhook(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL := pgtest.SchemaURL(t) // a schema of its own: -count=N runs start empty
	for range 2 {
		var out bytes.Buffer
		if err := run(ctx, &out, dbURL); err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "exactly once") {
			t.Fatalf("output:\n%s", out.String())
		}
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var events, maxEffects, processed int
	err = conn.QueryRow(ctx, `SELECT count(*), max(n) FROM (SELECT count(*) AS n FROM webhook_effects GROUP BY event_id) s`).Scan(&events, &maxEffects)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM webhook_processed`).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	if events != 2*3 || maxEffects != 1 || processed != events {
		t.Fatalf("events with effects %d (want 6), max effects per event %d (want 1), processed rows %d", events, maxEffects, processed)
	}
	var held int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("%d locks left behind", held)
	}
}
