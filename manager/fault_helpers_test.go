package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// Helpers of the fault-class tests (fault_*_test.go): servers of their own
// (a clock-shifted one, one on a small filesystem), a fenced resource whose
// accepted writes the server logs, and the check that reads that log.

// requireFaultsEnv, when set (CI sets it), turns a missing fault facility
// (libfaketime, mount, PgBouncer) into a failure instead of a skip.
const requireFaultsEnv = "PGLEASE_REQUIRE_FAULTS"

// needFacility skips the test because a facility it needs is missing
// (reason says which and how to get it), or fails it when
// PGLEASE_REQUIRE_FAULTS is set.
func needFacility(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(requireFaultsEnv) != "" {
		t.Fatalf("%s is set but %s", requireFaultsEnv, reason)
	}
	t.Skip(reason)
}

// ownServer starts a throwaway cluster of the test's own (stopped when
// the test ends) with opts, creates pglease's tables with their default
// names in its postgres database, and returns it with a superuser pool.
// Fault tests that shift the server's clock, fill its disk or change its
// settings run there, never on the package's shared server.
func ownServer(t *testing.T, opts pgtest.Options) (*pgtest.Cluster, *pgxpool.Pool) {
	t.Helper()
	if os.Getenv("DATABASE_URL") != "" && pgtest.ClusterForTest() == nil {
		t.Skip("DATABASE_URL given: this fault test starts a server of its own, which needs PostgreSQL's binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 40
	}
	cl, err := pgtest.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	pool := serverPool(t, cl.URL, 8)
	mg, err := migrate.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Up(ctx); err != nil {
		t.Fatal(err)
	}
	return cl, pool
}

// serverPool returns a pool on url with at most n connections, closed when
// the test ends.
func serverPool(t *testing.T, url string, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// faultManager returns a Manager on pool with cfg, closed when the test
// ends (a Close error is reported, not fatal: some fault tests close it
// while the server is unwell).
func faultManager(t *testing.T, pool *pgxpool.Pool, cfg Config) *Manager {
	t.Helper()
	m, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m
}

// fencedResource is a table of rows written only through a fence
// (fault_res: id, fence, val) and a trigger that logs every change the
// server accepted to fault_res_log, in commit order of the row's writes
// (the row lock orders them), with the writer's fence.
type fencedResource struct {
	guard *pg.FenceGuard
}

func newFencedResource(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *fencedResource {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE fault_res (id text PRIMARY KEY, fence bigint, val bigint NOT NULL DEFAULT 0)`,
		`CREATE TABLE fault_res_log (seq bigserial PRIMARY KEY, id text NOT NULL, fence bigint, val bigint)`,
		`CREATE FUNCTION fault_res_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   INSERT INTO fault_res_log (id, fence, val) VALUES (NEW.id, NEW.fence, NEW.val);
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER fault_res_audit AFTER INSERT OR UPDATE ON fault_res
		 FOR EACH ROW EXECUTE FUNCTION fault_res_audit()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	g, err := pg.NewFenceGuard("fault_res", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	return &fencedResource{guard: g}
}

// write is a correct client's fenced write of val to row id.
func (r *fencedResource) write(ctx context.Context, pool *pgxpool.Pool, id string, fence pglease.Fence, val int64) (bool, error) {
	return r.guard.Upsert(ctx, pool, id, fence, pg.Set{Column: "val", Value: val})
}

// writeIgnoringFence is the broken client of the negative controls: it
// writes with its fence but without the fence's condition, as a client
// that trusts its lease instead of fencing would.
func writeIgnoringFence(ctx context.Context, pool *pgxpool.Pool, id string, fence pglease.Fence, val int64) error {
	_, err := pool.Exec(ctx, `INSERT INTO fault_res (id, fence, val) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET fence = EXCLUDED.fence, val = EXCLUDED.val`, id, int64(fence), val)
	return err
}

// fencedLogViolations reads the server's log of accepted writes and
// returns one line per write of a row that carried a lower fence than a
// write accepted before it: a stale holder's write landing after its
// successor's (S3 broken). Empty means the resource is consistent.
func fencedLogViolations(t *testing.T, ctx context.Context, pool *pgxpool.Pool) (violations []string, writes int) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT seq, id, fence FROM fault_res_log ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	highest := map[string]int64{}
	for rows.Next() {
		var seq, fence int64
		var id string
		if err := rows.Scan(&seq, &id, &fence); err != nil {
			t.Fatal(err)
		}
		writes++
		if h, ok := highest[id]; ok && fence < h {
			violations = append(violations, fmt.Sprintf("write %d of row %q has fence %d after fence %d was accepted", seq, id, fence, h))
			continue
		}
		highest[id] = fence
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return violations, writes
}

// faultLoad runs lease cycles on Managers while a test injects a fault,
// and records what a correct client must see: every Acquire, Extend and
// Release either succeeds or fails with a *pglease.Error that has a code;
// a lease its holder trusts (Err nil before and after the look) is live on
// the server with its lockId; a fenced write is refused only after its
// holder stopped trusting the lease. Its workers write the resource and
// read the lock table over direct pools (so a pooler fault does not hide
// what the server has).
type faultLoad struct {
	ms        []*Manager
	res       *fencedResource
	direct    *pgxpool.Pool // the resource and the lock table, not through the fault
	lockTable string        // as direct names it
	ttl       time.Duration
	keys      int
	prefix    string
	noTrust   bool // skip the trusted-implies-live check (faults that delete rows)
	freshKeys bool // workers take a new key each cycle (the lock table grows)

	next   atomic.Int64
	grants sync.Map // key → highest fence reported granted (int64)

	mu         sync.Mutex
	ok         map[string]int
	typed      map[string]map[pglease.Code]int
	untyped    []string
	violations []string
	lastOK     atomic.Int64 // UnixNano of the last successful acquire

	// writer, once a test sets it (a failover moved the lock tables and
	// the resource to another server), replaces direct.
	writer atomic.Pointer[pgxpool.Pool]
}

// record classifies one operation's outcome.
func (l *faultLoad) record(op string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ok == nil {
		l.ok, l.typed = map[string]int{}, map[string]map[pglease.Code]int{}
	}
	if err == nil {
		l.ok[op]++
		if op == "acquire" {
			l.lastOK.Store(time.Now().UnixNano())
		}
		return
	}
	var pe *pglease.Error
	if !errors.As(err, &pe) || pe.Code == 0 {
		l.untyped = append(l.untyped, fmt.Sprintf("%s: %v", op, err))
		return
	}
	if l.typed[op] == nil {
		l.typed[op] = map[pglease.Code]int{}
	}
	l.typed[op][pe.Code]++
}

func (l *faultLoad) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

// live reports whether the server has lockID's lease (or shared hold)
// unexpired; ok is
// false when the look itself failed.
func (l *faultLoad) live(ctx context.Context, lockID string) (live, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int
	const unexpired = " WHERE lock_id = $1 AND expires_at_ms > floor(extract(epoch FROM clock_timestamp())*1000)"
	err := l.db().QueryRow(ctx, "SELECT (SELECT count(*) FROM "+l.lockTable+unexpired+
		") + (SELECT count(*) FROM "+l.lockTable+"_shared"+unexpired+")", lockID).Scan(&n)
	return n == 1, err == nil
}

// trustViolated is the trusted-implies-live check for one lease: trusted
// is the holder's own belief (a correct client: Err() == nil), asked
// before and after the server is read, so that a loss signalled between
// the two is not counted.
func (l *faultLoad) trustViolated(ctx context.Context, lockID string, trusted func() bool) bool {
	if !trusted() {
		return false
	}
	live, ok := l.live(ctx, lockID)
	return ok && !live && trusted()
}

// checkTrust records a violation of trustViolated for a correct client.
func (l *faultLoad) checkTrust(ctx context.Context, who, lockID string, trusted func() bool) {
	if !l.noTrust && l.trustViolated(ctx, lockID, trusted) {
		l.violate("%s trusts a lease the server no longer has", who)
	}
}

// run starts workers goroutines per Manager plus one long holder per
// Manager, until ctx ends; wait for them with the returned WaitGroup.
func (l *faultLoad) run(ctx context.Context, workers int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for mi, m := range l.ms {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					key := fmt.Sprintf("%s:k%d", l.prefix, (mi+w+i)%l.keys)
					if l.freshKeys {
						key = fmt.Sprintf("%s:n%d", l.prefix, l.next.Add(1))
					}
					l.cycle(ctx, m, key, i)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.longHolder(ctx, m, fmt.Sprintf("%s:long%d", l.prefix, mi))
		}()
	}
	return &wg
}

// granted records a grant reported to a caller, by its fence.
func (l *faultLoad) granted(key string, lk *Lock) {
	f := int64(lk.Fence())
	for {
		old, loaded := l.grants.LoadOrStore(key, f)
		if !loaded || old.(int64) >= f || l.grants.CompareAndSwap(key, old, f) {
			return
		}
	}
}

// lostGrants compares the grants reported to callers with the server's
// fence counters (table syncguard_fence_counters, by key_debug, the user
// key): a counter below a reported fence means a grant its caller was
// told of is not on the server (S5 and S1 broken). It returns one line
// per such key, and how many keys it checked.
func lostGrants(t *testing.T, ctx context.Context, pool *pgxpool.Pool, grants *sync.Map) (lost []string, n int) {
	t.Helper()
	have := map[string]int64{}
	rows, err := pool.Query(ctx, "SELECT key_debug, fence FROM syncguard_fence_counters")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var f int64
		if err := rows.Scan(&k, &f); err != nil {
			t.Fatal(err)
		}
		have[k] = f
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	grants.Range(func(k, v any) bool {
		n++
		if f := v.(int64); have[k.(string)] < f {
			lost = append(lost, fmt.Sprintf("%s: granted fence %d, server's counter %d", k, f, have[k.(string)]))
		}
		return true
	})
	return lost, n
}

// cycle is one acquire, fenced writes, optional extend, release, of one
// of the lock kinds in turn: an exclusive lease, an all-or-nothing set of
// two keys, a reader (Shared) and a permit (WithLimit(2)). Readers and
// permits write nothing: their checks are the typed outcomes and
// trusted ⇒ live.
func (l *faultLoad) cycle(ctx context.Context, m *Manager, key string, i int) {
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	var locks []*Lock
	var err error
	exclusive := true
	switch i % 4 {
	case 0:
		var lk *Lock
		if lk, err = m.Acquire(actx, key, WithTTL(l.ttl), WithAcquireTimeout(2*time.Second)); err == nil {
			locks = []*Lock{lk}
		}
	case 1:
		locks, err = m.AcquireAll(actx, []string{key, key + ":b"}, WithTTL(l.ttl), WithAcquireTimeout(2*time.Second))
	case 2:
		exclusive = false
		var lk *Lock
		if lk, err = m.Acquire(actx, key+":rw", Shared(), WithTTL(l.ttl), WithAcquireTimeout(2*time.Second)); err == nil {
			locks = []*Lock{lk}
		}
	default:
		exclusive = false
		var lk *Lock
		if lk, err = m.Acquire(actx, key+":sem", WithLimit(2), WithTTL(l.ttl), WithAcquireTimeout(2*time.Second)); err == nil {
			locks = []*Lock{lk}
		}
	}
	cancel()
	if ctx.Err() != nil {
		for _, lk := range locks {
			_ = lk.Release(context.Background())
		}
		return
	}
	l.record("acquire", err)
	if err != nil {
		time.Sleep(20 * time.Millisecond)
		return
	}
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, lk := range locks {
		if !exclusive {
			l.checkTrust(wctx, "a shared holder", lk.hd.ID, func() bool { return lk.Err() == nil })
			continue
		}
		l.granted(lk.Key(), lk)
		ok, werr := l.res.write(wctx, l.db(), lk.Key(), lk.Fence(), int64(i))
		if werr == nil && !ok && lk.Err() == nil {
			l.violate("fenced write of %s refused while its holder trusted the lease (fence %d)", lk.Key(), lk.Fence())
		}
		l.checkTrust(wctx, "a worker", lk.hd.ID, func() bool { return lk.Err() == nil })
	}
	time.Sleep(time.Duration(i%5) * 10 * time.Millisecond)
	for _, lk := range locks {
		if i%3 == 0 {
			err := lk.Extend(wctx)
			if !errors.Is(err, pglease.ErrLockLost) { // a lost lease answers its cause; not an outcome of the fault
				l.record("extend", err)
			}
		}
		err = lk.Release(wctx)
		if !errors.Is(err, pglease.ErrLockLost) {
			l.record("release", err)
		}
	}
}

// longHolder holds key with auto-extend through the fault, checking every
// 100 ms that the lease it trusts is live on the server, and takes it
// again when it is lost.
func (l *faultLoad) longHolder(ctx context.Context, m *Manager, key string) {
	for ctx.Err() == nil {
		lk, err := m.Acquire(ctx, key, WithTTL(l.ttl), WithAcquireTimeout(2*time.Second))
		if ctx.Err() != nil {
			if lk != nil {
				_ = lk.Release(context.Background())
			}
			return
		}
		l.record("acquire", err)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		l.granted(key, lk)
		for ctx.Err() == nil && lk.Err() == nil {
			l.checkTrust(ctx, "the long holder", lk.hd.ID, func() bool { return lk.Err() == nil })
			select {
			case <-ctx.Done():
			case <-lk.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := lk.Release(rctx); !errors.Is(err, pglease.ErrLockLost) {
			l.record("release", err)
		}
		cancel()
	}
}

// recovery waits (up to bound) for a successful acquire that started
// after since and returns how long after since it came.
func (l *faultLoad) recovery(t *testing.T, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if at := l.lastOK.Load(); at > since.UnixNano() {
			return time.Unix(0, at).Sub(since)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no acquire succeeded within %v after the fault healed", bound)
	return 0
}

// report fails the test on untyped errors or violations and logs the
// outcome counts.
func (l *faultLoad) report(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("outcomes: ok %v, typed errors %v", l.ok, l.typed)
	if len(l.untyped) > 0 {
		t.Errorf("%d operations failed without a code, e.g. %v", len(l.untyped), l.untyped[:min(3, len(l.untyped))])
	}
	if len(l.violations) > 0 {
		t.Errorf("%d violations, e.g. %v", len(l.violations), l.violations[:min(5, len(l.violations))])
	}
	if l.ok["acquire"] == 0 {
		t.Error("no acquire succeeded: the load exercised nothing")
	}
}

// brokenHolder is the negative control of the trusted-implies-live check:
// a client that takes a lease and trusts it until it releases, ignoring
// the loss signal. The fault must make the check catch it.
func (l *faultLoad) brokenHolder(ctx context.Context, m *Manager, key string) (stop func() (caught bool), err error) {
	lk, err := m.Acquire(ctx, key, WithTTL(l.ttl))
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	var caught atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			if l.trustViolated(cctx, lk.hd.ID, func() bool { return true }) {
				caught.Store(true)
				return
			}
			select {
			case <-cctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() bool {
		cancel()
		<-done
		_ = lk.Release(context.Background())
		return caught.Load()
	}, nil
}

// loadCounts is a copy of a faultLoad's outcome counts.
type loadCounts struct {
	ok      map[string]int
	typed   map[string]map[pglease.Code]int
	untyped int
}

// snapshot copies the outcome counts so far.
func (l *faultLoad) snapshot() loadCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := loadCounts{ok: map[string]int{}, typed: map[string]map[pglease.Code]int{}, untyped: len(l.untyped)}
	for op, n := range l.ok {
		c.ok[op] = n
	}
	for op, m := range l.typed {
		c.typed[op] = map[pglease.Code]int{}
		for code, n := range m {
			c.typed[op][code] = n
		}
	}
	return c
}

// since formats the outcomes counted after the snapshot b.
func (l *faultLoad) since(b loadCounts) string {
	now := l.snapshot()
	ok := map[string]int{}
	for op, n := range now.ok {
		if d := n - b.ok[op]; d > 0 {
			ok[op] = d
		}
	}
	typed := map[string]map[pglease.Code]int{}
	for op, m := range now.typed {
		for code, n := range m {
			if d := n - b.typed[op][code]; d > 0 {
				if typed[op] == nil {
					typed[op] = map[pglease.Code]int{}
				}
				typed[op][code] = d
			}
		}
	}
	return fmt.Sprintf("ok %v, typed errors %v, untyped %d", ok, typed, now.untyped-b.untyped)
}

// db is the pool of the load's resource writes and lock-table reads:
// writer once set, else direct.
func (l *faultLoad) db() *pgxpool.Pool {
	if p := l.writer.Load(); p != nil {
		return p
	}
	return l.direct
}
