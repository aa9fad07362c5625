package manager

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
)

// holdChildEnv makes the test binary a holder process (holdChild).
const holdChildEnv = "PGLEASE_MANAGER_HOLD_CHILD"

// holdChild takes one key (argument lines on stdin: "KEY TTL_MS") without
// auto-extend, prints "held <expires_at ms> <pid>", and then keeps it
// until stdin ends, when it releases it and exits; a test that wants it to
// die holding the lease kills it.
func holdChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "hold child:", err); return 1 }
	pool, err := childPool(ctx)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	m, err := newManager("child", pool, false, Config{}, func(*Manager) {})
	if err != nil {
		return fail(err)
	}
	defer m.Close(ctx)
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return fail(fmt.Errorf("no command"))
	}
	var key string
	var ttlMs int64
	if _, err := fmt.Sscanf(in.Text(), "%s %d", &key, &ttlMs); err != nil {
		return fail(err)
	}
	lk, ok, err := m.TryAcquire(ctx, key, WithTTL(time.Duration(ttlMs)*time.Millisecond), WithoutAutoExtend())
	if err != nil || !ok {
		return fail(fmt.Errorf("hold: %v %v", ok, err))
	}
	fmt.Println("held", lk.ExpiresAt().UnixMilli(), os.Getpid())
	for in.Scan() {
	}
	if err := lk.Release(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// holder is a holdChild process holding a key.
type holder struct {
	cmd       *exec.Cmd
	stdin     interface{ Close() error }
	expiresAt int64 // the lease's expires_at, server ms
	pid       int
}

// startHolder starts a holdChild process on b's schema that takes key for
// ttl (without auto-extend) and returns once it holds it.
func startHolder(t testing.TB, b *bundle, key string, ttl time.Duration) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdChildEnv+"=1", childURLEnv+"="+pgtest.URL(t), childSchemaEnv+"="+b.schema)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // a no-op after Wait
		_ = cmd.Wait()
	})
	if _, err := fmt.Fprintln(in, key, ttl.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	h := &holder{cmd: cmd, stdin: in}
	if !lines.Scan() {
		_ = cmd.Wait()
		t.Fatalf("hold child ended early: %s", stderr.String())
	}
	if _, err := fmt.Sscanf(lines.Text(), "held %d %d", &h.expiresAt, &h.pid); err != nil {
		t.Fatalf("hold child: %q: %v", lines.Text(), err)
	}
	return h
}

// kill ends the holder with SIGKILL: its lease stays until it expires.
func (h *holder) kill(t testing.TB) {
	t.Helper()
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait() // "signal: killed"
}

// release makes the holder release its lease and exit.
func (h *holder) release(t testing.TB) {
	t.Helper()
	h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("hold child: %v", err)
	}
}

// takeOver runs one takeover: a holder process takes key for ttl and is
// killed once this process's waiter found the key held; it returns how
// long after the key could first be taken over (the dead holder's
// expires_at + the tolerance, server clock) the waiter was granted
// (server clock), and how long after the kill (local clock).
func takeOver(t testing.TB, b *bundle, key string, ttl time.Duration) (late, sinceKill time.Duration) {
	t.Helper()
	ctx := ctxT(t)
	h := startHolder(t, b, key, ttl)
	drain(&b.sig.Retrying)
	type result struct {
		lk  *Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, key)
		got <- result{lk, err}
	}()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == key })
	h.kill(t)
	killed := time.Now()
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	sinceKill = time.Since(killed)
	late = r.lk.AcquiredAt().Sub(time.UnixMilli(h.expiresAt).Add(keys.TimeTolerance))
	if err := r.lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return late, sinceKill
}

// TestTakeoverAtHolderExpiry: a holder in another process dies (SIGKILL)
// while this process waits for its key. Nothing notifies the waiter; its
// "locked" answer told it when the dead holder's lease can be taken over
// (expires_at + tolerance, server clock), and it tries again then rather
// than at its next poll, which pollingTooSlow puts 10-20 s away: the grant
// comes within a few tens of ms of the legal moment (bound: 3 s, for a
// loaded machine; polling alone would be at least 7 s late).
func TestTakeoverAtHolderExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: Config{Retry: pollingTooSlow}})
	late, sinceKill := takeOver(t, b, "takeover:dead-holder", 2*time.Second)
	t.Logf("granted %v after the legal moment (%v after the kill)", late, sinceKill)
	if late < 0 {
		t.Fatalf("granted %v before the dead holder's lease could be taken over", -late)
	}
	if late > 3*time.Second {
		t.Fatalf("granted %v after the dead holder's lease could be taken over: the waiter waited for its next poll", late)
	}
}

// TestAcquireTimeoutNamesHolder: a waiter that gives up says who held the
// key at its last attempt (the holder identity the holder's Store
// recorded: program[pid]@host), and never the key.
func TestAcquireTimeoutNamesHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const key = "takeover:named-holder"
	h := startHolder(t, b, key, 30*time.Second)
	_, err := b.m.Acquire(ctxT(t), key, WithAcquireTimeout(time.Second))
	if pglease.CodeOf(err) != pglease.CodeAcquisitionTimeout {
		t.Fatalf("Acquire = %v, want AcquisitionTimeout", err)
	}
	if want := "[" + strconv.Itoa(h.pid) + "]@"; !strings.Contains(err.Error(), want) {
		t.Fatalf("timeout error %q does not name the holder (%s)", err, want)
	}
	if strings.Contains(err.Error(), key) {
		t.Fatalf("timeout error %q shows the key", err)
	}
	t.Log(err)
	h.release(t)
}

// BenchmarkTakeoverAfterHolderDied measures takeovers of a key whose holder
// process was killed while a waiter (default retry policy) waited:
// late-p50/max-ms is the grant's delay after the legal moment (the dead
// holder's expires_at + 1 s, server clock), kill-p50/max-ms the time from
// the kill to the grant (local clock), over b.N takeovers of a 2 s lease.
//
//	go test -run '^$' -bench BenchmarkTakeoverAfterHolderDied -benchtime 20x ./manager/
func BenchmarkTakeoverAfterHolderDied(b *testing.B) {
	bd := setup(b, setupOpts{})
	var late, kill []time.Duration
	for i := 0; b.Loop(); i++ {
		l, k := takeOver(b, bd, "takeover:bench:"+strconv.Itoa(i), 2*time.Second)
		late, kill = append(late, l), append(kill, k)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	slices.Sort(late)
	slices.Sort(kill)
	b.ReportMetric(ms(late[len(late)/2]), "late-p50-ms")
	b.ReportMetric(ms(late[len(late)-1]), "late-max-ms")
	b.ReportMetric(ms(kill[len(kill)/2]), "kill-p50-ms")
	b.ReportMetric(ms(kill[len(kill)-1]), "kill-max-ms")
	b.ReportMetric(0, "ns/op")
}
