package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// TestAcquireCallerLockID: Store.Acquire takes a caller-chosen lockId (the
// way Acquire's doc says an ambiguous grant is cleaned up): the grant and
// the stored row carry it, and Release by it removes the row; a bad one is
// InvalidArgument before any I/O.
func TestAcquireCallerLockID(t *testing.T) {
	t.Parallel()
	cnt := &pgtest.Recorder{}
	s, pool, _ := newStore(t, store.Config{}, cnt.Configure)
	c := ctx(t)
	id := keys.NewLockID()
	r, err := s.Acquire(c, store.AcquireRequest{Key: "chosen-id", TTL: time.Minute, LockID: id})
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

	cnt.Reset()
	for _, bad := range []string{"short", "has spaces in it......", id + "x"} {
		_, err := s.Acquire(c, store.AcquireRequest{Key: "k", TTL: time.Second, LockID: bad})
		if !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("lockId %d bytes: %v, want InvalidArgument", len(bad), err)
		}
	}
	if n := cnt.Queries(); n != 0 {
		t.Errorf("bad lockIds sent %d queries", n)
	}
}
