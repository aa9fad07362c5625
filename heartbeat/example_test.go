package heartbeat_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

func ExampleLease() {
	start := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC) // just before the acquire was sent
	l := heartbeat.Lease{TTL: 3 * time.Second, Start: start}
	fmt.Println("extend at:      ", l.NextExtend().Sub(start))
	fmt.Println("trusted until:  ", l.TrustedUntil().Sub(start))
	fmt.Println("trusted at 2.7s:", start.Add(2700*time.Millisecond).Before(l.TrustedUntil()))
	fmt.Println("after a failed extend at 1s, retry at:", l.RetryAt(start.Add(time.Second)).Sub(start))
	// Output:
	// extend at:       1s
	// trusted until:   2.7s
	// trusted at 2.7s: false
	// after a failed extend at 1s, retry at: 1.3s
}

// A lease taken with pg.Store and kept by the holder itself, on the
// Manager's timing: extend at TTL/3, retry a failed extend at RetryAt,
// stop trusting the lease at TrustedUntil.
func Example_store() {
	ctx := context.Background()
	pool, err := pg.NewPool(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	cfg := pg.Config{LockTable: "example_locks", FenceTable: "example_fences"}
	mg, err := migrate.New(pool, cfg)
	if err != nil {
		panic(err)
	}
	if err := mg.Up(ctx); err != nil {
		panic(err)
	}
	store, err := pg.New(pool, cfg)
	if err != nil {
		panic(err)
	}

	// readme:begin heartbeat
	const ttl = 3 * time.Second
	sent := heartbeat.Now() // just before the acquire is sent (heartbeat.Now counts a suspend; time.Now does not)
	res, err := store.Acquire(ctx, "report:nightly", ttl)
	if err != nil || !res.OK {
		panic(fmt.Sprint("not acquired: ", err))
	}
	lease := heartbeat.Lease{TTL: ttl, Start: sent}
	fmt.Println("extend after:", lease.NextExtend().Sub(sent), "trust for:", lease.TrustedUntil().Sub(sent))

	next := lease.NextExtend()
	for extended := 0; extended < 2; {
		now := heartbeat.Now()
		if !now.Before(lease.TrustedUntil()) { // check it before each write that needs the lease, too (and fence the write)
			fmt.Println("lost: the window passed without a successful extend")
			return
		}
		if now.Before(next) {
			time.Sleep(next.Sub(now)) // in a real program: a timer, while the work goes on
			continue
		}
		sent := heartbeat.Now()
		ext, err := store.Extend(ctx, res.LockID, ttl)
		switch {
		case err != nil: // outcome unknown: the old window still holds; try again soon
			next = lease.RetryAt(heartbeat.Now())
		case !ext.OK:
			fmt.Println("lost: the server no longer has the lease")
			return
		default: // the window starts again from this send
			lease = heartbeat.Lease{TTL: ttl, Start: sent}
			next = lease.NextExtend()
			extended++
		}
	}
	fmt.Println("trusted after two extends:", heartbeat.Now().Before(lease.TrustedUntil()))
	// readme:end heartbeat

	if _, err := store.Release(ctx, res.LockID); err != nil {
		panic(err)
	}
	// Output:
	// extend after: 1s trust for: 2.7s
	// trusted after two extends: true
}
