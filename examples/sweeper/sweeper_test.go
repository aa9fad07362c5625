package sweeper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pgleasetest"
)

// A unit test: the fake keeps the Manager's rules, without PostgreSQL.
func TestSweepStopsWhenRevoked(t *testing.T) {
	locks := pgleasetest.NewFake(0)
	batches := 0
	s := New(locks, func(ctx context.Context, fence pglease.Fence) (bool, error) {
		batches++
		if batches == 2 {
			pgleasetest.Revoke(t, locks, "sweeper") // an operator takes the lock away
			<-ctx.Done()                            // the lock's end reaches the work's context
		}
		return true, nil // always more to do
	})
	err := s.Sweep(context.Background())
	if !errors.Is(err, pglease.ErrRevoked) || batches != 2 {
		t.Fatalf("Sweep = %v after %d batches, want ErrRevoked after 2", err, batches)
	}
}

func TestSweepIfFreeSkipsWhileHeld(t *testing.T) {
	ctx := context.Background()
	locks := pgleasetest.NewFake(0)
	s := New(locks, func(context.Context, pglease.Fence) (bool, error) { return false, nil })
	other, err := locks.Acquire(ctx, "sweeper") // another instance sweeps
	if err != nil {
		t.Fatal(err)
	}
	if swept, err := s.SweepIfFree(ctx); swept || err != nil {
		t.Fatalf("SweepIfFree while held = %v, %v", swept, err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if swept, err := s.SweepIfFree(ctx); !swept || err != nil {
		t.Fatalf("SweepIfFree when free = %v, %v", swept, err)
	}
}

// An integration test: a real Manager on a throwaway PostgreSQL (or on
// DATABASE_URL), whose connections are cut in the middle of a sweep.
func TestSweepOnPostgres(t *testing.T) {
	m, pool := pgleasetest.Start(t, manager.Config{})
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE swept (fence bigint)"); err != nil {
		t.Fatal(err)
	}
	batches := 0
	s := New(m.Locker(), func(ctx context.Context, fence pglease.Fence) (bool, error) {
		batches++
		if batches == 2 {
			pgleasetest.CutConnections(t, m) // the Manager reconnects; the lease survives
		}
		_, err := pool.Exec(ctx, "INSERT INTO swept VALUES ($1)", int64(fence))
		return batches < 3, err
	})
	for i := range 2 {
		if err := s.Sweep(ctx); err != nil {
			t.Fatalf("sweep %d: %v", i, err)
		}
		batches = 0
	}
	var runs int
	if err := pool.QueryRow(ctx, "SELECT count(DISTINCT fence) FROM swept").Scan(&runs); err != nil || runs != 2 {
		t.Fatalf("%d sweeps recorded (%v), want 2, each with its own fence", runs, err)
	}
}

// The server goes away for a while: SweepIfFree reports the outage as an
// error, then works again.
func TestSweepIfFreeDuringOutage(t *testing.T) {
	m, _ := pgleasetest.Start(t, manager.Config{})
	s := New(m.Locker(), func(context.Context, pglease.Fence) (bool, error) { return false, nil })
	pgleasetest.StopFor(t, m, 3*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if swept, err := s.SweepIfFree(ctx); swept || err == nil {
		t.Fatalf("SweepIfFree with the server down = %v, %v, want an error", swept, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		swept, err := s.SweepIfFree(ctx)
		if swept {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("SweepIfFree after the outage: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
