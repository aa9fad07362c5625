package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg/advisory"
)

// underLock runs work while h is held, whatever kind of lock h is, and
// tells why the lock ended.
func underLock(ctx context.Context, h pglease.Handle, work func(context.Context) error) error {
	defer h.Release(context.WithoutCancel(ctx)) // nil if held until now; no-op if released already
	if f, ok := h.(interface{ Fence() pglease.Fence }); ok {
		fmt.Println("  fenced:", f.Fence() > 0) // only leases have a fence
	}
	if err := work(h.Context()); err != nil {
		return err
	}
	if err := h.Release(ctx); err != nil {
		return err // the lock was lost before the work finished
	}
	fmt.Println("  ended:", h.Err(), "| released:", errors.Is(h.Err(), pglease.ErrReleased))
	return nil
}

// One function works with all three kinds of lock handle.
func ExampleHandle() {
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
	s, err := advisory.Open(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	lease, err := m.Acquire(ctx, "example:handle")
	if err != nil {
		panic(err)
	}
	managed, err := m.LockAdvisory(ctx, advisory.Int64(7_000_101))
	if err != nil {
		panic(err)
	}
	direct, err := s.Lock(ctx, advisory.Int64(7_000_102))
	if err != nil {
		panic(err)
	}
	work := func(ctx context.Context) error { return ctx.Err() }
	for _, h := range []pglease.Handle{lease, managed, direct} {
		fmt.Printf("%T\n", h)
		if err := underLock(ctx, h, work); err != nil {
			panic(err)
		}
	}

	// The nil a TryAcquire returns when the key is held is safe too.
	var none *manager.Lock
	fmt.Println("nil handle:", errors.Is(pglease.Handle(none).Err(), pglease.ErrInvalidArgument))
	// Output:
	// *manager.Lock
	//   fenced: true
	//   ended: pglease: manager.Release: Released: lock released | released: true
	// *advisory.Lock
	//   ended: pglease: advisory.Lock.Release: Released: lock released | released: true
	// *advisory.Lock
	//   ended: pglease: advisory.Lock.Release: Released: lock released | released: true
	// nil handle: true
}
