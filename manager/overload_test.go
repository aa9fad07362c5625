package manager

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pglease/pglease"
)

// TestOverloadRenewalsFirst: a Manager with a pool of two connections
// holds 40 leases (TTL 3 s) while 24 goroutines hammer acquires on keys
// whose acquires the server holds up for 4 s at a time (another session
// holds their advisory locks, which every acquire of the key takes: the
// server answers them slowly, as an overloaded one would). Acquires and
// their hedges must never take the connection the extends need: no lease
// is lost, and the Manager says it is overloaded (test signal, gauge,
// Warn log record), then that it is not any more.
func TestOverloadRenewalsFirst(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{
		cfg:   Config{Telemetry: rg.opts, StatementTimeout: 8 * time.Second},
		pool:  []func(*pgxpool.Config){func(c *pgxpool.Config) { c.MaxConns = 2 }},
		hooks: testHooks{shedCalm: 2 * time.Second},
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

	// The slow keys: an admin session holds each one's transaction-level
	// acquire lock (pg_advisory_xact_lock(hashtext(key)) in the acquire
	// function) for 4 s, three times, with a short gap between.
	slow := []string{"ovl-slow-0", "ovl-slow-1", "ovl-slow-2", "ovl-slow-3"}
	adm, err := b.admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Release()
	// The locks are taken in the acquire functions' order (hashtext, as
	// every batch takes its keys' locks): in another order a batch holding
	// one slow key's lock and this session holding another's deadlock.
	block := func(on bool) {
		t.Helper()
		fn := "pg_advisory_unlock"
		if on {
			fn = "pg_advisory_lock"
		}
		q := "SELECT " + fn + "(h) FROM (SELECT hashtext(k) AS h FROM unnest($1::text[]) AS k ORDER BY 1) AS s"
		if _, err := adm.Exec(ctx, q, slow); err != nil {
			t.Fatal(err)
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
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
					if strings.Contains(err.Error(), shedNote) {
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
	close(stop)
	wg.Wait()

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

	if !waitSignal(b.sig.shedding.ch, true, 0) {
		t.Fatal("the Manager never said it was overloaded")
	}
	if !strings.Contains(rg.logs.String(), "the database is overloaded") {
		t.Error("no Warn log record for the overload")
	}
	// It ends once no slow round trip was seen for shedCalm (2 s here).
	if !waitSignal(b.sig.shedding.ch, false, 20*time.Second) {
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
