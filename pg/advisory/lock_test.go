package advisory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestReleaseUnlockFalseIsLoss: when pg_advisory_unlock answers false
// (the server no longer holds a lock the session took), Release reports
// a loss, not success: LockLost, and the lock's cause is LockLost.
func TestReleaseUnlockFalseIsLoss(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := openSession(t, pool, testOpts())
	ctx := ctxT(t, 15*time.Second)
	k := randKey()
	l, ok, err := s.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	// Unlock behind the handle's back, on its own connection.
	id, _ := k.Int64()
	s.sem <- struct{}{}
	var unlocked bool
	err = s.conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1::int8)", id).Scan(&unlocked)
	<-s.sem
	if err != nil || !unlocked {
		t.Fatalf("behind-the-back unlock: %v %v", unlocked, err)
	}
	if err := l.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Release after the server lost the lock = %v, want LockLost", err)
	}
	if err := l.Err(); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Err = %v, want LockLost", err)
	}
}

// TestNilLockMethods: the nil TryLock returns with ok=false answers every
// method without a panic or I/O.
func TestNilLockMethods(t *testing.T) {
	t.Parallel()
	qc := &pgtest.Recorder{}
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc })
	s1, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 15*time.Second)
	k := randKey()
	held, ok, err := s1.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer held.Release(ctx)
	l, ok, err := s2.TryLock(ctx, k)
	if ok || err != nil || l != nil {
		t.Fatalf("TryLock of a held key = %v %v %v", l, ok, err)
	}
	before := qc.Queries()
	var h pglease.Handle = l
	if err := h.Release(ctx); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Release = %v", err)
	}
	if err := h.Err(); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Err = %v", err)
	}
	select {
	case <-h.Done():
	default:
		t.Error("Done not closed")
	}
	if c := context.Cause(h.Context()); !errors.Is(c, pglease.ErrInvalidArgument) {
		t.Errorf("cause = %v", c)
	}
	if l.Key().valid() {
		t.Error("nil Lock has a valid key")
	}
	if n := qc.Queries() - before; n != 0 {
		t.Errorf("%d queries", n)
	}
}

// TestReleaseEndedContextReleasesInBackground: a deferred Release with an
// ended context returns Aborted but still frees the key.
func TestReleaseEndedContextReleasesInBackground(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s1, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 15*time.Second)
	k := randKey()
	l, ok, err := s1.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Release(ended); !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("Release(ended) = %v, want Aborted", err)
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the background release never ended the lock")
	}
	if !errors.Is(l.Err(), pglease.ErrReleased) {
		t.Fatalf("Err = %v, want Released", l.Err())
	}
	l2, err := s2.Lock(ctx, k)
	if err != nil {
		t.Fatalf("the key was not freed: %v", err)
	}
	_ = l2.Release(ctx)
}
