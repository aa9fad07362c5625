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
var pollingTooSlow = retry.Policy{Kind: retry.Fixed, Base: 20 * time.Second}

// pingPong takes hotKey rounds times, each time doing a fenced increment
// of the shared counter, and returns the fences it got and how many times
// a notification woke it.
func pingPong(ctx context.Context, m *Manager, work *pgxpool.Pool, sig *signals, rounds int) (fences []int64, woken int, err error) {
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
		case <-sig.woken.ch:
			woken++
		default:
			return fences, woken, nil
		}
	}
}

func childMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	cfg, err := pgxpool.ParseConfig(os.Getenv(childURLEnv))
	if err != nil {
		return fail(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(childSchemaEnv)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	sig := &signals{}
	sig.init()
	m, err := newManager("child", pool, false, Config{Retry: pollingTooSlow}, func(m *Manager) { m.sig = sig })
	if err != nil {
		return fail(err)
	}
	defer m.Close(ctx)
	<-sig.listening.ch
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
	return 0
}

// TestTwoProcessesHotKey: this test binary and a re-executed copy of it
// pass one hot key back and forth, each with a retry policy that polls
// only every 10–20 s. Finishing well within 10 s proves every hand-over
// across processes was a LISTEN/NOTIFY wake-up; the fenced counter proves
// no overlap and no lost update; the fences are all distinct.
func TestTwoProcessesHotKey(t *testing.T) {
	t.Parallel()
	const rounds = 15
	b := setup(t, setupOpts{cfg: Config{Retry: pollingTooSlow}})
	ctx := ctxT(t)
	wait(t, &b.sig.listening)
	if _, err := b.pool.Exec(ctx, "CREATE TABLE pingpong (value bigint NOT NULL, fence bigint NOT NULL); INSERT INTO pingpong VALUES (0, 0)"); err != nil {
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
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("child did not start: %s", stderr.String())
	}
	start := time.Now()
	fences, woken, err := pingPong(ctx, b.m, b.pool, b.sig, rounds)
	if err != nil {
		t.Fatal(err)
	}
	var childFences []int64
	childWoken := -1
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) == 2 && f[0] == "fence" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			childFences = append(childFences, n)
		}
		if len(f) == 2 && f[0] == "woken" {
			childWoken, _ = strconv.Atoi(f[1])
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v: %s", err, stderr.String())
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
	if woken+childWoken == 0 {
		t.Fatal("no notification wake-up at all")
	}
}
