package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// TestExtendDurableAcrossCrash: on a server whose default is
// synchronous_commit = off and whose WAL writer flushes only every 10 s,
// acknowledged extends survive a crash (immediate shutdown) as acquires
// do: after the restart every lease's expiry is the one Extend returned,
// not the older one of its acquire. A canary row committed the same way
// without forcing synchronous commit shows that the crash does lose
// unflushed commits here. Runs on a cluster of its own, since it crashes
// it.
func TestExtendDurableAcrossCrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	admin, err := pgxpool.New(ctx, cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"ALTER SYSTEM SET synchronous_commit = off",
		"ALTER SYSTEM SET wal_writer_delay = '10s'",
		"CREATE TABLE canary (id int PRIMARY KEY)",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	admin.Close()
	// Restart so that every process starts with the new settings (a reload
	// reaches the WAL writer only after its current sleep).
	if err := cl.Restart(ctx, false); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { pool.Close() }()
	var sc string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil || sc != "off" {
		t.Fatalf("synchronous_commit = %q, %v", sc, err)
	}
	s, err := store.New("pg.New", pool, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := setupSchema(s, ctx); err != nil {
		t.Fatal(err)
	}
	const n = 5
	ids := make([]string, n)
	want := make([]int64, n)
	for i := range n {
		r, err := s.Acquire(ctx, store.AcquireRequest{Key: fmt.Sprint("durable:", i), TTL: time.Minute})
		if err != nil || !r.OK {
			t.Fatal(r, err)
		}
		ids[i] = r.LockID
	}
	// All grants are flushed now (acquire commits synchronously); the
	// extends and the canary are the only commits after them.
	for i := range n {
		e, err := s.Extend(ctx, ids[i], time.Hour)
		if err != nil || !e.OK {
			t.Fatal(e, err)
		}
		want[i] = e.ExpiresAt.UnixMilli()
	}
	if _, err := pool.Exec(ctx, "INSERT INTO canary VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if err := cl.StopServer(true); err != nil { // SIGQUIT: no shutdown checkpoint, WAL buffers lost
		t.Fatal(err)
	}
	if err := cl.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	pool, err = pgxpool.New(ctx, cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	var canary int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM canary").Scan(&canary); err != nil {
		t.Fatal(err)
	}
	t.Logf("asynchronously committed canary rows after the crash: %d of 1", canary)
	lost := 0
	for i := range n {
		var exp int64
		if err := pool.QueryRow(ctx, "SELECT expires_at_ms FROM syncguard_locks WHERE lock_id = $1", ids[i]).Scan(&exp); err != nil {
			t.Fatal(err)
		}
		if exp != want[i] {
			lost++
			t.Errorf("lease %d: expiry after the crash %d ms before the acknowledged one", i, want[i]-exp)
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged extends lost in the crash", lost, n)
	}
}
