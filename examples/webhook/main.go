// Command webhook shows webhook de-duplication with pglease: a sender
// delivers the same event several times, concurrently and later again
// (at-least-once delivery), and the event's side effect must happen
// exactly once.
//
// Each delivery: TryAcquire("webhook:"+eventID). If another delivery of
// the same event holds the lock, answer "busy, retry later" (HTTP 409)
// without waiting. If this delivery holds it, check the processed table:
// already processed → acknowledge the duplicate; otherwise perform the
// side effect, record the event as processed, release.
//
//	go run ./internal/cmd/withpg -C examples -- go run ./webhook
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/exampledb"
	"github.com/pglease/pglease/manager"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// A schema of its own, dropped at the end: nothing is left in your database.
	err := exampledb.Run(ctx, os.Getenv("DATABASE_URL"), "pglease_webhook", func(url string) error {
		return run(ctx, os.Stdout, url)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		os.Exit(1)
	}
}

const (
	events     = 3  // distinct event ids
	deliveries = 12 // concurrent deliveries of each
)

// outcome of one delivery attempt.
type outcome int

const (
	processed outcome = iota // this delivery performed the side effect
	duplicate                // already processed: acknowledged, nothing done
	busy                     // another delivery holds the lock: sender retries later
)

func run(ctx context.Context, w io.Writer, url string) error {
	if url == "" {
		return errors.New("DATABASE_URL is not set")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{TTL: 10 * time.Second})
	if err != nil {
		return err
	}
	defer m.Close(context.Background())
	if err := m.SetupSchema(ctx); err != nil {
		return err
	}
	// processed: one row per handled event. effects: the side effect (an
	// e-mail, a charge …), deliberately without a unique constraint, so a
	// double processing would show as two rows.
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS webhook_processed (event_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS webhook_effects (event_id text NOT NULL, delivery int NOT NULL)`); err != nil {
		return err
	}

	run := randomID()
	ids := make([]string, events)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt_%s_%d", run, i+1)
	}
	type result struct {
		event int
		outs  []outcome
		err   error
	}
	results := make(chan result, events*deliveries)
	var wg sync.WaitGroup
	for e, id := range ids {
		for d := range deliveries {
			wg.Go(func() {
				// The sender retries a busy answer after 50 ms, up to 100 times.
				var outs []outcome
				for range 100 {
					o, err := deliver(ctx, pool, m, id, d)
					if err != nil {
						results <- result{e, outs, err}
						return
					}
					outs = append(outs, o)
					if o != busy {
						break
					}
					select {
					case <-time.After(50 * time.Millisecond):
					case <-ctx.Done():
						results <- result{e, outs, ctx.Err()}
						return
					}
				}
				results <- result{event: e, outs: outs}
			})
		}
	}
	wg.Wait()
	close(results)
	counts := make([][3]int, events)
	for r := range results {
		if r.err != nil {
			return r.err
		}
		for _, o := range r.outs {
			counts[r.event][o]++
		}
	}
	fmt.Fprintf(w, "%d events, each delivered %d times at once (busy answers are retried by the sender):\n", events, deliveries)
	var bad error
	for e, id := range ids {
		var effects int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_effects WHERE event_id = $1`, id).Scan(&effects); err != nil {
			return err
		}
		fmt.Fprintf(w, "  event %d: side effect performed %d time(s); %d busy answers, %d duplicates acknowledged\n",
			e+1, effects, counts[e][busy], counts[e][duplicate])
		if effects != 1 || counts[e][processed] != 1 || counts[e][processed]+counts[e][duplicate] != deliveries {
			bad = fmt.Errorf("event %d: processed %d times, %d effects", e+1, counts[e][processed], effects)
		}
	}
	if bad != nil {
		return bad
	}
	// A redelivery long after: the lock is free, the processed table says no.
	o, err := deliver(ctx, pool, m, ids[0], deliveries)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "a redelivery of event 1 a while later: %s\n", map[outcome]string{processed: "processed AGAIN", duplicate: "acknowledged as a duplicate", busy: "busy"}[o])
	if o != duplicate {
		return errors.New("late redelivery was not recognised")
	}
	fmt.Fprintln(w, "every event was processed exactly once")
	return nil
}

// deliver handles one delivery of event id.
func deliver(ctx context.Context, pool *pgxpool.Pool, m *manager.Manager, id string, delivery int) (outcome, error) {
	lk, ok, err := m.TryAcquire(ctx, "webhook:"+id)
	if err != nil {
		return 0, err
	}
	if !ok {
		return busy, nil
	}
	defer lk.Release(context.WithoutCancel(ctx))
	var done bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_processed WHERE event_id = $1)`, id).Scan(&done); err != nil {
		return 0, err
	}
	if done {
		return duplicate, nil
	}
	// The side effect: outside any transaction with the marker, as a call
	// to another system would be. Only the lock keeps it single.
	if _, err := pool.Exec(lk.Context(), `INSERT INTO webhook_effects (event_id, delivery) VALUES ($1, $2)`, id, delivery); err != nil {
		return 0, err
	}
	time.Sleep(20 * time.Millisecond) // the handler's own work
	if _, err := pool.Exec(lk.Context(), `INSERT INTO webhook_processed (event_id) VALUES ($1)`, id); err != nil {
		return 0, err
	}
	return processed, nil
}

func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
