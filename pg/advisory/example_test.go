package advisory_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg/advisory"
)

func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// readme:begin advisory
	// Register the ids the application uses, once at start-up.
	reg := advisory.NewRegistry()
	cleanupKey := advisory.Int64(42424242)
	if err := reg.Fixed("idempotency-cleanup", cleanupKey, "cleanup scheduler"); err != nil {
		panic(err)
	}

	// A session lock: held on a dedicated connection until Release or Close.
	s, err := advisory.Open(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	lock, ok, err := s.TryLock(ctx, cleanupKey)
	if err != nil {
		panic(err)
	}
	if !ok {
		fmt.Println("another process runs the cleanup") // and lock is nil
		return
	}
	fmt.Println("cleanup lock taken")
	// lock.Context() ends, with cause pglease.ErrLockLost, if the session dies.

	infos, err := advisory.Inspect(ctx, pool, reg)
	if err != nil {
		panic(err)
	}
	for _, li := range infos {
		if li.Key == cleanupKey {
			fmt.Println("held by this session:", li.PID == s.BackendPID(), "name:", li.Name)
		}
	}
	err = lock.Release(ctx)
	fmt.Println("released:", err, lock.Err())

	// A transaction lock on a key derived like the SQL email_to_lock_id.
	k, err := advisory.SHA256Key("  User@Example.com ")
	if err != nil {
		panic(err)
	}
	same, _ := advisory.SHA256Key("user@example.com")
	fmt.Println("normalised:", k == same)
	err = advisory.WithXactLock(ctx, pool, k, func(tx pgx.Tx) error {
		return nil // writes here are protected until COMMIT
	})
	fmt.Println("transaction:", err)
	// readme:end advisory

	// Output:
	// cleanup lock taken
	// held by this session: true name: idempotency-cleanup
	// released: <nil> pglease: advisory.Lock.Release: Released: lock released
	// normalised: true
	// transaction: <nil>
}

func ExampleKey_String() {
	fmt.Println(advisory.Int64(42424242), advisory.Pair(1, -2))
	// Output: int64:42424242 pair:1,-2
}

// The team's registry file, loaded by the application at start-up and by
// an operator's tool: the operator finds the lock of the e-mail address
// in a support ticket by name, and the address appears nowhere in what
// Inspect returns.
func ExampleLoadRegistry() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	const file = `{"locks": [
		{"name": "idempotency-cleanup", "key": 42424243, "doc": "cleanup scheduler (session)"},
		{"name": "booking", "pattern": "{tenantId}:{date}", "hash": "fnv1a32", "doc": "per tenant and date (transaction)"},
		{"name": "orphan-cleanup", "pattern": "{email}", "hash": "sha256", "doc": "email_to_lock_id (session)"}
	]}`

	// The application: a colliding id would stop it here.
	app, err := advisory.LoadRegistry(strings.NewReader(file))
	if err != nil {
		panic(err)
	}
	key, err := app.Derive("orphan-cleanup", "ada@example.com")
	if err != nil {
		panic(err)
	}
	s, err := advisory.Open(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	lock, ok, err := s.TryLock(ctx, key)
	if err != nil || !ok {
		panic(fmt.Sprint("cleanup lock: ", ok, err))
	}
	defer lock.Release(ctx)

	// The operator's tool, in another process: the same file, and the
	// address from the ticket.
	ops, err := advisory.LoadRegistry(strings.NewReader(file))
	if err != nil {
		panic(err)
	}
	if _, err := ops.Derive("orphan-cleanup", "Ada@Example.com"); err != nil {
		panic(err)
	}
	infos, err := advisory.Inspect(ctx, pool, ops)
	if err != nil {
		panic(err)
	}
	for _, li := range infos {
		if li.Name == "orphan-cleanup" {
			fmt.Println(li.Name, "held:", li.Granted, "by this session:", li.PID == s.BackendPID())
		}
	}
	// Output: orphan-cleanup held: true by this session: true
}

// Readers hold a key shared at the same time; a writer takes it
// exclusively only when no reader holds it.
// A Client opens its session on the first Lock and replaces it after a
// loss; its callers wait for each other in FIFO order.
func ExampleClient() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// readme:begin client
	c, err := advisory.NewClient(pool, nil) // no I/O yet
	if err != nil {
		panic(err)
	}
	defer c.Close(ctx) // releases what is still held

	key := advisory.Int64(42424245)
	lock, err := c.Lock(ctx, key) // opens the session, then waits as long as ctx allows
	if err != nil {
		panic(err)
	}
	// Not re-entrant: another caller of c waits for this one (TryLock
	// answers ok=false), as a caller in another process would.
	_, ok, err := c.TryLock(ctx, key)
	if err != nil {
		panic(err)
	}
	fmt.Println("again:", ok)

	// work(lock.Context()) — cancelled with cause pglease.ErrLockLost if
	// the session dies; the next Lock then opens a new one.
	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	// readme:end client
	fmt.Println("cause after Release:", context.Cause(lock.Context()))
	// Output:
	// again: false
	// cause after Release: pglease: advisory.Lock.Release: Released: lock released
}

func ExampleSession_LockShared() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	config := advisory.Int64(42424244)
	open := func() *advisory.Session {
		s, err := advisory.Open(ctx, pool, nil)
		if err != nil {
			panic(err)
		}
		return s
	}
	reader1, reader2, writer := open(), open(), open()
	defer reader1.Close(ctx)
	defer reader2.Close(ctx)
	defer writer.Close(ctx)

	r1, err := reader1.LockShared(ctx, config) // waits only for a writer
	if err != nil {
		panic(err)
	}
	r2, ok, err := reader2.TryLockShared(ctx, config)
	if err != nil {
		panic(err)
	}
	fmt.Println("second reader:", ok)
	_, ok, err = writer.TryLock(ctx, config)
	if err != nil {
		panic(err)
	}
	fmt.Println("writer while read:", ok)

	_ = r1.Release(ctx) // pg_advisory_unlock_shared
	_ = r2.Release(ctx)
	w, ok, err := writer.TryLock(ctx, config)
	if err != nil {
		panic(err)
	}
	fmt.Println("writer after the readers:", ok)
	_ = w.Release(ctx)
	// Output:
	// second reader: true
	// writer while read: false
	// writer after the readers: true
}

// Transactions that only read hold the key shared, together; one that
// rewrites what it protects holds it exclusively.
func ExampleXactLockShared() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	catalog := advisory.Int64(42424245)

	err = pgx.BeginFunc(ctx, pool, func(reader pgx.Tx) error {
		if err := advisory.XactLockShared(ctx, reader, catalog); err != nil {
			return err
		}
		// Another reader gets in beside it...
		return pgx.BeginFunc(ctx, pool, func(other pgx.Tx) error {
			ok, err := advisory.TryXactLockShared(ctx, other, catalog)
			fmt.Println("second reader:", ok)
			if err != nil {
				return err
			}
			// ...a writer does not, until both have ended.
			return pgx.BeginFunc(ctx, pool, func(writer pgx.Tx) error {
				ok, err := advisory.TryXactLock(ctx, writer, catalog)
				fmt.Println("writer:", ok)
				return err
			})
		})
	})
	fmt.Println("done:", err)
	// Output:
	// second reader: true
	// writer: false
	// done: <nil>
}

// A transfer locks both accounts in one statement. A transfer the other
// way asks for the same keys in the other order, but both take them in
// Key order, so the two cannot deadlock.
func ExampleXactLockAll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	alice, err := advisory.NamespacedKey("account", "alice@example.com")
	if err != nil {
		panic(err)
	}
	bob, err := advisory.NamespacedKey("account", "bob@example.com")
	if err != nil {
		panic(err)
	}
	transfer := func(from, to advisory.Key) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := advisory.XactLockAll(ctx, tx, from, to); err != nil {
				return err
			}
			// Update both balances here; the locks end at COMMIT.
			return nil
		})
	}
	errs := make(chan error, 2)
	go func() { errs <- transfer(alice, bob) }()
	go func() { errs <- transfer(bob, alice) }()
	fmt.Println(<-errs, <-errs)
	// Output: <nil> <nil>
}

// TryXactLockAll takes every key or none: when one is busy it answers
// false and the transaction holds none of them.
func ExampleTryXactLockAll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	seat1, seat2 := advisory.Pair(7, 1), advisory.Pair(7, 2)
	s, err := advisory.Open(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	other, _, err := s.TryLock(ctx, seat2) // someone else holds seat 2
	if err != nil {
		panic(err)
	}

	book := func() {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			ok, err := advisory.TryXactLockAll(ctx, tx, seat1, seat2)
			if err != nil {
				return err
			}
			fmt.Println("both seats:", ok)
			return nil // book both seats when ok
		})
		if err != nil {
			panic(err)
		}
	}
	book()
	// The failed try left seat 1 free.
	l, ok, err := s.TryLock(ctx, seat1)
	if err != nil {
		panic(err)
	}
	fmt.Println("seat 1 free:", ok)
	_ = l.Release(ctx)
	_ = other.Release(ctx)
	book()
	// Output:
	// both seats: false
	// seat 1 free: true
	// both seats: true
}
