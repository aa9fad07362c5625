package advisory

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/pg"
)

// TestDeadConnectionIsAnOutage: on a session whose connection went
// half-open or blackholed, Lock, LockShared, TryLock and TryLockShared
// fail with an outage code that says a retry (on a new session) can work,
// not with Aborted ("context ended"), which is for the caller's context:
// here it has seconds left. Close then leaves no goroutine behind: pgx's
// clean-up of the broken connection (a cancel request on a new
// connection, then a drain) has ended when Close returns, on a pool
// configured by pg.ConfigurePool.
func TestDeadConnectionIsAnOutage(t *testing.T) {
	t.Parallel()
	ops := []struct {
		name string
		call func(ctx context.Context, s *Session, k Key) error
	}{
		{"Lock", func(ctx context.Context, s *Session, k Key) error { _, err := s.Lock(ctx, k); return err }},
		{"LockShared", func(ctx context.Context, s *Session, k Key) error { _, err := s.LockShared(ctx, k); return err }},
		{"TryLock", func(ctx context.Context, s *Session, k Key) error { _, _, err := s.TryLock(ctx, k); return err }},
		{"TryLockShared", func(ctx context.Context, s *Session, k Key) error {
			_, _, err := s.TryLockShared(ctx, k)
			return err
		}},
	}
	for _, fault := range []faultproxy.Mode{faultproxy.HalfOpen, faultproxy.Blackhole} {
		for _, op := range ops {
			t.Run(fault.String()+"/"+op.name, func(t *testing.T) {
				t.Parallel()
				through, p := viaProxy(t)
				pool := newPool(t, through, func(c *pgxpool.Config) {
					if err := pg.ConfigurePool(c); err != nil {
						t.Fatal(err)
					}
				})
				s := openSession(t, pool, &Options{ProbeInterval: 2 * time.Second, ProbeTimeout: 600 * time.Millisecond})
				if _, ok, err := s.TryLock(ctxT(t, 10*time.Second), randKey()); !ok || err != nil {
					t.Fatal(ok, err)
				}
				if err := p.Set(fault); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				err := op.call(ctx, s, randKey())
				if ctx.Err() != nil {
					t.Fatalf("%s waited until the caller's context ended: %v", op.name, err)
				}
				code := pglease.CodeOf(err)
				if err == nil || code == pglease.CodeAborted || !pglease.Retryable(err) {
					t.Fatalf("%s on a %s connection = %v (code %v, retryable %t); want an outage (NetworkTimeout or ServiceUnavailable), retryable",
						op.name, fault, err, code, pglease.Retryable(err))
				}
				if err := s.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				select {
				case <-s.conn.PgConn().CleanupDone():
				default:
					t.Fatal("pgx's clean-up of the broken connection outlived Close")
				}
			})
		}
	}
}
