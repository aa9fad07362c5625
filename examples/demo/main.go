// Command demo shows pglease's lease locks on the PostgreSQL at
// DATABASE_URL: it sets up the schema, acquires, extends, looks up and
// releases a few locks, and prints what happened. It never prints a raw
// lockId (a bearer secret), only its SyncGuard hash.
//
//	make demo                          # throwaway PostgreSQL
//	DATABASE_URL=postgres://… go run ./examples/demo
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return fmt.Errorf("DATABASE_URL is not set (make demo starts a throwaway PostgreSQL)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pg.New(pool, pg.Config{})
	if err != nil {
		return err
	}
	if err := store.SetupSchema(ctx); err != nil {
		return err
	}
	fmt.Println("schema ready: syncguard_locks, syncguard_fence_counters (SyncGuard-compatible)")

	a, err := store.Acquire(ctx, "demo:invoice:42", 2*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("acquire demo:invoice:42 → ok=%v fence=%s lockId#%s ttl=%v\n",
		a.OK, a.Fence, pglease.HashKey(a.LockID), a.ExpiresAt.Sub(a.AcquiredAt))

	b, err := store.Acquire(ctx, "demo:invoice:42", 2*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("acquire again from another caller → ok=%v (locked is a result, not an error)\n", b.OK)

	e, err := store.Extend(ctx, a.LockID, 10*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("extend to 10s → ok=%v, expires %v after the grant\n", e.OK, e.ExpiresAt.Sub(a.AcquiredAt).Round(time.Second))

	info, err := store.LookupByKey(ctx, "demo:invoice:42")
	if err != nil {
		return err
	}
	fmt.Printf("lookup by key → %v\n", info)

	many, err := store.AcquireMany(ctx, []pg.AcquireRequest{
		{Key: "demo:a", TTL: 5 * time.Second}, {Key: "demo:b", TTL: 5 * time.Second}, {Key: "demo:invoice:42", TTL: 5 * time.Second},
	})
	if err != nil {
		return err
	}
	var ids []string
	for i, r := range many {
		fmt.Printf("acquireMany[%d] → ok=%v fence=%s\n", i, r.OK, r.Fence)
		if r.OK {
			ids = append(ids, r.LockID)
		}
	}
	rel, err := store.ReleaseMany(ctx, ids)
	if err != nil {
		return err
	}
	fmt.Printf("releaseMany(%d) → %v\n", len(ids), rel)

	ok, err := store.Release(ctx, a.LockID)
	if err != nil {
		return err
	}
	fmt.Printf("release demo:invoice:42 → %v; again → ", ok)
	ok, err = store.Release(ctx, a.LockID)
	if err != nil {
		return err
	}
	fmt.Println(ok)

	c, err := store.Acquire(ctx, "demo:invoice:42", time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("re-acquire → ok=%v fence=%s (fences only grow)\n", c.OK, c.Fence)
	if _, err := store.Release(ctx, c.LockID); err != nil {
		return err
	}

	_, err = store.Acquire(ctx, "", time.Second)
	fmt.Printf("acquire with an empty key → %v\n", err)
	return nil
}
