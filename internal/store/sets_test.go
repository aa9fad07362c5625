package store_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

func set(ttl time.Duration, ks ...string) []store.AcquireRequest {
	out := make([]store.AcquireRequest, len(ks))
	for i, k := range ks {
		out[i] = store.AcquireRequest{Key: k, TTL: ttl}
	}
	return out
}

// Sets {a, b} and {b, a} (and {b, c, a}) taken and released by 12
// goroutines, each its own holder: no deadlock, and a monitor on another
// connection never sees a partial set (a key held by a holder that does
// not hold the set's other keys); every key of a granted set gets its own
// lockId and the key's next fence.
func TestSetsAllOrNothingNoDeadlock(t *testing.T) {
	t.Parallel()
	const workers = 12
	rounds := 20
	if testing.Short() {
		rounds = 6
	}
	rs := pgtest.RoleSchemaForTest(t)
	pool := rs.RuntimePool(t)
	base := pgtest.RandomName("set_")
	a, b, c := base+"-a", base+"-b", base+"-c"
	orders := [][]string{{a, b}, {b, a}, {b, c, a}}
	var stop atomic.Bool
	var partial atomic.Int32
	var looks atomic.Int32
	monitor := make(chan struct{})
	go func() {
		defer close(monitor)
		for !stop.Load() {
			rows, err := pool.Query(ctx(t), `SELECT l.key, h.holder FROM syncguard_locks AS l
				JOIN syncguard_locks_holders AS h ON h.key = l.key AND h.lock_id = l.lock_id
				WHERE l.key = ANY ($1) AND l.expires_at_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint`, []string{a, b, c})
			if err != nil {
				t.Error(err)
				return
			}
			held := map[string]string{}
			for rows.Next() {
				var k, h string
				if err := rows.Scan(&k, &h); err != nil {
					t.Error(err)
					return
				}
				held[k] = h
			}
			rows.Close()
			looks.Add(1)
			// Every worker's set contains a and b: whoever holds one
			// holds the other; c only with both.
			if held[a] != held[b] || (held[c] != "" && held[c] != held[a]) {
				partial.Add(1)
				t.Errorf("partial set seen: %v", held)
			}
		}
	}()
	var mu sync.Mutex
	fences := map[string][]pglease.Fence{}
	var wg sync.WaitGroup
	for w := range workers {
		s, err := store.New("pg.New", pool, store.Config{Holder: fmt.Sprint("worker-", w)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for got := 0; got < rounds; {
				ks := orders[(w+got)%len(orders)]
				res, err := s.AcquireSets(ctx(t), [][]store.AcquireRequest{set(time.Minute, ks...)})
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				ok := 0
				for _, r := range res[0] {
					if r.OK {
						ok++
					}
				}
				if ok == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				if ok != len(ks) {
					t.Errorf("worker %d: %d of %d keys granted", w, ok, len(ks))
					return
				}
				got++
				ids := make([]string, len(ks))
				mu.Lock()
				for i, r := range res[0] {
					ids[i] = r.LockID
					fences[ks[i]] = append(fences[ks[i]], r.Fence)
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if res, err := s.ReleaseMany(ctx(t), ids); err != nil || slices.Contains(res, false) {
					t.Errorf("ReleaseMany = %v, %v", res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	<-monitor
	for k, fs := range fences {
		slices.Sort(fs)
		for i, f := range fs {
			if f != pglease.Fence(i+1) {
				t.Fatalf("key %s: fences %v, want 1 … %d (one per grant)", pglease.HashKey(k), fs, len(fs))
			}
		}
	}
	t.Logf("%d set grants of a, %d of c; the monitor looked %d times", len(fences[a]), len(fences[c]), looks.Load())
}

// A refused set writes nothing: its free keys get no row and their
// fence counters do not move; the held key's item says by whom and until
// when. Shared holds refuse a set too. In a batch, a key in two sets goes
// to the first only.
func TestSetRefusedWritesNothing(t *testing.T) {
	t.Parallel()
	other, pool, _ := newStore(t, store.Config{Holder: "other"})
	s, err := store.New("pg.New", pool, store.Config{Holder: "me"})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	base := pgtest.RandomName("setref_")
	a, b, x, y := base+"-a", base+"-b", base+"-x", base+"-y"
	// a's counter exists (a past grant), b is held by other.
	release(t, s, exclusive(t, s, a, time.Minute).LockID)
	hb := exclusive(t, other, b, time.Minute)
	res, err := s.AcquireSets(c, [][]store.AcquireRequest{set(time.Minute, a, b)})
	if err != nil || len(res) != 1 || len(res[0]) != 2 {
		t.Fatal(res, err)
	}
	ra, rb := res[0][0], res[0][1]
	if ra.OK || rb.OK || ra.RetryAfter != 0 || rb.RetryAfter <= 0 || rb.Holder != "other" || rb.ExpiresAt != hb.ExpiresAt {
		t.Fatalf("set {a, b} with b held = %+v, %+v", ra, rb)
	}
	if row := readRow(t, pool, a); row != nil {
		t.Fatal("the refused set wrote a's row")
	}
	if f, _ := readCounter(t, pool, "fence:"+a); f != 1 {
		t.Fatalf("a's counter = %d after a refused set, want 1", f)
	}
	// Shared holds refuse it too.
	release(t, other, hb.LockID)
	rd := shared(t, other, b, 0, time.Minute)
	res, err = s.AcquireSets(c, [][]store.AcquireRequest{set(time.Minute, a, b)})
	if err != nil || res[0][0].OK || res[0][1].OK || res[0][1].SharedHolders != 1 {
		t.Fatalf("set with a reader on b = %+v, %v", res, err)
	}
	release(t, other, rd.LockID)
	// A batch of three sets: {a, b} granted; {b, x} refused (b went to
	// the first set), x untouched; {y} granted.
	res, err = s.AcquireSets(c, [][]store.AcquireRequest{set(time.Minute, a, b), set(time.Minute, b, x), set(time.Minute, y)})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0][0].OK || !res[0][1].OK || res[1][0].OK || res[1][1].OK || !res[2][0].OK {
		t.Fatalf("batch of sets = %+v", res)
	}
	if res[0][0].Fence != 2 || res[0][1].Fence != 2 || res[2][0].Fence != 1 || res[0][0].LockID == res[0][1].LockID {
		t.Fatalf("fences %s %s %s, lockIds distinct %v; want 2 2 1", res[0][0].Fence, res[0][1].Fence, res[2][0].Fence, res[0][0].LockID != res[0][1].LockID)
	}
	if row := readRow(t, pool, x); row != nil {
		t.Fatal("the refused second set wrote x's row")
	}
	// Each granted key is an ordinary lease.
	if info, err := s.LookupByKey(c, b); err != nil || info == nil || info.Holder != "me" || info.Fence != 2 {
		t.Fatalf("LookupByKey(b) = %v, %v", info, err)
	}
	if ok, err := s.Release(c, res[0][1].LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := s.IsLocked(c, a); err != nil || !ok {
		t.Fatal("releasing b released a", ok, err)
	}
}

// A key at the fence limit keeps its whole set from being granted (Err on
// its item, nothing written for the others).
func TestSetFenceOverflow(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	base := pgtest.RandomName("setmax_")
	a, m := base+"-a", base+"-max"
	if _, err := pool.Exec(c, `INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ($1, $2, $3)`,
		"fence:"+m, int64(keys.FenceMax), m); err != nil {
		t.Fatal(err)
	}
	res, err := s.AcquireSets(c, [][]store.AcquireRequest{set(time.Minute, a, m)})
	if err != nil || res[0][0].OK || res[0][1].OK || res[0][0].Err != nil || !errors.Is(res[0][1].Err, pglease.ErrInternal) {
		t.Fatalf("set with a key at FENCE MAX = %+v, %v", res, err)
	}
	var n int
	if err := pool.QueryRow(c, "SELECT count(*) FROM syncguard_fence_counters WHERE fence_key = $1", "fence:"+a).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a's counter rows = %d, %v; want none", n, err)
	}
}

// Bad sets fail before any I/O.
func TestSetsBadInputNoIO(t *testing.T) {
	t.Parallel()
	var cnt pgtest.Recorder
	s, _, _ := newStore(t, store.Config{}, cnt.Configure)
	c := ctx(t)
	cnt.Reset()
	for name, sets := range map[string][][]store.AcquireRequest{
		"empty set": {set(time.Minute, "a"), {}},
		"dup key":   {set(time.Minute, "a", "b", "a")},
		"dup NFC":   {set(time.Minute, "\u00e9", "e\u0301")},
		"bad ttl":   {set(time.Microsecond, "a")},
		"bad delay": {{{Key: "a", TTL: time.Minute, LockDelay: -time.Second}}},
		"too many":  {set(time.Minute, make([]string, store.MaxBatch+1)...)},
	} {
		if _, err := s.AcquireSets(c, sets); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if n := cnt.Queries() + cnt.Writes(); n != 0 {
		t.Fatalf("%d queries/writes for bad input", n)
	}
	if res, err := s.AcquireSets(c, nil); err != nil || len(res) != 0 {
		t.Fatal(res, err)
	}
}
