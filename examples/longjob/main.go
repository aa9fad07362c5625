// Command longjob shows a job that runs much longer than its lease TTL:
// the Manager extends the lease in the background (auto-heartbeat), and
// the job watches the lock's Context, which ends as soon as the lock is
// lost. To show the loss, the lock row is deleted behind the job's back
// (as an operator, or a failover that lost the row, might): the next
// heartbeat finds no lease, the Context is cancelled with ErrLockLost and
// the job stops at its next step instead of working unprotected.
//
//	go run ./internal/cmd/withpg -C examples -- go run ./longjob
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

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/exampledb"
	"github.com/pglease/pglease/manager"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// A schema of its own, dropped at the end: nothing is left in your database.
	err := exampledb.Run(ctx, os.Getenv("DATABASE_URL"), "pglease_longjob", func(url string) error {
		return run(ctx, os.Stdout, url)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "longjob:", err)
		os.Exit(1)
	}
}

const (
	ttl   = time.Second
	step  = 100 * time.Millisecond
	steps = 30 // 3 s of work: three TTLs
)

// job does steps of work while ctx lasts; it returns how many it did.
func job(ctx context.Context) (int, error) {
	t := time.NewTicker(step)
	defer t.Stop()
	for n := 0; n < steps; n++ {
		select {
		case <-ctx.Done():
			return n, context.Cause(ctx)
		case <-t.C: // one step of work
		}
	}
	return steps, nil
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
	m, err := manager.New(pool, manager.Config{TTL: ttl})
	if err != nil {
		return err
	}
	defer m.Close(context.Background())
	if err := m.SetupSchema(ctx); err != nil {
		return err
	}
	key := fmt.Sprintf("longjob:%d", time.Now().UnixNano())

	// 1. A 3 s job under a 1 s lease: the heartbeat keeps it.
	start := time.Now()
	err = m.Do(ctx, key, func(ctx context.Context, _ *manager.Lock) error {
		n, err := job(ctx)
		fmt.Fprintf(w, "job 1: %d of %d steps done, lock held throughout: %v\n", n, steps, err == nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("job 1: %w", err)
	}
	fmt.Fprintf(w, "job 1 ran %.0f× its %v TTL under one lease (auto-extended)\n", time.Since(start).Seconds()/ttl.Seconds(), ttl)

	// 2. The same job; after 1 s its lock row is deleted behind its back.
	lk, err := m.Acquire(ctx, key)
	if err != nil {
		return err
	}
	defer lk.Release(context.WithoutCancel(ctx))
	deleted := make(chan time.Time, 1)
	go func() {
		select {
		case <-time.After(time.Second):
		case <-lk.Done():
			close(deleted)
			return
		}
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DELETE FROM syncguard_locks WHERE key = $1`, key)
		deleted <- time.Now()
	}()
	n, err := job(lk.Context())
	stoppedAt := time.Now()
	at, ok := <-deleted
	if !ok {
		return fmt.Errorf("job 2 ended before the lock row was deleted: %v", err)
	}
	fmt.Fprintln(w, "job 2: its lock row was deleted after 1 s")
	if !errors.Is(err, pglease.ErrLockLost) {
		return fmt.Errorf("job 2 ended with %v, want LockLost", err)
	}
	lag := stoppedAt.Sub(at)
	fmt.Fprintf(w, "job 2: stopped early (%v), cause LockLost: %v, within one TTL of the deletion: %v\n",
		n < steps, errors.Is(err, pglease.ErrLockLost), lag < ttl)
	if n >= steps || lag >= ttl {
		return fmt.Errorf("job 2 stopped %v after the deletion, at step %d", lag, n)
	}
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		return fmt.Errorf("release after the loss = %v, want LockLost", err)
	}
	fmt.Fprintln(w, "job 2: Release reports the loss too (LockLost)")
	return nil
}
