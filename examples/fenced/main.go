// Command fenced shows a fenced write in the same database with
// pg.FenceGuard: process A holds the lock on an invoice, claims the
// invoice row with its fence, and then pauses (a GC pause, a stalled VM)
// past its lease. Process B acquires the lock with a higher fence and
// claims the row. When A wakes up and writes, the database refuses the
// write, because the row already carries B's higher fence; A needs no
// timing assumptions for that.
//
//	go run ./internal/cmd/withpg -C examples -- go run ./fenced
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/exampledb"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// A schema of its own, dropped at the end: nothing is left in your database.
	err := exampledb.Run(ctx, os.Getenv("DATABASE_URL"), "pglease_fenced", func(url string) error {
		return run(ctx, os.Stdout, url)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fenced:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer, url string) error {
	if url == "" {
		return errors.New("DATABASE_URL is not set")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A and B stand for two processes. A takes a single lease with
	// pg.Store and never extends it: a paused process sends no heartbeat
	// and releases nothing. B uses a Manager.
	storeA, err := pg.New(pool, pg.Config{})
	if err != nil {
		return err
	}
	mB, err := manager.New(pool, manager.Config{})
	if err != nil {
		return err
	}
	defer mB.Close(context.Background())
	if err := mB.SetupSchema(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS fenced_invoices (
		id bigint PRIMARY KEY, fence bigint, state text NOT NULL DEFAULT 'open', sent_by text)`); err != nil {
		return err
	}
	var invoice int64
	if err := pool.QueryRow(ctx, `INSERT INTO fenced_invoices (id) SELECT coalesce(max(id), 0) + 1 FROM fenced_invoices RETURNING id`).Scan(&invoice); err != nil {
		return err
	}
	key := fmt.Sprintf("invoice:%d", invoice)
	guard, err := pg.NewFenceGuard("fenced_invoices", "id", "fence")
	if err != nil {
		return err
	}

	leaseA, err := storeA.Acquire(ctx, key, 500*time.Millisecond)
	if err != nil {
		return err
	}
	if !leaseA.OK {
		return errors.New("holder A could not take a fresh key")
	}
	fenceA := leaseA.Fence
	ok, err := guard.Update(ctx, pool, invoice, fenceA, pg.Set{Column: "state", Value: "sending"}, pg.Set{Column: "sent_by", Value: "A"})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "A holds the lock (fence A) and claims the invoice row: accepted=%v\n", ok)
	fmt.Fprintln(w, "A pauses past its lease …")

	// B waits for the lock: granted once A's lease is over (TTL + 1 s tolerance).
	waitStart := time.Now()
	lkB, err := mB.Acquire(ctx, key, manager.WithTTL(10*time.Second))
	if err != nil {
		return err
	}
	defer lkB.Release(context.WithoutCancel(ctx))
	waited := time.Since(waitStart)
	fmt.Fprintf(w, "B acquires the lock once A's lease (0.5 s) + 1 s tolerance have passed: fence B > fence A: %v\n", lkB.Fence() > fenceA)
	if waited < time.Second {
		return fmt.Errorf("holder B got the lock after %v, before A's lease could have ended", waited)
	}
	ok, err = guard.Update(ctx, pool, invoice, lkB.Fence(), pg.Set{Column: "state", Value: "sending"}, pg.Set{Column: "sent_by", Value: "B"})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "B claims the row with its fence: accepted=%v\n", ok)
	ok, err = guard.Update(ctx, pool, invoice, lkB.Fence(), pg.Set{Column: "state", Value: "sent"}, pg.Set{Column: "sent_by", Value: "B"})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "B marks the invoice sent: accepted=%v\n", ok)

	// A wakes up and, unaware, finishes its work.
	lateOK, err := guard.Update(ctx, pool, invoice, fenceA, pg.Set{Column: "state", Value: "sent"}, pg.Set{Column: "sent_by", Value: "A"})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "A wakes up and writes with its old fence: accepted=%v\n", lateOK)

	var state, by string
	var fence int64
	if err := pool.QueryRow(ctx, `SELECT state, sent_by, fence FROM fenced_invoices WHERE id = $1`, invoice).Scan(&state, &by, &fence); err != nil {
		return err
	}
	fmt.Fprintf(w, "invoice row: state=%s sent_by=%s, fence is B's: %v\n", state, by, fence == int64(lkB.Fence()))
	if lateOK || by != "B" || fence != int64(lkB.Fence()) {
		return errors.New("the stale write was not refused")
	}
	return nil
}
