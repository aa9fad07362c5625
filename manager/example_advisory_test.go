package manager_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg/advisory"
)

func ExampleManager_LockAdvisory() {
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

	// The same id as SELECT pg_advisory_lock(7000001) in SQL.
	key := advisory.Int64(7_000_001)
	lk, err := m.LockAdvisory(ctx, key) // waits as long as ctx allows
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", lk.Key(), lk.Err() == nil)

	// Not re-entrant: callers of one Manager exclude each other, so a try
	// of a key this Manager holds answers ok=false (LockAdvisory would
	// wait for the holder's Release).
	_, ok, err := m.TryLockAdvisory(ctx, key)
	fmt.Println("again:", ok, err)

	// work(lk.Context()) — cancelled with cause ErrLockLost if the session dies.
	if err := lk.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("cause after Release:", context.Cause(lk.Context()))
	// Output:
	// held: int64:7000001 true
	// again: false <nil>
	// cause after Release: pglease: advisory.Lock.Release: Released: lock released
}
