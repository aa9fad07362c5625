package manager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pglease/pglease"
)

// TestOverloadRenewalsFirst: a Manager with a pool of two connections
// holds 40 leases (TTL 3 s) while 24 goroutines hammer acquires on keys
// whose acquires the server holds up for 4 s at a time (another
// transaction keeps their fence counter rows locked, which every grant of
// the key updates: the server answers them slowly, as an overloaded one
// would; a key's advisory lock would not do, as an acquire waits for it
// only briefly and then answers the key held). Acquires and
// their hedges must never take the connection the extends need: no lease
// is lost, and the Manager says it is overloaded (test signal, gauge,
// Warn log record), then that it is not any more.
func TestOverloadRenewalsFirst(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{
		cfg:   Config{Telemetry: rg.opts, StatementTimeout: 8 * time.Second},
		pool:  []func(*pgxpool.Config){func(c *pgxpool.Config) { c.MaxConns = 2 }},
		hooks: kernel.TestHooks{ShedCalm: 2 * time.Second},
	})
	ctx := ctxT(t)
	const ttl = 3 * time.Second
	var held []*Lock
	for i := range 40 {
		lk, err := b.m.Acquire(ctx, fmt.Sprintf("ovl-held-%d", i), WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}

	// The slow keys: an admin transaction keeps each one's fence counter
	// row locked (a grant updates it, under the key's advisory lock) for
	// 4 s, three times, with a short gap between. The rows exist: each key
	// was granted once.
	slow := []string{"ovl-slow-0", "ovl-slow-1", "ovl-slow-2", "ovl-slow-3"}
	for _, k := range slow {
		lk, err := b.m.Acquire(ctx, k, WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var blocker pgx.Tx
	defer func() {
		if blocker != nil {
			_ = blocker.Rollback(context.Background())
		}
	}()
	block := func(on bool) {
		t.Helper()
		if !on {
			if err := blocker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			blocker = nil
			return
		}
		// The rows in the acquire's lock order (hashtext, key), and again
		// if the server still picks this session as a deadlock's victim
		// (a batch under way when it began): the blocker must not fail
		// the test.
		for try := 0; ; try++ {
			tx, err := b.admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, "SELECT 1 FROM syncguard_fence_counters WHERE key_debug = ANY($1) ORDER BY hashtext(key_debug), key_debug FOR UPDATE", slow)
			if err == nil {
				blocker = tx
				return
			}
			_ = tx.Rollback(ctx)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "40P01" || try == 10 {
				t.Fatal(err)
			}
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
	defer halt() // a t.Fatal below must not leave 24 callers spinning on a closed Manager
	var grants, timeouts, noted atomic.Int64
	var otherErr atomic.Value
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := slow[(g+i)%len(slow)]
				if i%2 == 1 {
					key = fmt.Sprintf("ovl-free-%d-%d", g, i) // batched with the slow ones
				}
				lk, err := b.m.Acquire(ctx, key, WithTTL(ttl), WithAcquireTimeout(1500*time.Millisecond))
				switch {
				case err == nil:
					grants.Add(1)
					_ = lk.Release(ctx)
				case pglease.CodeOf(err) == pglease.CodeAcquisitionTimeout,
					// The database gave no answer within stuckAfter (1 s):
					// as far as the Manager knows, it could not be reached.
					pglease.CodeOf(err) == pglease.CodeNetworkTimeout:
					timeouts.Add(1)
					if strings.Contains(err.Error(), kernel.ShedNote) {
						noted.Add(1)
					}
				default:
					otherErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	for range 3 {
		block(true)
		time.Sleep(4 * time.Second)
		block(false)
		time.Sleep(300 * time.Millisecond)
	}
	halt()

	for _, lk := range held {
		if err := lk.Err(); err != nil {
			t.Errorf("held lease %s ended: %v", lk.Key(), err)
		}
	}
	if err, _ := otherErr.Load().(error); err != nil {
		t.Errorf("an acquire failed other than by its timeout: %v", err)
	}
	t.Logf("%d grants, %d acquire timeouts (%d saying the Manager held back acquires)", grants.Load(), timeouts.Load(), noted.Load())
	if noted.Load() == 0 {
		t.Error("no acquire timeout said that the Manager held back acquires")
	}

	if !waitSignal(b.sig.Shedding.Ch, true, 0) {
		t.Fatal("the Manager never said it was overloaded")
	}
	if !strings.Contains(rg.logs.String(), "the database is overloaded") {
		t.Error("no Warn log record for the overload")
	}
	// It ends once no slow round trip was seen for shedCalm (2 s here).
	if !waitSignal(b.sig.Shedding.Ch, false, 20*time.Second) {
		t.Error("the Manager never said the overload ended")
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		g, ok := rg.metrics(t)["pglease.manager.overload"].Data.(metricdata.Gauge[int64])
		if ok && len(g.DataPoints) == 1 && g.DataPoints[0].Value == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pglease.manager.overload = %+v 20 s after the overload", g)
		}
	}
	if !strings.Contains(rg.logs.String(), "acquires are no longer held back") {
		t.Error("no log record for the overload's end")
	}
	for _, lk := range held {
		if err := lk.Release(ctx); err != nil && !errors.Is(err, pglease.ErrLockLost) {
			t.Error(err)
		}
	}
}

// waitSignal reports whether v arrives on ch within d (0: only what is
// already there).
func waitSignal(ch chan bool, v bool, d time.Duration) bool {
	timeout := time.After(d)
	for {
		select {
		case x := <-ch:
			if x == v {
				return true
			}
			continue
		default:
		}
		select {
		case x := <-ch:
			if x == v {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

// An extend the server answers after the statement timeout, but before
// the lease's trust deadline, keeps the lease when the timeout left no
// time for a retry before that deadline: giving up at the timeout could
// only lose it. An admin transaction keeps the lease's row locked (the
// extend waits for it, as an extend waits for a saturated commit flush)
// until shortly before the trust deadline.
func TestSlowExtendAnsweredBeforeTrustDeadline(t *testing.T) {
	t.Parallel()
	const (
		ttl     = 20 * time.Second // margin 2 s: trusted for 18 s; a retry waits 2 s
		timeout = 8 * time.Second
		key     = "slow-extend"
	)
	b := setup(t, setupOpts{cfg: Config{StatementTimeout: timeout}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lk, err := b.m.Acquire(ctx, key, WithTTL(ttl), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	trustEnd := time.Now().Add(lk.Remaining())
	tx, err := b.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, "SELECT 1 FROM syncguard_locks WHERE user_key = $1 FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	// Sent 9.2 s before the trust deadline: the timeout would end 1.2 s
	// before it, and a retry 2 s after that would come too late.
	time.Sleep(time.Until(trustEnd.Add(-9200 * time.Millisecond)))
	errc := make(chan error, 1)
	go func() { errc <- lk.Extend(ctx) }()
	// The row is free 0.6 s before the trust deadline (0.6 s after the
	// timeout).
	time.Sleep(time.Until(trustEnd.Add(-600 * time.Millisecond)))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Extend answered after the statement timeout, before the trust deadline: %v, want nil", err)
	}
	time.Sleep(time.Until(trustEnd.Add(500 * time.Millisecond)))
	if err := lk.Err(); err != nil {
		t.Fatalf("lock after its old trust deadline: %v, want held", err)
	}
	// The new window is anchored at the extend's send: 18 s from 9.2 s
	// before the old deadline, 8.3 s left now.
	if r := lk.Remaining(); r < 7*time.Second {
		t.Fatalf("Remaining %v after the extend, want the new window (about 8.3 s)", r)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
