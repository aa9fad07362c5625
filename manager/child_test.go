package manager

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/retry"
)

// The two-process test re-executes the test binary with childEnv set;
// TestMain then runs childMain instead of the tests.
const (
	childEnv       = "PGLEASE_MANAGER_CHILD"
	childURLEnv    = "PGLEASE_MANAGER_CHILD_URL"
	childSchemaEnv = "PGLEASE_MANAGER_CHILD_SCHEMA"
	childRoundsEnv = "PGLEASE_MANAGER_CHILD_ROUNDS"
	hotKey         = "hot:pingpong"
)

// pollingTooSlow makes polling useless within the test's time bound: a
// waiter that misses a wake-up waits 10–20 s.
var pollingTooSlow = retry.Policy{Multiplier: 1, Base: 20 * time.Second}

// pingPong takes hotKey rounds times, each time doing a fenced increment
// of the shared counter, and returns the fences it got and how many times
// a notification woke it.
func pingPong(ctx context.Context, m *Manager, work *pgxpool.Pool, sig *kernel.Signals, rounds int) (fences []int64, woken int, err error) {
	for range rounds {
		lk, err := m.Acquire(ctx, hotKey, WithAcquireTimeout(30*time.Second))
		if err != nil {
			return nil, 0, err
		}
		tag, err := work.Exec(ctx, "UPDATE pingpong SET value = value + 1, fence = $1 WHERE fence < $1", int64(lk.Fence()))
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("fenced write rejected")
		}
		if rerr := lk.Release(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			return nil, 0, err
		}
		fences = append(fences, int64(lk.Fence()))
	}
	for {
		select {
		case <-sig.Woken.Ch:
			woken++
		default:
			return fences, woken, nil
		}
	}
}

// childPool is the pool of a child test process: the parent's database
// (childURLEnv) with the test's schema (childSchemaEnv) on its search_path.
func childPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv(childURLEnv))
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(childSchemaEnv)
	return pgxpool.NewWithConfig(ctx, cfg)
}

func childMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	pool, err := childPool(ctx)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	sig := &kernel.Signals{}
	sig.Init()
	m, err := newManager("child", pool, false, Config{Retry: pollingTooSlow}, func(m *Manager) { m.k.Sig = sig })
	if err != nil {
		return fail(err)
	}
	defer m.Close(ctx)
	<-sig.Listening.Ch
	fmt.Println("ready")
	rounds, _ := strconv.Atoi(os.Getenv(childRoundsEnv))
	fences, woken, err := pingPong(ctx, m, pool, sig, rounds)
	if err != nil {
		return fail(err)
	}
	for _, f := range fences {
		fmt.Println("fence", f)
	}
	fmt.Println("woken", woken)
	// Then the parent's commands, one per line on stdin (see
	// TestTwoProcessesHotKey): "park" waits for hotKey until a notification
	// wakes the waiter; "hold" takes hotKey and "release" releases it.
	var held *Lock
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "park":
			drain(&sig.Woken)
			drain(&sig.Retrying)
			type res struct {
				lk  *Lock
				err error
			}
			got := make(chan res, 1)
			go func() {
				lk, err := m.Acquire(ctx, hotKey, WithAcquireTimeout(30*time.Second))
				got <- res{lk, err}
			}()
			for k := range sig.Retrying.Ch { // contended; next poll in 10–20 s
				if k == hotKey {
					break
				}
			}
			fmt.Println("parked")
			start := time.Now()
			r := <-got
			if r.err != nil {
				return fail(r.err)
			}
			woken := 0
			for len(sig.Woken.Ch) > 0 {
				if <-sig.Woken.Ch == hotKey {
					woken++
				}
			}
			fmt.Println("got", time.Since(start).Milliseconds(), woken)
			if err := r.lk.Release(ctx); err != nil {
				return fail(err)
			}
			fmt.Println("released")
		case "hold":
			lk, ok, err := m.TryAcquire(ctx, hotKey)
			if err != nil || !ok {
				return fail(fmt.Errorf("hold: %v %v", ok, err))
			}
			held = lk
			fmt.Println("held")
		case "release":
			if err := held.Release(ctx); err != nil {
				return fail(err)
			}
			fmt.Println("released")
		}
	}
	return 0
}

// // TestTwoProcessesHotKey: this test binary and a re-executed copy of it
// pass one hot key back and forth, each with a retry policy that polls
// only every 10–20 s.
//
// First a free-running ping-pong: finishing well within 10 s proves that no
// hand-over waited for polling; the fenced counter proves no overlap and no
// lost update; the fences are all distinct. A hand-over there is either a
// notification wake-up or an attempt that was already in flight, queued in
// the database behind the holder's release (seen under CPU load: then no
// wake-up is needed at all), so the ping-pong cannot prove that
// notifications work.
//
// Then two hand-overs that only a notification can make: the waiter's
// attempt came back "locked" and its next poll is 10–20 s away when the
// holder in the other process releases. Once each way: parent to child and
// child to parent.
func TestTwoProcessesHotKey(t *testing.T) {
	t.Parallel()
	const rounds = 15
	b := setup(t, setupOpts{cfg: Config{Retry: pollingTooSlow}})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	if _, err := b.admin.Exec(ctx, "CREATE TABLE pingpong (value bigint NOT NULL, fence bigint NOT NULL); INSERT INTO pingpong VALUES (0, 0); GRANT SELECT, UPDATE ON pingpong TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childURLEnv+"="+pgtest.URL(t),
		childSchemaEnv+"="+b.schema, childRoundsEnv+"="+strconv.Itoa(rounds))
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
	defer cmd.Process.Kill() // a no-op after Wait; stops the child on t.Fatal
	lines := bufio.NewScanner(out)
	// next returns the child's next line.
	next := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("child ended early: %s", stderr.String())
		}
		return lines.Text()
	}
	send := func(command string) {
		t.Helper()
		if _, err := fmt.Fprintln(in, command); err != nil {
			t.Fatal(err)
		}
	}
	if l := next(); l != "ready" {
		t.Fatalf("child did not start: %q %s", l, stderr.String())
	}
	start := time.Now()
	fences, woken, err := pingPong(ctx, b.m, b.pool, b.sig, rounds)
	if err != nil {
		t.Fatal(err)
	}
	var childFences []int64
	childWoken := -1
	for childWoken < 0 {
		f := strings.Fields(next())
		if len(f) == 2 && f[0] == "fence" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			childFences = append(childFences, n)
		}
		if len(f) == 2 && f[0] == "woken" {
			childWoken, _ = strconv.Atoi(f[1])
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d+%d rounds in %v; wake-ups: parent %d, child %d", len(fences), len(childFences), elapsed, woken, childWoken)
	if elapsed > 9*time.Second {
		t.Fatalf("took %v: some hand-over waited for polling", elapsed)
	}
	if len(childFences) != rounds {
		t.Fatalf("child did %d rounds", len(childFences))
	}
	seen := map[int64]bool{}
	for _, f := range append(fences, childFences...) {
		if seen[f] {
			t.Fatalf("fence %d granted twice", f)
		}
		seen[f] = true
	}
	var total int64
	if err := b.pool.QueryRow(ctx, "SELECT value FROM pingpong").Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 2*rounds {
		t.Fatalf("counter %d, want %d", total, 2*rounds)
	}

	// Parent to child: the child parks behind our lock, we release.
	lk, err := b.m.Acquire(ctx, hotKey)
	if err != nil {
		t.Fatal(err)
	}
	send("park")
	if l := next(); l != "parked" {
		t.Fatalf("child: %q", l)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var ms, childWake int
	if _, err := fmt.Sscanf(next(), "got %d %d", &ms, &childWake); err != nil {
		t.Fatal(err)
	}
	if next() != "released" {
		t.Fatal("child did not release")
	}
	t.Logf("parent → child hand-over: %d ms, %d wake-up(s)", ms, childWake)
	if childWake == 0 || ms > 9000 {
		t.Errorf("parent → child: %d ms, %d wake-ups: no notification woke the child", ms, childWake)
	}

	// Child to parent.
	send("hold")
	if l := next(); l != "held" {
		t.Fatalf("child: %q", l)
	}
	drain(&b.sig.Woken)
	drain(&b.sig.Retrying)
	got := make(chan error, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, hotKey, WithAcquireTimeout(30*time.Second))
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, &b.sig.Retrying, func(k string) bool { return k == hotKey })
	send("release")
	hstart := time.Now()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	took := time.Since(hstart)
	if next() != "released" {
		t.Fatal("child did not release")
	}
	parentWake := 0
	for len(b.sig.Woken.Ch) > 0 {
		if <-b.sig.Woken.Ch == hotKey {
			parentWake++
		}
	}
	t.Logf("child → parent hand-over: %v, %d wake-up(s)", took, parentWake)
	if parentWake == 0 || took > 9*time.Second {
		t.Errorf("child → parent: %v, %d wake-ups: no notification woke the parent", took, parentWake)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v: %s", err, stderr.String())
	}
}
