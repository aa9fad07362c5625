// Command leader shows leader election with election.Run: two
// candidates (each its own Manager and pool, as if they were two
// processes) campaign for one lease. A leads and does fenced work with its
// term's fence; B waits and learns who leads. A finishes and resigns: B
// leads at once with a higher fence (the release wakes it), and A now sees
// B lead. B shuts down; A leads again. A leader that dies or hangs instead
// is replaced once its lease expires (TTL + 1 s tolerance), and its late
// writes are refused by the fence: see TestElectionProcesses in package
// election (SIGKILL and SIGSTOP of the leader) and examples/demo.
//
//	go run ./internal/cmd/withpg -C examples -- go run ./leader
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

	"github.com/pglease/pglease/election"
	"github.com/pglease/pglease/internal/exampledb"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// A schema of its own, dropped at the end: nothing is left in your database.
	err := exampledb.Run(ctx, os.Getenv("DATABASE_URL"), "pglease_leader", func(url string) error {
		return run(ctx, os.Stdout, url)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "leader:", err)
		os.Exit(1)
	}
}

// The work the leader does: a fenced write, refused once a newer term wrote.
const fencedWrite = `UPDATE leader_work SET fence = $1, writes = writes + 1, last_writer = $2 WHERE fence <= $1`

func run(ctx context.Context, w io.Writer, url string) error {
	if url == "" {
		return errors.New("DATABASE_URL is not set")
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}

	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer admin.Close()
	setup, err := manager.New(admin, manager.Config{})
	if err != nil {
		return err
	}
	if err := setup.SetupSchema(ctx); err != nil {
		return err
	}
	_ = setup.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE TABLE leader_work (fence bigint NOT NULL, writes bigint NOT NULL, last_writer text);
		INSERT INTO leader_work VALUES (0, 0, NULL)`); err != nil {
		return err
	}

	type candidate struct {
		name  string
		m     *manager.Manager
		pool  *pgxpool.Pool
		stop  context.CancelFunc // ends its campaign
		terms chan uint64        // the fence of each term it starts
		done  chan error
		// resign tells the leader to finish its work and return.
		resign chan struct{}
		sees   chan string // the identity of each other leader it observes
	}
	start := func(name string) (*candidate, error) {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return nil, err
		}
		m, err := manager.New(pool, manager.Config{Config: pg.Config{Holder: name}})
		if err != nil {
			pool.Close()
			return nil, err
		}
		cctx, stop := context.WithCancel(ctx)
		c := &candidate{name: name, m: m, pool: pool, stop: stop, terms: make(chan uint64, 10),
			done: make(chan error, 1), resign: make(chan struct{}, 10), sees: make(chan string, 10)}
		go func() {
			c.done <- election.Run(cctx, m, election.Config{
				Name: "examples:leader", TTL: 3 * time.Second,
				OnNewLeader: func(id string, self bool) {
					if !self {
						say("%s sees %s lead", name, id)
						select {
						case c.sees <- id:
						default:
						}
					}
				},
				OnStoppedLeading: func(term *election.Term, cause error) {
					why := "resigned"
					if cause != nil {
						why = "stopped: " + cause.Error()
					}
					say("%s's term (fence %d) ended: %s", name, uint64(term.Fence()), why)
				},
			}, func(lctx context.Context, term *election.Term) error {
				say("%s leads with fence %d", name, uint64(term.Fence()))
				tag, err := pool.Exec(lctx, fencedWrite, int64(term.Fence()), name)
				if err != nil {
					return err
				}
				say("%s's fenced write: %d row(s) updated", name, tag.RowsAffected())
				c.terms <- uint64(term.Fence())
				select {
				case <-c.resign:
					return nil // done: resign
				case <-lctx.Done():
					return nil // lost, or shutting down
				}
			})
		}()
		return c, nil
	}
	shutdown := func(c *candidate) {
		c.stop()
		<-c.done
		_ = c.m.Close(context.Background())
		c.pool.Close()
	}
	await := func(c *candidate) (uint64, error) {
		select {
		case f := <-c.terms:
			return f, nil
		case err := <-c.done:
			return 0, fmt.Errorf("%s stopped campaigning: %v", c.name, err)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}

	// awaitSees waits until c observed who lead.
	awaitSees := func(c *candidate, who string) error {
		for {
			select {
			case id := <-c.sees:
				if id == who {
					return nil
				}
			case err := <-c.done:
				return fmt.Errorf("%s stopped campaigning: %v", c.name, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}

	a, err := start("A")
	if err != nil {
		return err
	}
	defer shutdown(a)
	f1, err := await(a)
	if err != nil {
		return err
	}
	b, err := start("B")
	if err != nil {
		return err
	}
	bStopped := false
	defer func() {
		if !bStopped {
			shutdown(b)
		}
	}()
	if err := awaitSees(b, "A"); err != nil { // B campaigns and observes A lead
		return err
	}

	a.resign <- struct{}{}
	resigned := time.Now()
	f2, err := await(b)
	if err != nil {
		return err
	}
	say("B took over %s after A resigned (fence %d > %d)", round(time.Since(resigned)), f2, f1)

	if err := awaitSees(a, "B"); err != nil { // A, campaigning again, observes B lead
		return err
	}
	say("B shuts down")
	shutdown(b)
	bStopped = true
	f3, err := await(a)
	if err != nil {
		return err
	}
	if !(f1 < f2 && f2 < f3) {
		return fmt.Errorf("fences %d, %d, %d not increasing", f1, f2, f3)
	}
	var fence, writes int64
	var last string
	if err := admin.QueryRow(ctx, "SELECT fence, writes, last_writer FROM leader_work").Scan(&fence, &writes, &last); err != nil {
		return err
	}
	say("work table: fence %d, %d writes, last by %s", fence, writes, last)
	return nil
}

// round prints a duration to 100 ms, so the output is stable.
func round(d time.Duration) string {
	if d < 100*time.Millisecond {
		return "within 0.1 s"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}
