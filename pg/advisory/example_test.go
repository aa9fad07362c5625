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
