package store_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

var lockIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

type lockRow struct {
	key, lockID, fence, userKey string
	expires, acquired           int64
}

func readRow(t *testing.T, db testDB, key string) *lockRow {
	t.Helper()
	var r lockRow
	err := db.QueryRow(ctx(t), `SELECT key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key FROM syncguard_locks WHERE key = $1`, key).
		Scan(&r.key, &r.lockID, &r.expires, &r.acquired, &r.fence, &r.userKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &r
}

func readCounter(t *testing.T, db testDB, fenceKey string) (int64, string) {
	t.Helper()
	var f int64
	var dbg *string
	err := db.QueryRow(ctx(t), `SELECT fence, key_debug FROM syncguard_fence_counters WHERE fence_key = $1`, fenceKey).Scan(&f, &dbg)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	if dbg == nil {
		return f, "<nil>"
	}
	return f, *dbg
}

// Full lifecycle, with the stored bytes checked against SyncGuard's format.
func TestLifecycleAndStoredFormat(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	key := "cafe\u0301:resource" // NFD input
	nfc := "café:resource"
	before := serverNow(t, pool)
	r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: 30 * time.Second})
	if err != nil || !r.OK {
		t.Fatalf("Acquire = %+v, %v", r, err)
	}
	after := serverNow(t, pool)
	if !lockIDRe.MatchString(r.LockID) || r.Fence != 1 {
		t.Fatalf("lockId format or first fence wrong: fence %s", r.Fence)
	}
	if a := r.AcquiredAt.UnixMilli(); a < before || a > after || r.ExpiresAt.Sub(r.AcquiredAt) != 30*time.Second {
		t.Fatalf("times: acquired %d not in [%d,%d] or ttl %v", a, before, after, r.ExpiresAt.Sub(r.AcquiredAt))
	}
	row := readRow(t, pool, nfc)
	if row == nil || row.key != nfc || row.userKey != nfc || row.lockID != r.LockID || row.fence != "000000000000001" ||
		row.acquired != r.AcquiredAt.UnixMilli() || row.expires != r.ExpiresAt.UnixMilli() {
		t.Fatalf("stored row not SyncGuard's format: %+v", row)
	}
	if f, dbg := readCounter(t, pool, "fence:"+nfc); f != 1 || dbg != nfc {
		t.Fatalf("counter = %d, key_debug %q", f, dbg)
	}
	// The NFC and NFD spellings are the same lock.
	if r2, err := s.Acquire(c, store.AcquireRequest{Key: nfc, TTL: time.Second}); err != nil || r2.OK {
		t.Fatalf("second Acquire of the NFC form = %+v, %v; want locked", r2, err)
	}
	for _, k := range []string{key, nfc} {
		if locked, err := s.IsLocked(c, k); err != nil || !locked {
			t.Fatalf("IsLocked = %v, %v", locked, err)
		}
	}
	info, err := s.LookupByKey(c, key)
	if err != nil || info == nil {
		t.Fatalf("LookupByKey = %v, %v", info, err)
	}
	want := store.LockInfo{KeyHash: pglease.HashKey(nfc), LockIDHash: pglease.HashKey(r.LockID),
		AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt, Fence: 1, Holder: store.DefaultHolder()}
	if *info != want {
		t.Fatalf("LookupByKey = %v, want %v", info, want)
	}
	byID, err := s.LookupByID(c, r.LockID)
	if err != nil || byID == nil || *byID != want {
		t.Fatalf("LookupByID = %v, %v", byID, err)
	}
	raw, err := s.LookupRawByID(c, r.LockID)
	if err != nil || raw == nil || raw.Key != nfc || raw.LockID != r.LockID || raw.LockInfo != want {
		t.Fatalf("LookupRawByID = %v, %v", raw, err)
	}
	raw, err = s.LookupRawByKey(c, key)
	if err != nil || raw == nil || raw.Key != nfc || raw.LockID != r.LockID {
		t.Fatalf("LookupRawByKey = %v, %v", raw, err)
	}
	// Nothing raw in any formatting of the results.
	for _, v := range []any{r, raw, *raw, info, store.AcquireRequest{Key: nfc, LockID: r.LockID}, store.ExtendRequest{LockID: r.LockID}} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			out := fmt.Sprintf(verb, v)
			if strings.Contains(out, r.LockID) || strings.Contains(out, nfc) {
				t.Fatalf("%s of %T shows a raw value: %s", verb, v, out)
			}
		}
	}
	if own, err := s.Owns(c, r.LockID); err != nil || !own {
		t.Fatalf("Owns = %v, %v", own, err)
	}
	// Extend replaces the expiry with server now + ttl.
	before = serverNow(t, pool)
	e, err := s.Extend(c, r.LockID, 5*time.Second)
	after = serverNow(t, pool)
	if err != nil || !e.OK || e.ExpiresAt.UnixMilli() < before+5000 || e.ExpiresAt.UnixMilli() > after+5000 {
		t.Fatalf("Extend = %+v, %v (server now in [%d,%d])", e, err, before, after)
	}
	if row := readRow(t, pool, nfc); row.expires != e.ExpiresAt.UnixMilli() || row.acquired != r.AcquiredAt.UnixMilli() {
		t.Fatalf("row after extend: %+v", row)
	}
	ok, err := s.Release(c, r.LockID)
	if err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	if ok, err := s.Release(c, r.LockID); err != nil || ok {
		t.Fatalf("second Release = %v, %v; want false", ok, err)
	}
	if e, err := s.Extend(c, r.LockID, time.Second); err != nil || e.OK {
		t.Fatalf("Extend after release = %+v, %v", e, err)
	}
	if info, err := s.LookupByKey(c, nfc); err != nil || info != nil {
		t.Fatalf("LookupByKey after release = %v, %v", info, err)
	}
	if own, err := s.Owns(c, r.LockID); err != nil || own {
		t.Fatalf("Owns after release = %v, %v", own, err)
	}
	if locked, err := s.IsLocked(c, nfc); err != nil || locked {
		t.Fatalf("IsLocked after release = %v, %v", locked, err)
	}
	// Unknown, well-formed ids are false, not errors.
	if ok, err := s.Release(c, "AAAAAAAAAAAAAAAAAAAAAB"); err != nil || ok {
		t.Fatalf("Release(unknown) = %v, %v", ok, err)
	}
	// Re-acquire: the counter survives, the fence increases.
	r3, err := s.Acquire(c, store.AcquireRequest{Key: nfc, TTL: time.Second})
	if err != nil || !r3.OK || r3.Fence != 2 || r3.LockID == r.LockID {
		t.Fatalf("re-Acquire = %+v, %v", r3, err)
	}
}

// Hostile keys are ordinary bound parameters.
func TestHostileKeys(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{})
	c := ctx(t)
	for _, k := range []string{"'; DROP TABLE syncguard_locks;--", `"); DELETE FROM syncguard_fence_counters; --`, "$1", "%s%n", "\\x00", "😀 emoji", strings.Repeat("é", 256)} {
		r, err := s.Acquire(c, store.AcquireRequest{Key: k, TTL: time.Minute})
		if err != nil || !r.OK {
			t.Fatalf("Acquire(hostile) = %+v, %v", r, err)
		}
		if row := readRow(t, pool, k); row == nil || row.userKey != k {
			t.Fatalf("hostile key not stored verbatim")
		}
		if ok, err := s.Release(c, r.LockID); err != nil || !ok {
			t.Fatalf("Release = %v, %v", ok, err)
		}
	}
	var n int
	if err := pool.QueryRow(c, "SELECT count(*) FROM syncguard_fence_counters").Scan(&n); err != nil || n != 7 {
		t.Fatalf("fence table: %d rows, %v", n, err)
	}
}

// Every bad input of the lease operations: typed error, no I/O, no echo
// of the input.
func TestBadInputNoIO(t *testing.T) {
	t.Parallel()
	cnt := &pgtest.Recorder{}
	s, _, _ := newStore(t, store.Config{}, cnt.Configure)
	c := ctx(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	good := keys.NewLockID()
	badKeys := []string{"", "\xff\xfe", "a\x80b", "a\x00b", strings.Repeat("x", 513), strings.Repeat("é", 256) + "a", strings.Repeat("k", 10<<20)}
	badIDs := []string{"", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAA+A", "AAAAAAAAAAAAAAAAAAAA/A", "AAAAAAAAAAAAAAAAAAAAA=", "AAAAAAAAAA AAAAAAAAAAA", "'; DROP TABLE x;--xxxx"}
	badTTLs := []time.Duration{0, -time.Second, 1500 * time.Microsecond, time.Nanosecond, 1<<63 - 1}
	cnt.Reset()
	type call struct {
		name string
		want *pglease.Error
		fn   func() error
		echo string
	}
	var calls []call
	for _, k := range badKeys {
		calls = append(calls,
			call{"Acquire", pglease.ErrInvalidArgument, func() error { _, err := s.Acquire(c, store.AcquireRequest{Key: k, TTL: time.Second}); return err }, k},
			call{"AcquireMany", pglease.ErrInvalidArgument, func() error {
				_, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "ok", TTL: time.Second}, {Key: k, TTL: time.Second}})
				return err
			}, k},
			call{"IsLocked", pglease.ErrInvalidArgument, func() error { _, err := s.IsLocked(c, k); return err }, k},
			call{"LookupByKey", pglease.ErrInvalidArgument, func() error { _, err := s.LookupByKey(c, k); return err }, k},
			call{"LookupRawByKey", pglease.ErrInvalidArgument, func() error { _, err := s.LookupRawByKey(c, k); return err }, k},
		)
	}
	for _, id := range badIDs {
		calls = append(calls,
			call{"Release", pglease.ErrInvalidArgument, func() error { _, err := s.Release(c, id); return err }, id},
			call{"ReleaseMany", pglease.ErrInvalidArgument, func() error { _, err := s.ReleaseMany(c, []string{good, id}); return err }, id},
			call{"Extend", pglease.ErrInvalidArgument, func() error { _, err := s.Extend(c, id, time.Second); return err }, id},
			call{"ExtendMany", pglease.ErrInvalidArgument, func() error {
				_, err := s.ExtendMany(c, []store.ExtendRequest{{LockID: id, TTL: time.Second}})
				return err
			}, id},
			call{"LookupByID", pglease.ErrInvalidArgument, func() error { _, err := s.LookupByID(c, id); return err }, id},
			call{"Owns", pglease.ErrInvalidArgument, func() error { _, err := s.Owns(c, id); return err }, id},
			call{"Acquire(pre-generated id)", pglease.ErrInvalidArgument, func() error {
				if id == "" { // "" means generate: valid; make it fail on TTL instead
					_, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "k", TTL: 0, LockID: id}})
					return err
				}
				_, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "k", TTL: time.Second, LockID: id}})
				return err
			}, id},
		)
	}
	for _, ttl := range badTTLs {
		calls = append(calls,
			call{"Acquire ttl", pglease.ErrInvalidArgument, func() error { _, err := s.Acquire(c, store.AcquireRequest{Key: "k", TTL: ttl}); return err }, ""},
			call{"Extend ttl", pglease.ErrInvalidArgument, func() error { _, err := s.Extend(c, good, ttl); return err }, ""},
		)
	}
	//nolint:staticcheck // nil context on purpose
	var nilCtx context.Context
	calls = append(calls,
		call{"nil ctx Acquire", pglease.ErrInvalidArgument, func() error {
			_, err := s.Acquire(nilCtx, store.AcquireRequest{Key: "k", TTL: time.Second})
			return err
		}, ""},
		call{"nil ctx Release", pglease.ErrInvalidArgument, func() error { _, err := s.Release(nilCtx, good); return err }, ""},
		call{"nil ctx Extend", pglease.ErrInvalidArgument, func() error { _, err := s.Extend(nilCtx, good, time.Second); return err }, ""},
		call{"nil ctx IsLocked", pglease.ErrInvalidArgument, func() error { _, err := s.IsLocked(nilCtx, "k"); return err }, ""},
		call{"nil ctx Lookup", pglease.ErrInvalidArgument, func() error { _, err := s.LookupByID(nilCtx, good); return err }, ""},
		call{"nil ctx SetupSchema", pglease.ErrInvalidArgument, func() error { return setupSchema(s, nilCtx) }, ""},
		call{"nil ctx AcquireMany", pglease.ErrInvalidArgument, func() error { _, err := s.AcquireMany(nilCtx, nil); return err }, ""},
		call{"cancelled Acquire", pglease.ErrAborted, func() error {
			_, err := s.Acquire(cancelled, store.AcquireRequest{Key: "k", TTL: time.Second})
			return err
		}, ""},
		call{"cancelled ReleaseMany", pglease.ErrAborted, func() error { _, err := s.ReleaseMany(cancelled, []string{good}); return err }, ""},
		call{"cancelled ExtendMany", pglease.ErrAborted, func() error { _, err := s.ExtendMany(cancelled, nil); return err }, ""},
		call{"cancelled LookupByKey", pglease.ErrAborted, func() error { _, err := s.LookupByKey(cancelled, "k"); return err }, ""},
		call{"cancelled SetupSchema", pglease.ErrAborted, func() error { return setupSchema(s, cancelled) }, ""},
		call{"duplicate lockIds", pglease.ErrInvalidArgument, func() error {
			_, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "a", TTL: time.Second, LockID: good}, {Key: "b", TTL: time.Second, LockID: good}})
			return err
		}, good},
		call{"batch too large", pglease.ErrInvalidArgument, func() error {
			_, err := s.ReleaseMany(c, make([]string, store.MaxBatch+1))
			return err
		}, ""},
		call{"extend batch too large", pglease.ErrInvalidArgument, func() error {
			_, err := s.ExtendMany(c, make([]store.ExtendRequest, store.MaxExtendBatch+1))
			return err
		}, ""},
	)
	for _, cl := range calls {
		err := cl.fn()
		if !errors.Is(err, cl.want) {
			t.Errorf("%s: err = %v, want %v", cl.name, err, cl.want.Code)
			continue
		}
		if len(cl.echo) >= 3 && strings.Contains(err.Error(), cl.echo) {
			t.Errorf("%s: error echoes the input: %v", cl.name, err)
		}
	}
	if _, err := s.Acquire(cancelled, store.AcquireRequest{Key: "k", TTL: time.Second}); !errors.Is(err, context.Canceled) {
		t.Errorf("Aborted does not wrap context.Canceled: %v", err)
	}
	if q, w := cnt.Queries(), cnt.Writes(); q != 0 || w != 0 {
		t.Fatalf("invalid input caused %d queries, %d network writes; want 0", q, w)
	}
	// Empty batches are no-ops without I/O.
	if r, err := s.AcquireMany(c, nil); err != nil || len(r) != 0 {
		t.Fatal(r, err)
	}
	if r, err := s.ReleaseMany(c, []string{}); err != nil || len(r) != 0 {
		t.Fatal(r, err)
	}
	if r, err := s.ExtendMany(c, nil); err != nil || len(r) != 0 {
		t.Fatal(r, err)
	}
	if q := cnt.Queries(); q != 0 {
		t.Fatalf("empty batches sent %d queries", q)
	}
}

// One query, one network write (= one round trip) and no prepare per
// operation once pgx's statement cache is warm.
func TestOneRoundTripPerOperation(t *testing.T) {
	t.Parallel()
	cnt := &pgtest.Recorder{}
	s, _, _ := newStore(t, store.Config{NotifyChannel: "pglease_test"}, cnt.Configure, maxConns(1))
	c := ctx(t)
	var id string
	var ids []string
	ops := []struct {
		name string
		fn   func() error
	}{
		{"Acquire", func() error {
			r, err := s.Acquire(c, store.AcquireRequest{Key: "rt", TTL: time.Minute})
			if err == nil && !r.OK {
				err = errors.New("not acquired")
			}
			id = r.LockID
			return err
		}},
		{"Extend", func() error { _, err := s.Extend(c, id, time.Minute); return err }},
		{"IsLocked", func() error { _, err := s.IsLocked(c, "rt"); return err }},
		{"LookupByKey", func() error { _, err := s.LookupByKey(c, "rt"); return err }},
		{"LookupByID", func() error { _, err := s.LookupByID(c, id); return err }},
		{"Release", func() error { _, err := s.Release(c, id); return err }},
		{"AcquireMany", func() error {
			reqs := make([]store.AcquireRequest, 64)
			for i := range reqs {
				reqs[i] = store.AcquireRequest{Key: fmt.Sprint("rt-", i), TTL: time.Minute}
			}
			res, err := s.AcquireMany(c, reqs)
			ids = ids[:0]
			for _, r := range res {
				ids = append(ids, r.LockID)
			}
			return err
		}},
		{"ExtendMany", func() error {
			reqs := make([]store.ExtendRequest, len(ids))
			for i, id := range ids {
				reqs[i] = store.ExtendRequest{LockID: id, TTL: time.Minute}
			}
			_, err := s.ExtendMany(c, reqs)
			return err
		}},
		{"ReleaseMany", func() error { _, err := s.ReleaseMany(c, ids); return err }},
	}
	for round := 0; round < 3; round++ {
		for _, op := range ops {
			cnt.Reset()
			if err := op.fn(); err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
			if round == 0 {
				continue // warm-up: pgx prepares each statement once per connection
			}
			if q, p, w := cnt.Queries(), cnt.Prepares(), cnt.Writes(); q != 1 || p != 0 || w != 1 {
				t.Errorf("%s: %d queries, %d prepares, %d writes; want 1, 0, 1", op.name, q, p, w)
			}
		}
	}
}

// ExtendMany takes more than MaxBatch items (up to MaxExtendBatch) in one
// statement: a large holder's heartbeat tick is one round trip.
func TestExtendManyBeyondMaxBatch(t *testing.T) {
	t.Parallel()
	cnt := &pgtest.Recorder{}
	s, _, _ := newStore(t, store.Config{}, cnt.Configure)
	c := ctx(t)
	n := store.MaxBatch + 1
	ids := make([]string, 0, n)
	for lo := 0; lo < n; lo += 1000 {
		reqs := make([]store.AcquireRequest, 0, 1000)
		for i := lo; i < min(lo+1000, n); i++ {
			reqs = append(reqs, store.AcquireRequest{Key: fmt.Sprintf("ext-many-%d", i), TTL: time.Minute})
		}
		res, err := s.AcquireMany(c, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if !r.OK {
				t.Fatal("acquire refused")
			}
			ids = append(ids, r.LockID)
		}
	}
	reqs := make([]store.ExtendRequest, n)
	for i, id := range ids {
		reqs[i] = store.ExtendRequest{LockID: id, TTL: 2 * time.Minute}
	}
	cnt.Reset()
	res, err := s.ExtendMany(c, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if q := cnt.Queries(); q != 1 {
		t.Fatalf("%d queries for one ExtendMany of %d, want 1", q, n)
	}
	for i, r := range res {
		if !r.OK {
			t.Fatalf("item %d not extended", i)
		}
	}
	oks, err := s.ReleaseMany(c, ids[:store.MaxBatch])
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Release(c, ids[store.MaxBatch]); err != nil || !ok || len(oks) != store.MaxBatch {
		t.Fatal(ok, err)
	}
}
