package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// A pooled connection whose server refuses writes as read-only (25006: a
// standby, a primary demoted under open connections) is dropped, so the
// pool's next connection is a new one, and the error says why. Here the
// session itself is made read-only; a fresh connection is not.
func TestReadOnlyConnectionDropped(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{}, maxConns(1))
	c := ctx(t)
	r, err := s.Acquire(c, store.AcquireRequest{Key: "ro", TTL: time.Minute})
	if err != nil || !r.OK {
		t.Fatal(r, err)
	}
	if _, err := s.Release(c, r.LockID); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(c, "SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	_, err = s.Acquire(c, store.AcquireRequest{Key: "ro", TTL: time.Minute})
	if !errors.Is(err, pglease.ErrServiceUnavailable) || !strings.Contains(err.Error(), pgerr.ReadOnlyMsg) {
		t.Fatalf("Acquire on a read-only connection: %v, want ServiceUnavailable saying the server is read-only", err)
	}
	// pgxpool destroys a released closed connection in the background.
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().TotalConns() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the read-only connection is still in the pool 5 s later (%d connections)", pool.Stat().TotalConns())
		}
	}
	r, err = s.Acquire(c, store.AcquireRequest{Key: "ro", TTL: time.Minute})
	if err != nil || !r.OK {
		t.Fatalf("Acquire on the pool's next connection: %v %v", r.OK, err)
	}
}
