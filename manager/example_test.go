package manager_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/manager"
)

func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close() // after m.Close: the Manager does not close a pool it was given

	m, err := manager.New(pool, manager.Config{}) // zero Config = defaults
	if err != nil {
		panic(err)
	}
	defer m.Close(ctx)
	if err := m.SetupSchema(ctx); err != nil {
		panic(err)
	}

	lk, err := m.Acquire(ctx, "example:payment:123", manager.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	fmt.Println("held; fence > 0:", lk.Fence() > 0)
	fmt.Printf("printed: %v\n", lk.String() != "" && lk.Err() == nil)

	// Not re-entrant: a second try from the same Manager sees the key held.
	_, ok, err := m.TryAcquire(ctx, "example:payment:123")
	fmt.Println("second TryAcquire:", ok, err)

	if err := lk.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("cause after release:", context.Cause(lk.Context()))

	err = m.Do(ctx, "example:job:42", func(ctx context.Context, lk *manager.Lock) error {
		fmt.Println("working under the lock; fence > 0:", lk.Fence() > 0)
		return nil
	})
	fmt.Println("Do:", err)
	// Output:
	// held; fence > 0: true
	// printed: true
	// second TryAcquire: false <nil>
	// cause after release: pglease: manager.Release: Released: lock released
	// working under the lock; fence > 0: true
	// Do: <nil>
}

func ExampleLock_Context() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{})
	if err != nil {
		panic(err)
	}
	if err := m.SetupSchema(ctx); err != nil {
		panic(err)
	}
	lk, err := m.Acquire(ctx, "example:ctx")
	if err != nil {
		panic(err)
	}
	// Close ends every held lock's context with cause ErrClosed.
	if err := m.Close(ctx); err != nil {
		panic(err)
	}
	<-lk.Done()
	fmt.Println(context.Cause(lk.Context()))
	// Output:
	// pglease: manager.Close: Closed: manager closed
}

// A lease taken WithoutAutoExtend is renewed by hand: each Extend renews
// it for its TTL, through the Manager's batched heartbeat statement.
func ExampleLock_Extend() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{})
	if err != nil {
		panic(err)
	}
	defer m.Close(ctx)
	if err := m.SetupSchema(ctx); err != nil {
		panic(err)
	}

	lk, err := m.Acquire(ctx, "example:batch-import", manager.WithTTL(10*time.Second), manager.WithoutAutoExtend())
	if err != nil {
		panic(err)
	}
	defer lk.Release(ctx)
	for batch := range 3 {
		before := lk.ExpiresAt() // the server's expires_at
		// import(lk.Context(), batch) …
		if err := lk.Extend(ctx); err != nil {
			panic(err) // errors.Is(err, pglease.ErrLockLost): stop, the lease is gone
		}
		fmt.Println("batch", batch, "expiry moved:", !lk.ExpiresAt().Before(before),
			"time left:", lk.Remaining() > 5*time.Second)
	}
	// Output:
	// batch 0 expiry moved: true time left: true
	// batch 1 expiry moved: true time left: true
	// batch 2 expiry moved: true time left: true
}

// Acquire waits for as long as its context allows, like etcd's
// Mutex.Lock(ctx): without a deadline, until the holder lets go.
func ExampleManager_Acquire_wait() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{})
	if err != nil {
		panic(err)
	}
	defer m.Close(ctx)
	if err := m.SetupSchema(ctx); err != nil {
		panic(err)
	}

	holder, err := m.Acquire(ctx, "example:migration")
	if err != nil {
		panic(err)
	}
	released := make(chan struct{})
	time.AfterFunc(200*time.Millisecond, func() {
		holder.Release(ctx)
		close(released)
	})

	// No deadline on ctx: wait until the holder lets go (or ctx is cancelled).
	lk, err := m.Acquire(ctx, "example:migration")
	if err != nil {
		panic(err)
	}
	defer lk.Release(ctx)
	<-released
	fmt.Println("granted after the holder released, fence above the holder's:", lk.Fence() > holder.Fence())
	// Output:
	// granted after the holder released, fence above the holder's: true
}
