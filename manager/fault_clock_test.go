package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// Server clock steps: the PostgreSQL server runs under libfaketime
// (Debian's faketime package) with its offset read from a file on every
// clock read, so a test steps the server's wall clock forward and back
// while sessions live, as an NTP step or a VM's clock resync would. Only
// the wall clock moves (FAKETIME_DONT_FAKE_MONOTONIC): leases are timed on
// the server's wall clock (clock_timestamp()), fences are counters.

// libfaketimePaths are where Debian and other distributions put
// libfaketime.
var libfaketimePaths = []string{
	"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/faketime/libfaketime.so.1",
	"/usr/local/lib/faketime/libfaketime.so.1",
}

// clockServer is a server whose wall clock the test steps.
type clockServer struct {
	cl   *pgtest.Cluster
	pool *pgxpool.Pool // superuser, default tables
	file string        // libfaketime's offset file
}

// startClockServer starts a server of the test's own under libfaketime,
// at offset 0.
func startClockServer(t *testing.T) *clockServer {
	t.Helper()
	lib := ""
	for _, p := range libfaketimePaths {
		if _, err := os.Stat(p); err == nil {
			lib = p
			break
		}
	}
	if lib == "" {
		needFacility(t, "libfaketime is not installed (Debian/Ubuntu: apt-get install faketime): cannot step the server's clock")
	}
	// The server runs unprivileged: it must be able to read the file, and
	// t.TempDir's parent is private.
	dir, err := os.MkdirTemp("", "pglease-clock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	file := filepath.Join(dir, "offset")
	if err := os.WriteFile(file, []byte("+0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cl, pool := ownServer(t, pgtest.Options{Env: []string{
		"LD_PRELOAD=" + lib,
		"FAKETIME_TIMESTAMP_FILE=" + file,
		"FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
		"NO_FAKE_STAT=1", // file times under a semaphore a killed backend would keep (soak/driver/facility.go)
	}})
	s := &clockServer{cl: cl, pool: pool, file: file}
	// Check the server runs on the shifted clock: a missing preload would
	// make every step below a no-op and the test pass for nothing.
	s.step(t, time.Hour)
	if d := s.offset(t); d < 50*time.Minute {
		needFacility(t, fmt.Sprintf("libfaketime did not shift the server's clock (offset %v after a 1 h step)", d))
	}
	s.step(t, 0)
	return s
}

// step sets the server's wall clock to real time + d (every backend reads
// the file at each clock read, so the step is immediate).
func (s *clockServer) step(t *testing.T, d time.Duration) {
	t.Helper()
	tmp := s.file + ".tmp"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%+d\n", int64(d/time.Second)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.file); err != nil {
		t.Fatal(err)
	}
}

// offset returns the server's clock minus this process's.
func (s *clockServer) offset(t *testing.T) time.Duration {
	t.Helper()
	var ms int64
	before := time.Now()
	if err := s.pool.QueryRow(context.Background(),
		"SELECT floor(extract(epoch FROM clock_timestamp())*1000)::bigint").Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(ms).Sub(before)
}

// TestServerClockStepForward: the server's clock steps forward by more
// than the lease's TTL while a Manager holds it. To the server the lease
// has expired, so it grants the key to a second Manager while the first
// still trusts its lease (its trust window runs on its own clock): a
// forward step beyond the tolerance plus the loss margin breaks
// exclusivity in the holders' time, as docs/guarantees.md says. The fence
// still holds: the new holder's fence is higher, its claim of the
// resource shuts the old holder out, the old holder's fenced write is
// refused, and the old holder hears of the loss at its next extend. The
// negative control, a client that writes without the fence's condition,
// lands its stale write, and the log check reports it.
func TestServerClockStepForward(t *testing.T) {
	t.Parallel()
	s := startClockServer(t)
	ctx := ctxT(t)
	res := newFencedResource(t, ctx, s.pool)
	a := faultManager(t, serverPool(t, s.cl.URL, 4), Config{})
	b := faultManager(t, serverPool(t, s.cl.URL, 4), Config{})

	const ttl = 6 * time.Second
	lkA, err := a.Acquire(ctx, "clock:fwd", WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := res.write(ctx, s.pool, "r", lkA.Fence(), 1); !ok || err != nil {
		t.Fatalf("holder A's first write: %v %v", ok, err)
	}

	s.step(t, time.Minute)
	lkB, ok, err := b.TryAcquire(ctx, "clock:fwd", WithTTL(ttl))
	if err != nil || !ok {
		t.Fatalf("after a 1 min forward step, the server did not grant the key again: %v %v", ok, err)
	}
	aTrusted := lkA.Err() == nil // usually: A's window ends on A's clock, ~6 s after its grant
	t.Logf("forward step of 1 min: the key was granted again while the old holder trusted its lease: %v", aTrusted)
	if lkB.Fence() <= lkA.Fence() {
		t.Fatalf("fence %d granted after %d", lkB.Fence(), lkA.Fence())
	}
	if ok, err := res.write(ctx, s.pool, "r", lkB.Fence(), 2); !ok || err != nil {
		t.Fatalf("holder B's write: %v %v", ok, err)
	}
	// A, whether or not it trusts its lease yet, writes: the fence refuses it.
	if ok, err := res.write(ctx, s.pool, "r", lkA.Fence(), 3); ok || err != nil {
		t.Fatalf("the old holder's fenced write after the step: accepted=%v err=%v, want refused", ok, err)
	}
	// A hears of the loss at its next extend (TTL/3), not at its window's end.
	select {
	case <-lkA.Done():
	case <-time.After(waitTimeout()):
		t.Fatal("the old holder was not told of its loss")
	}
	if !errors.Is(lkA.Err(), pglease.ErrLockLost) {
		t.Fatalf("old holder's cause = %v, want ErrLockLost", lkA.Err())
	}
	if v, n := fencedLogViolations(t, ctx, s.pool); len(v) != 0 || n != 2 {
		t.Fatalf("resource log after fenced writers: %d writes, violations %v", n, v)
	}
	// The step back to true time: the new holder's lease now has a minute
	// more on the server; it is still its, and its release frees the key.
	s.step(t, 0)
	if err := lkB.Extend(ctx); err != nil {
		t.Fatalf("new holder's extend after the clock stepped back: %v", err)
	}
	if err := lkB.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Negative control: a client that ignores the fence writes after the
	// new holder; the same check must catch it.
	if err := writeIgnoringFence(ctx, s.pool, "r", lkA.Fence(), 4); err != nil {
		t.Fatal(err)
	}
	v, _ := fencedLogViolations(t, ctx, s.pool)
	if len(v) != 1 {
		t.Fatalf("negative control: the check found %d violations after a stale unfenced write, want 1: %v", len(v), v)
	}
	t.Logf("negative control caught: %s", v[0])
}

// TestServerClockStepBack: the server's clock steps back by a minute. A
// lease granted before the step now ends a minute later on the server:
// exclusivity holds (nobody else gets the key while the server counts it
// live), only liveness suffers — an abandoned lease (its holder crashed:
// here a pg.Store grant nobody extends or releases) keeps its key for the
// step's length too. Fences still increase, across the step and back, and
// a live holder's lease is extended and released normally. The negative
// control: a client that wrote with an older fence than the key's newest
// grant would be caught by the same log check.
func TestServerClockStepBack(t *testing.T) {
	t.Parallel()
	s := startClockServer(t)
	ctx := ctxT(t)
	res := newFencedResource(t, ctx, s.pool)
	st, err := pg.New(s.pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m := faultManager(t, serverPool(t, s.cl.URL, 4), Config{})

	// An abandoned grant of 1 s, and a held lease of 2 s (auto-extended).
	dead, err := st.Acquire(ctx, "clock:back:dead", time.Second)
	if err != nil || !dead.OK {
		t.Fatal(dead, err)
	}
	held, err := m.Acquire(ctx, "clock:back:held", WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := res.write(ctx, s.pool, "r", held.Fence(), 1); !ok || err != nil {
		t.Fatal(ok, err)
	}
	s.step(t, -time.Minute)
	// Well past the abandoned grant's expiry + tolerance in real time, the
	// server still counts it live: the key stays held (no early takeover).
	time.Sleep(2500 * time.Millisecond)
	if _, ok, err := m.TryAcquire(ctx, "clock:back:dead"); err != nil || ok {
		t.Fatalf("after a 1 min backward step, the abandoned key was granted 2.5 s after its 1 s lease: %v %v", ok, err)
	}
	// The live holder kept its lease through the step (extends use the
	// server's now, so its expiry moved back with the clock: it is
	// extended, never revived).
	if err := held.Err(); err != nil {
		t.Fatalf("held lease lost across a backward step: %v", err)
	}
	if err := held.Extend(ctx); err != nil {
		t.Fatalf("extend after a backward step: %v", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, ok, err := m.TryAcquire(ctx, "clock:back:held")
	if err != nil || !ok {
		t.Fatalf("released key not granted: %v %v", ok, err)
	}
	if next.Fence() <= held.Fence() {
		t.Fatalf("fence %d after %d across a backward step", next.Fence(), held.Fence())
	}
	if ok, err := res.write(ctx, s.pool, "r", next.Fence(), 2); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := res.write(ctx, s.pool, "r", held.Fence(), 3); ok || err != nil {
		t.Fatalf("the previous grant's fenced write: accepted=%v err=%v, want refused", ok, err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Back to true time: the abandoned key frees within its TTL +
	// tolerance (it was granted with 1 s on the true clock).
	s.step(t, 0)
	lk, err := m.Acquire(ctx, "clock:back:dead", WithAcquireTimeout(waitTimeout()))
	if err != nil {
		t.Fatalf("abandoned key not granted once the clock came back: %v", err)
	}
	if lk.Fence() <= dead.Fence {
		t.Fatalf("fence %d after %d", lk.Fence(), dead.Fence)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, n := fencedLogViolations(t, ctx, s.pool); len(v) != 0 || n != 2 {
		t.Fatalf("resource log: %d writes, violations %v", n, v)
	}
	// Negative control.
	if err := writeIgnoringFence(ctx, s.pool, "r", held.Fence(), 4); err != nil {
		t.Fatal(err)
	}
	if v, _ := fencedLogViolations(t, ctx, s.pool); len(v) != 1 {
		t.Fatalf("negative control: %d violations after a stale unfenced write, want 1: %v", len(v), v)
	}
}
