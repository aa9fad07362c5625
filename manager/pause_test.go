package manager

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

const pauseChildEnv = "PGLEASE_MANAGER_PAUSE_CHILD"

// pauseTTL is the child's lease TTL: its trust window is pauseTTL minus
// the default margin (TTL/10), 1.8 s.
const pauseTTL = 2 * time.Second

// pauseTimerLate is how long the child Manager's timers wait after a stop
// before they act (testHooks.timerFired).
const pauseTimerLate = 500 * time.Millisecond

// pauseGap is how long a gap between two iterations of the child's busy
// loop must be to count as "the process was stopped": well above the trust
// window and any scheduling delay, below the parent's stop (≥ 4 s).
const pauseGap = 3 * time.Second

// pauseChild is the holder of TestErrAfterStop: for each "hold KEY" line
// on stdin it takes KEY with TTL pauseTTL, prints "held", then busy-loops
// on Lock.Err until it sees that it was stopped (a gap of pauseGap in its
// own monotonic clock) and prints the answer of the first Err call made
// after the stop: "after-stop nil" (the bug) or "after-stop <code>".
func pauseChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "pause child:", err); return 1 }
	pool, err := childPool(ctx)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	// A Manager timer (the loss timer, the loop's heartbeat wake-up) that
	// fires over a second late, i.e. after the stop, acts only
	// pauseTimerLate later: after SIGCONT the runtime runs timers within
	// microseconds to a few milliseconds (an Err in that gap answered nil
	// in 10 of 12 trials); the hook makes the gap certain, so
	// that the test fails every time Err relies on a timer.
	afterStop := func(late time.Duration) {
		if late > time.Second {
			time.Sleep(pauseTimerLate)
		}
	}
	m, err := newManager("child", pool, false, Config{}, func(m *Manager) { m.k.Test.TimerFired = afterStop })
	if err != nil {
		return fail(err)
	}
	defer m.Close(ctx)
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		key, ok := strings.CutPrefix(in.Text(), "hold ")
		if !ok {
			return fail(fmt.Errorf("unknown command %q", in.Text()))
		}
		lk, err := m.Acquire(ctx, key, WithTTL(pauseTTL))
		if err != nil {
			return fail(err)
		}
		// The loop's clock starts before "held" is printed: the parent may
		// stop this process right after the line, before the loop runs.
		start := time.Now()
		fmt.Println("held")
		fmt.Println(firstErrAfterStop(lk, start))
		_ = lk.Release(ctx) // ErrLockLost; frees nothing the parent holds
	}
	return 0
}

// firstErrAfterStop busy-loops on lk.Err until it sees that the process
// was stopped (a gap of pauseGap on the monotonic clock), and describes the
// answer of the first Err call that started after the stop. start is a
// time taken before the parent was told the lock is held.
func firstErrAfterStop(lk *Lock, start time.Time) string {
	judgeNext := false
	prev := start
	for {
		t1 := time.Now()
		err := lk.Err()
		t2 := time.Now()
		if judgeNext || t1.Sub(prev) >= pauseGap {
			// This call started after the stop ended.
			if err == nil {
				return "after-stop nil"
			}
			return "after-stop " + pglease.CodeOf(err).String() + " (" + err.Error() + ")"
		}
		if t2.Sub(t1) >= pauseGap {
			// Stopped during the call: its answer may predate the stop;
			// the next call is the first one after it.
			judgeNext = true
			continue
		}
		if err != nil {
			return "lost-before-stop " + err.Error()
		}
		prev = t2
	}
}

// TestErrAfterStop: a holder whose process was stopped
// (SIGSTOP) longer than its trust window, while another process took the
// key, must not read "held" from Lock.Err after it resumes, not even for
// the few microseconds before its loss timer fires: Err reads the
// monotonic clock itself. The holder busy-loops on Err in a separate
// process; the parent stops it for 4 s (TTL 2 s), takes the key, and
// resumes it. Three trials, stopped at different points of the heartbeat
// cycle.
func TestErrAfterStop(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pauseChildEnv+"=1", childURLEnv+"="+pgtest.URL(t), childSchemaEnv+"="+b.schema)
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
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill() // a no-op after Wait; stops the child on t.Fatal
	}()
	lines := bufio.NewScanner(out)
	next := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("child ended early: %s", stderr.String())
		}
		return lines.Text()
	}
	if l := next(); l != "ready" {
		t.Fatalf("child did not start: %q %s", l, stderr.String())
	}
	for i, delay := range []time.Duration{0, 300 * time.Millisecond, 700 * time.Millisecond} {
		key := fmt.Sprintf("pause:%d", i)
		if _, err := fmt.Fprintln(in, "hold", key); err != nil {
			t.Fatal(err)
		}
		if l := next(); l != "held" {
			t.Fatalf("child: %q %s", l, stderr.String())
		}
		time.Sleep(delay) // somewhere in the heartbeat cycle (extends at TTL/3)
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		// Take the key while the child is stopped: possible from the
		// server's expiry + 1 s, at most 3 s after the stop.
		var lk *Lock
		for lk == nil {
			l, ok, err := b.m.TryAcquire(ctx, key, WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				lk = l
				break
			}
			if time.Since(stopped) > 30*time.Second {
				t.Fatal("the stopped holder's lease never expired")
			}
			time.Sleep(100 * time.Millisecond)
		}
		if d := 4*time.Second - time.Since(stopped); d > 0 {
			time.Sleep(d)
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		got := next()
		t.Logf("trial %d (stopped %v after the grant, for %v): %s", i, delay, time.Since(stopped).Round(time.Millisecond), got)
		if !strings.HasPrefix(got, "after-stop "+pglease.CodeLockLost.String()+" ") {
			t.Errorf("trial %d: first Err after the stop answered %q while this process held the key; want %s", i, got, pglease.CodeLockLost)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v: %s", err, stderr.String())
	}
}
