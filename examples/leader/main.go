// Command leader shows leader election with a session-level advisory
// lock (package pg/advisory): two candidates each open a Session and
// block on the same key; one leads. Then the leader's database session is
// killed with pg_terminate_backend: the server frees its lock at once, the
// other candidate's waiting Lock returns and it leads, and the old
// leader's lock Context is cancelled with ErrLockLost at its next probe.
//
// A session lock has no fencing token: between the kill and the old
// leader's probe, both believe they lead. Use it where that window is
// harmless (a scheduler, a cleanup), or fence the work (see
// examples/fenced).
//
//	go run ./internal/cmd/withpg -- go run ./examples/leader
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg/advisory"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Getenv("DATABASE_URL")); err != nil {
		fmt.Fprintln(os.Stderr, "leader:", err)
		os.Exit(1)
	}
}

// candidate is one contender: its own pool and Session, as if it were
// another process.
type candidate struct {
	name    string
	pool    *pgxpool.Pool
	sess    *advisory.Session
	leading chan *advisory.Lock // receives the lock when it leads
	err     chan error
}

func run(ctx context.Context, w io.Writer, url string) error {
	if url == "" {
		return errors.New("DATABASE_URL is not set")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	key, err := advisory.NamespacedKey("examples", "leader")
	if err != nil {
		return err
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}
	// Probe often, so a lost session is noticed within ~0.5 s.
	opts := &advisory.Options{ProbeInterval: 250 * time.Millisecond, ProbeTimeout: 250 * time.Millisecond}
	start := func(name string) (*candidate, error) {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return nil, err
		}
		sess, err := advisory.Open(ctx, pool, opts)
		if err != nil {
			pool.Close()
			return nil, err
		}
		c := &candidate{name: name, pool: pool, sess: sess, leading: make(chan *advisory.Lock, 1), err: make(chan error, 1)}
		go func() {
			lk, err := sess.Lock(ctx, key) // blocks until this candidate leads
			if err != nil {
				c.err <- err
				return
			}
			c.leading <- lk
		}()
		return c, nil
	}
	stop := func(c *candidate) {
		_ = c.sess.Close(context.Background())
		c.pool.Close()
	}
	await := func(c *candidate) (*advisory.Lock, error) {
		select {
		case lk := <-c.leading:
			return lk, nil
		case err := <-c.err:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}

	a, err := start("A")
	if err != nil {
		return err
	}
	defer stop(a)
	lkA, err := await(a)
	if err != nil {
		return err
	}
	say("A leads (session lock on %v)", key)

	b, err := start("B")
	if err != nil {
		return err
	}
	defer stop(b)
	// B waits on the server. Confirm it is waiting, not leading.
	select {
	case <-b.leading:
		return errors.New("candidate B leads while A holds the lock")
	case err := <-b.err:
		return err
	case <-time.After(300 * time.Millisecond):
	}
	say("B is waiting for the lock")

	// An operator (or a network failure) kills A's session.
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer admin.Close()
	var killed bool
	if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, a.sess.BackendPID()).Scan(&killed); err != nil {
		return err
	}
	if !killed {
		return errors.New("pg_terminate_backend refused")
	}
	killedAt := time.Now()
	say("A's database session is terminated (pg_terminate_backend)")

	lkB, err := await(b)
	if err != nil {
		return err
	}
	say("B leads: took over %s after the kill", round(time.Since(killedAt)))

	select {
	case <-lkA.Done():
	case <-ctx.Done():
		return errors.New("candidate A never learned that it lost the lock")
	}
	cause := context.Cause(lkA.Context())
	if !errors.Is(cause, pglease.ErrLockLost) {
		return fmt.Errorf("candidate A's lock ended with %v, want LockLost", cause)
	}
	say("A learns it lost leadership %s after the kill (lock context: LockLost) and steps down", round(time.Since(killedAt)))

	if err := lkB.Release(ctx); err != nil {
		return fmt.Errorf("candidate B's release: %v", err)
	}
	say("B steps down (Release)")
	return nil
}

// round prints a duration to 100 ms, so the output is stable.
func round(d time.Duration) string {
	if d < 100*time.Millisecond {
		return "within 0.1 s"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}
