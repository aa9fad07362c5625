package election_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/election"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

// Run runs a function while this process leads. The term is a
// pglease.Handle: its Context is the function's context, its Err is nil
// while leading and then says why the term ended; its Fence guards the
// leader's writes. Here the leader does one piece of work and resigns
// early with term.Release, then the election is stopped.
func ExampleRun() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{Config: pg.Config{Holder: "worker-1"}})
	if err != nil {
		panic(err)
	}
	defer m.Close(ctx)
	if err := m.SetupSchema(ctx); err != nil {
		panic(err)
	}

	ectx, stop := context.WithCancel(ctx)
	err = election.Run(ectx, m, election.Config{
		Name: "example:leader:billing",
		TTL:  5 * time.Second,
		OnNewLeader: func(identity string, self bool) {
			fmt.Println("leader:", identity, "self:", self)
		},
		OnStoppedLeading: func(term *election.Term, cause error) {
			fmt.Println("term ended; resigned:", cause == nil, "released:", errors.Is(term.Err(), pglease.ErrReleased))
			stop() // one term is enough for this example
		},
	}, func(ctx context.Context, term *election.Term) error {
		var h pglease.Handle = term // the common handle shape
		fmt.Println("leading; fence > 0:", term.Fence() > 0, "err:", h.Err())
		// work(ctx, term.Fence()) …
		return term.Release(ctx) // resign now (returning nil does the same)
	})
	fmt.Println("Run:", err)
	// Output:
	// leader: worker-1 self: true
	// leading; fence > 0: true err: <nil>
	// term ended; resigned: true released: true
	// Run: pglease: election.Run: Aborted: the election's context ended: context canceled
}
