package pg_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/pg"
)

// TestAcquireCallerLockID: Store.Acquire takes a caller-chosen lockId (the
// way Acquire's doc says an ambiguous grant is cleaned up): the grant and
// the stored row carry it, and Release by it removes the row; a bad one is
// InvalidArgument before any I/O.
func TestAcquireCallerLockID(t *testing.T) {
	t.Parallel()
	cnt := &counter{}
	s, pool, _ := newStore(t, pg.Config{}, withCounter(cnt))
	c := ctx(t)
	id := keys.NewLockID()
	r, err := s.Acquire(c, pg.AcquireRequest{Key: "chosen-id", TTL: time.Minute, LockID: id})
	if err != nil || !r.OK {
		t.Fatalf("Acquire = %+v, %v", r, err)
	}
	if r.LockID != id {
		t.Fatal("the grant does not carry the caller's lockId")
	}
	if row := readRow(t, pool, "chosen-id"); row == nil || row.lockID != id {
		t.Fatal("the stored row does not carry the caller's lockId")
	}
	if ok, err := s.Release(c, id); err != nil || !ok {
		t.Fatalf("Release(chosen id) = %v, %v", ok, err)
	}
	if row := readRow(t, pool, "chosen-id"); row != nil {
		t.Fatal("row left after Release by the chosen lockId")
	}

	cnt.reset()
	for _, bad := range []string{"short", "has spaces in it......", id + "x"} {
		_, err := s.Acquire(c, pg.AcquireRequest{Key: "k", TTL: time.Second, LockID: bad})
		if !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("lockId %d bytes: %v, want InvalidArgument", len(bad), err)
		}
	}
	if n := cnt.queries.Load(); n != 0 {
		t.Errorf("bad lockIds sent %d queries", n)
	}
}

// A lockId chosen before the call lets the caller clean up when the outcome
// is unknown (CodeAmbiguous: the connection died after COMMIT was sent).
func ExampleStore_Acquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := pg.New(pool, pg.Config{LockTable: "example_locks", FenceTable: "example_fences"})
	if err != nil {
		panic(err)
	}
	if err := store.SetupSchema(ctx); err != nil {
		panic(err)
	}

	id := keys.NewLockID()
	res, err := store.Acquire(ctx, pg.AcquireRequest{Key: "invoice:43", TTL: 30 * time.Second, LockID: id})
	if errors.Is(err, pglease.ErrAmbiguous) {
		// The grant may have committed: remove it if it did.
		_, _ = store.Release(context.WithoutCancel(ctx), id)
		return
	}
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired:", res.OK, "with our lockId:", res.LockID == id)
	released, err := store.Release(ctx, id)
	fmt.Println("released:", released, err)
	// Output:
	// acquired: true with our lockId: true
	// released: true <nil>
}
