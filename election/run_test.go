package election

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

// TestRunErrorIsPgleaseError: every error of the package is a
// *pglease.Error; Run's answer to its context's end is CodeAborted,
// and still matches context.Canceled.
func TestRunErrorIsPgleaseError(t *testing.T) {
	t.Parallel()
	b := setup(t, manager.Config{})
	ctx, cancel := context.WithCancel(ctxT(t))
	err := Run(ctx, b.m, Config{Name: "leader"}, func(ctx context.Context, term *Term) error {
		cancel()
		<-ctx.Done()
		return nil
	})
	var e *pglease.Error
	if !errors.As(err, &e) || e.Code != pglease.CodeAborted || e.Op != "election.Run" || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after its context ended = %#v (%v); want a CodeAborted *pglease.Error wrapping context.Canceled", err, err)
	}
}

// TestElectionEndsOnCloseSaysSo: Run that ends because its Manager
// closed says so (CodeClosed), not an Acquire's error.
func TestElectionEndsOnCloseSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, manager.Config{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "elect/closed")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	m := b.newPeer(t, manager.Config{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, m, Config{Name: "elect/closed"}, func(ctx context.Context, _ *Term) error {
			<-ctx.Done()
			return nil
		})
	}()
	time.Sleep(300 * time.Millisecond) // campaigning: the key is held
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if pglease.CodeOf(err) != pglease.CodeClosed || !strings.Contains(err.Error(), "election.Run") ||
		!strings.Contains(err.Error(), "election ended because its Manager closed") {
		t.Fatalf("Run after Close: %v; want Closed saying the election ended because its Manager closed", err)
	}
}

// TestRunBadTTLAsAcquire: Run validates the leadership TTL before any
// I/O by the rules the Manager's Acquire applies to an auto-extended
// lease (with the Manager's LossMargin): for each TTL and margin, Run
// refuses it (InvalidArgument) exactly when Acquire with WithTTL does.
func TestRunBadTTLAsAcquire(t *testing.T) {
	t.Parallel()
	b := setup(t, manager.Config{})
	ctx := ctxT(t)
	ttls := []time.Duration{time.Millisecond, 299 * time.Millisecond, 300 * time.Millisecond, 450 * time.Millisecond,
		900 * time.Millisecond, time.Second, 1500*time.Millisecond + 500*time.Microsecond, 10 * time.Second}
	margins := []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond, time.Second}
	for _, margin := range margins {
		m := b.newPeer(t, manager.Config{TTL: 10 * time.Second, LossMargin: margin})
		for i, ttl := range ttls {
			key := fmt.Sprintf("ttl-check:%v:%d", margin, i)
			runErr := checkTTL(ttl, m.Config().LossMargin)
			lk, acqErr := m.Acquire(ctx, key, manager.WithTTL(ttl))
			if acqErr == nil {
				// A short TTL may run out before the release on a loaded
				// machine: this test is about the TTL check, not the hold.
				if err := lk.Release(ctx); err != nil && !errors.Is(err, pglease.ErrLockLost) {
					t.Fatal(err)
				}
			} else if !errors.Is(acqErr, pglease.ErrInvalidArgument) {
				t.Fatalf("Acquire(ttl %v, margin %v) = %v", ttl, margin, acqErr)
			}
			if (runErr == nil) != (acqErr == nil) || (runErr != nil && !errors.Is(runErr, pglease.ErrInvalidArgument)) {
				t.Errorf("ttl %v, margin %v: Run's check says %v, Acquire says %v", ttl, margin, runErr, acqErr)
			}
			// Run answers the same, before any I/O.
			if runErr != nil {
				err := Run(ctx, m, Config{Name: key, TTL: ttl}, func(context.Context, *Term) error { return nil })
				if !errors.Is(err, pglease.ErrInvalidArgument) {
					t.Errorf("Run(ttl %v, margin %v) = %v, want InvalidArgument", ttl, margin, err)
				}
			}
		}
	}
}

// TestRunAsRuntimeRole: an election term on a Manager whose pool
// connects as the runtime role of roles.sql (no DDL, not superuser):
// the campaign's watch and Lookup work with its privileges, and Lookup
// reads the leader's holder identity.
func TestRunAsRuntimeRole(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.RuntimePool(t)
	m, err := manager.New(pool, manager.Config{Config: pg.Config{Holder: "rr-leader"}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := ctxT(t)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	ectx, stop := context.WithCancel(ctx)
	var fence pglease.Fence
	var info *pg.LockInfo
	var lookErr error
	err = Run(ectx, m, Config{Name: "rr:leader"}, func(fctx context.Context, term *Term) error {
		fence = term.Fence()
		info, lookErr = m.Lookup(fctx, "rr:leader")
		stop()
		return nil
	})
	stop()
	if fence == 0 || (err != nil && !errors.Is(err, context.Canceled)) {
		t.Fatalf("Run: term %v, %v", fence, err)
	}
	if lookErr != nil || info == nil || info.Holder != "rr-leader" || info.Fence != fence {
		t.Fatalf("Lookup while leading = %v, %v; want the term's lease held by rr-leader", info, lookErr)
	}
}

// TestPgBouncerElection: behind a transaction-mode pooler the Manager
// stops listening for good (Watch is then refused), and an election's
// candidates still learn of a new leader, by reading the lease (Lookup)
// every TTL/4.
func TestPgBouncerElection(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 2})
	schema := pgtest.Schema(t)
	url := bouncer.URL
	if strings.Contains(url, "?") {
		url += "&default_query_exec_mode=exec"
	} else {
		url += "?default_query_exec_mode=exec"
	}
	newM := func(cfg manager.Config) *manager.Manager {
		pcfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		cfg.LockTable, cfg.FenceTable = schema+".locks", schema+".fences"
		m, err := manager.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Close(context.Background()); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return m
	}
	ctx := ctxT(t)
	m := newM(manager.Config{TTL: time.Second})
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	// Until the listener stops for good: a watch's channel is closed
	// then, and Watch refused after.
	for {
		ch, err := m.Watch(ctx, "pgb:watch")
		if errors.Is(err, pglease.ErrInvalidArgument) {
			break
		}
		if err != nil {
			t.Fatalf("Watch = %v", err)
		}
		for range ch {
		}
		if ctx.Err() != nil {
			t.Fatal("the Manager did not stop listening behind a transaction-mode pooler")
		}
	}

	other := newM(manager.Config{DisableNotify: true, Config: pg.Config{Holder: "other[1]@test"}})
	held, err := other.Acquire(ctx, "pgb:leader")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	leader := make(chan string, 1)
	go func() {
		_ = Run(ectx, m, Config{Name: "pgb:leader",
			OnNewLeader: func(id string, self bool) {
				if !self {
					select {
					case leader <- id:
					default:
					}
				}
			}}, func(context.Context, *Term) error { return nil })
	}()
	select {
	case id := <-leader:
		if id != "other[1]@test" {
			t.Fatalf("OnNewLeader(%q)", id)
		}
	case <-time.After(waitTimeout()):
		t.Fatal("the candidate did not learn who leads")
	}
}
