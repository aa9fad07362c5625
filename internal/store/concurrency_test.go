package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// 64 goroutines on 64 connections race for one fresh key: exactly one
// wins, with fence 1; later grants continue from 2.
func TestRace64OneWinner(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{}, maxConns(64))
	c := ctx(t)
	// Open all 64 connections first so they really race.
	conns := make([]interface{ Release() }, 64)
	for i := range conns {
		cn, err := pool.Acquire(c)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = cn
	}
	for _, cn := range conns {
		cn.Release()
	}
	key := pgtest.RandomName("race64_")
	results := make([]store.AcquireResult, 64)
	errs := make([]error, 64)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		}()
	}
	close(start)
	wg.Wait()
	winners := 0
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("goroutine %d: %v", i, errs[i])
		}
		if r.OK {
			winners++
			if r.Fence != 1 {
				t.Errorf("winner fence = %s, want 000000000000001", r.Fence)
			}
			if ok, err := s.Release(c, r.LockID); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
	}
	if winners != 1 {
		t.Fatalf("%d winners, want exactly 1", winners)
	}
	last := pglease.Fence(1)
	for range 3 {
		r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		if err != nil || !r.OK || r.Fence <= last {
			t.Fatalf("next grant %+v, %v; want fence > %s", r, err, last)
		}
		last = r.Fence
		if _, err := s.Release(c, r.LockID); err != nil {
			t.Fatal(err)
		}
	}
}

type grant struct {
	r        store.AcquireResult
	liveEnd  time.Time // release time is unknown: zero; else expiry + tolerance
	released bool
}

// Workers contend for one key with short TTLs; some holders release, some
// extend, some abandon their lease. Fences strictly increase in grant
// order, and no grant starts (server time) before the previous abandoned
// grant's expires_at + 1000 ms or before the previous grant started.
func TestFencesIncreaseAndGrantsNeverOverlap(t *testing.T) {
	t.Parallel()
	s, _, _ := newStore(t, store.Config{}, maxConns(8))
	c := ctx(t)
	key := pgtest.RandomName("overlap_")
	var mu sync.Mutex
	var grants []grant
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const target = 14
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				// A release or extend must succeed when its answer came
				// within the lease's TTL of sending the acquire (or the
				// extend) it follows, on the local monotonic clock: the
				// server's expiry is later than that. Later answers (CPU
				// load) may find the lease expired, rightly.
				sent := time.Now()
				r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 100 * time.Millisecond})
				if err != nil {
					t.Error(err)
					return
				}
				if !r.OK {
					continue
				}
				mu.Lock()
				n := len(grants)
				grants = append(grants, grant{r: r})
				mu.Unlock()
				g := grant{r: r, liveEnd: r.ExpiresAt.Add(keys.TimeTolerance)}
				live := func(since time.Time, ttl time.Duration) bool { return time.Since(since) < ttl }
				switch n % 4 {
				case 0: // release at once
					ok, err := s.Release(c, r.LockID)
					if err != nil || (!ok && live(sent, 100*time.Millisecond)) {
						t.Errorf("release: %v %v", ok, err)
					}
					g.released = ok
				case 1: // extend, then release
					esent := time.Now()
					e, err := s.Extend(c, r.LockID, 150*time.Millisecond)
					if err != nil || (!e.OK && live(sent, 100*time.Millisecond)) {
						t.Errorf("extend: %+v %v", e, err)
					}
					if e.OK {
						g.liveEnd = e.ExpiresAt.Add(keys.TimeTolerance)
					}
					ok, err := s.Release(c, r.LockID)
					if err != nil || (!ok && e.OK && live(esent, 150*time.Millisecond)) {
						t.Errorf("release after extend: %v %v", ok, err)
					}
					g.released = ok
				case 2: // extend, then abandon
					e, err := s.Extend(c, r.LockID, 150*time.Millisecond)
					if err != nil || (!e.OK && live(sent, 100*time.Millisecond)) {
						t.Errorf("extend: %+v %v", e, err)
					}
					if e.OK {
						g.liveEnd = e.ExpiresAt.Add(keys.TimeTolerance)
					}
				default: // abandon
				}
				mu.Lock()
				for i := range grants {
					if grants[i].r.LockID == r.LockID {
						grants[i] = g
					}
				}
				if len(grants) >= target {
					select {
					case <-stop:
					default:
						close(stop)
					}
				}
				mu.Unlock()
				_ = w
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(grants, func(a, b grant) int { return int(a.r.Fence - b.r.Fence) })
	if len(grants) < target {
		t.Fatalf("only %d grants", len(grants))
	}
	for i := 1; i < len(grants); i++ {
		prev, cur := grants[i-1], grants[i]
		if cur.r.Fence <= prev.r.Fence {
			t.Fatalf("fence %s after %s", cur.r.Fence, prev.r.Fence)
		}
		if cur.r.AcquiredAt.Before(prev.r.AcquiredAt) {
			t.Fatalf("grant %s acquired before grant %s", cur.r.Fence, prev.r.Fence)
		}
		if !prev.released && cur.r.AcquiredAt.Before(prev.liveEnd) {
			t.Fatalf("grant %s at %v overlaps abandoned grant %s live until %v", cur.r.Fence, cur.r.AcquiredAt, prev.r.Fence, prev.liveEnd)
		}
	}
}

// Takeover needs expires_at + 1000 ms on the server clock: an attempt made
// entirely before that fails, the first success is not earlier.
func TestTakeoverAfterTolerance(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	key := "takeover"
	first, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 200 * time.Millisecond})
	if err != nil || !first.OK {
		t.Fatal(first, err)
	}
	exp := first.ExpiresAt.UnixMilli()
	waitServer(t, pool, exp+1) // expired, but inside the tolerance
	checkedInside := false
	for {
		r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		after := serverNow(t, pool)
		if r.OK {
			if r.AcquiredAt.UnixMilli() < exp+keys.TimeToleranceMs {
				t.Fatalf("taken over at %d, before expiry+tolerance %d", r.AcquiredAt.UnixMilli(), exp+1000)
			}
			if r.Fence != first.Fence+1 {
				t.Fatalf("takeover fence %s, want %s", r.Fence, first.Fence+1)
			}
			break
		}
		if after < exp+keys.TimeToleranceMs {
			checkedInside = true
			// The old record is still reported live inside the tolerance.
			if locked, err := s.IsLocked(c, key); err != nil || (!locked && serverNow(t, pool) < exp+1000) {
				t.Fatalf("IsLocked inside tolerance = %v, %v", locked, err)
			}
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if !checkedInside {
		t.Fatal("no attempt happened inside the tolerance window")
	}
}

// Extend and Release refuse a lock whose expires_at has passed on the
// server clock, even inside the tolerance window (no revival).
func TestExtendReleaseRefuseAfterExpiry(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	r, err := s.Acquire(c, store.AcquireRequest{Key: "exp", TTL: 100 * time.Millisecond})
	if err != nil || !r.OK {
		t.Fatal(r, err)
	}
	waitServer(t, pool, r.ExpiresAt.UnixMilli()+1)
	e, err := s.Extend(c, r.LockID, time.Minute)
	if err != nil || e.OK {
		t.Fatalf("Extend after expiry = %+v, %v; want OK=false", e, err)
	}
	res, err := s.ExtendMany(c, []store.ExtendRequest{{LockID: r.LockID, TTL: time.Minute}})
	if err != nil || res[0].OK {
		t.Fatalf("ExtendMany after expiry = %+v, %v", res, err)
	}
	ok, err := s.Release(c, r.LockID)
	if err != nil || ok {
		t.Fatalf("Release after expiry = %v, %v; want false", ok, err)
	}
	if row := readRow(t, pool, "exp"); row == nil || row.expires != r.ExpiresAt.UnixMilli() {
		t.Fatalf("row changed by a refused extend/release: %+v", row)
	}
}

// SyncGuard's acquire/extend race replayed: an extend (SyncGuard's statements, on
// its own connection) holds the lock row FOR UPDATE after the lease
// expired beyond the tolerance; a concurrent pglease acquire waits for the
// row, sees the revived lease and answers locked instead of overwriting it
// (SyncGuard's acquire read the row without a lock and took it over:
// two holders). And pglease's own Extend cannot revive it at all.
func TestAcquireExtendRaceReplay(t *testing.T) {
	t.Parallel()
	s, pool, schema := newStore(t, store.Config{}, maxConns(4))
	c := ctx(t)
	key := "race-43"
	l1, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 100 * time.Millisecond})
	if err != nil || !l1.OK {
		t.Fatal(l1, err)
	}
	// pglease's Extend of L1 is refused once it expired.
	waitServer(t, pool, l1.ExpiresAt.UnixMilli()+1)
	if e, err := s.Extend(c, l1.LockID, 10*time.Second); err != nil || e.OK {
		t.Fatalf("pglease Extend revived an expired lease: %+v, %v", e, err)
	}

	// SyncGuard's extend: BEGIN (tx started earlier, L1 "live" for it);
	// SELECT ... WHERE lock_id = $1 FOR UPDATE.
	ext, err := pgx.Connect(c, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close(context.Background())
	tx, err := ext.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(c, "SET LOCAL search_path = "+schema); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(c, "SELECT * FROM syncguard_locks WHERE lock_id = $1 FOR UPDATE", l1.LockID); err != nil {
		t.Fatal(err)
	}
	// Dead for acquirers now.
	waitServer(t, pool, l1.ExpiresAt.UnixMilli()+keys.TimeToleranceMs)
	done := make(chan store.AcquireResult, 1)
	go func() {
		r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	// Wait until the acquire is blocked on the row lock. It waits at most
	// 100 ms for another transaction's locks and then answers "held, try
	// again": on a loaded machine that answer can come before this loop
	// sees the wait, and it is as safe (not a takeover), so it passes too.
	var early *store.AcquireResult
	for early == nil {
		var waiting bool
		if err := pool.QueryRow(c, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND wait_event IN ('transactionid', 'tuple') AND datname = current_database())`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			if r.OK || r.RetryAfter <= 0 {
				t.Fatalf("acquire neither waited for the row lock nor answered held with a retry: %+v", r)
			}
			early = &r
		case <-time.After(10 * time.Millisecond):
		}
	}
	// SyncGuard's extend: UPDATE expires_at_ms = now + ttl; COMMIT → {ok:true}.
	if _, err := tx.Exec(c, "UPDATE syncguard_locks SET expires_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 10000 WHERE key = $1", key); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(c); err != nil {
		t.Fatal(err)
	}
	r := early
	if r == nil {
		got := <-done
		r = &got
	}
	if r.OK {
		t.Fatal("acquire took over a lease that a concurrent extend kept: two holders")
	}
	if row := readRow(t, pool, key); row == nil || row.lockID != l1.LockID {
		t.Fatal("lease row was overwritten")
	}
}

// Fence counter at MAX−1: the next grant gets MAX, the one after is
// Internal with nothing granted; WARN is reported with the key's hash only.
func TestFenceOverflowAndWarn(t *testing.T) {
	t.Parallel()
	type warn struct {
		hash  string
		fence pglease.Fence
	}
	var mu sync.Mutex
	var warns []warn
	s, pool, _ := newStore(t, store.Config{OnFenceWarning: func(h string, f pglease.Fence) {
		mu.Lock()
		warns = append(warns, warn{h, f})
		mu.Unlock()
	}})
	c := ctx(t)
	if _, err := pool.Exec(c, `INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES
		('fence:max', $1, 'max'), ('fence:warn', $2, 'warn')`, int64(keys.FenceMax-1), int64(keys.FenceWarn)); err != nil {
		t.Fatal(err)
	}
	r, err := s.Acquire(c, store.AcquireRequest{Key: "max", TTL: time.Minute})
	if err != nil || !r.OK || r.Fence != keys.FenceMax {
		t.Fatalf("Acquire at MAX-1 = %+v, %v; want fence MAX", r, err)
	}
	if ok, err := s.Release(c, r.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	r, err = s.Acquire(c, store.AcquireRequest{Key: "max", TTL: time.Minute})
	if !errors.Is(err, pglease.ErrInternal) || r.OK {
		t.Fatalf("Acquire past MAX = %+v, %v; want Internal", r, err)
	}
	if f, _ := readCounter(t, pool, "fence:max"); f != int64(keys.FenceMax) {
		t.Fatalf("counter moved to %d", f)
	}
	if row := readRow(t, pool, "max"); row != nil {
		t.Fatal("a lock row exists after an overflow")
	}
	// In a batch the overflow is per item; the other key is granted.
	res, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "max", TTL: time.Minute}, {Key: "warn", TTL: time.Minute}})
	if err != nil || res[0].OK || !errors.Is(res[0].Err, pglease.ErrInternal) || !res[1].OK || res[1].Fence != keys.FenceWarn+1 {
		t.Fatalf("AcquireMany = %+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []warn{{pglease.HashKey("max"), keys.FenceMax}, {pglease.HashKey("warn"), keys.FenceWarn + 1}}
	if !slices.Equal(warns, want) {
		t.Fatalf("warnings = %v, want %v", warns, want)
	}
}

// Batches: results line up with requests, duplicates lose, and concurrent
// batches over the same keys in opposite orders never deadlock.
func TestBatches(t *testing.T) {
	t.Parallel()
	s, _, _ := newStore(t, store.Config{}, maxConns(4))
	c := ctx(t)
	held, err := s.Acquire(c, store.AcquireRequest{Key: "b-held", TTL: time.Minute})
	if err != nil || !held.OK {
		t.Fatal(held, err)
	}
	pre := keys.NewLockID()
	res, err := s.AcquireMany(c, []store.AcquireRequest{
		{Key: "b-1", TTL: time.Minute}, {Key: "b-held", TTL: time.Minute}, {Key: "b-1", TTL: time.Minute},
		{Key: "b-2", TTL: 2 * time.Minute, LockID: pre},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].OK || res[1].OK || res[2].OK || !res[3].OK || res[3].LockID != pre || res[3].ExpiresAt.Sub(res[3].AcquiredAt) != 2*time.Minute {
		t.Fatalf("AcquireMany = %+v", res)
	}
	ext, err := s.ExtendMany(c, []store.ExtendRequest{{LockID: res[3].LockID, TTL: time.Second}, {LockID: keys.NewLockID(), TTL: time.Second}, {LockID: res[0].LockID, TTL: 3 * time.Second}})
	if err != nil || !ext[0].OK || ext[1].OK || !ext[2].OK || ext[2].ExpiresAt.Sub(ext[0].ExpiresAt) != 2*time.Second {
		t.Fatalf("ExtendMany = %+v, %v", ext, err)
	}
	rel, err := s.ReleaseMany(c, []string{res[0].LockID, keys.NewLockID(), res[0].LockID, res[3].LockID, held.LockID})
	if err != nil || !slices.Equal(rel, []bool{true, false, false, true, true}) {
		t.Fatalf("ReleaseMany = %v, %v", rel, err)
	}

	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprint("dl-", i)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ks := slices.Clone(keys)
			if w%2 == 1 {
				slices.Reverse(ks)
			}
			for range 25 {
				reqs := make([]store.AcquireRequest, len(ks))
				for i, k := range ks {
					reqs[i] = store.AcquireRequest{Key: k, TTL: time.Minute}
				}
				res, err := s.AcquireMany(c, reqs)
				if err != nil {
					t.Errorf("AcquireMany: %v", err)
					return
				}
				var ids []string
				var ereqs []store.ExtendRequest
				for _, r := range res {
					if r.OK {
						ids = append(ids, r.LockID)
						ereqs = append(ereqs, store.ExtendRequest{LockID: r.LockID, TTL: time.Minute})
					}
				}
				if _, err := s.ExtendMany(c, ereqs); err != nil {
					t.Errorf("ExtendMany: %v", err)
					return
				}
				if _, err := s.ReleaseMany(c, ids); err != nil {
					t.Errorf("ReleaseMany: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
