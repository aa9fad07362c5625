package pgtest_test

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

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
)

// backendPIDs connects n clients through url at once and returns the
// backend pid each one's first statement ran on.
func backendPIDs(t *testing.T, url string, n int) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pids := make([]int32, n)
	for i := range pids {
		c, err := pgx.Connect(ctx, url+"&default_query_exec_mode=exec")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			t.Fatal(err)
		}
	}
	return pids
}

func uidOf(t *testing.T, pid int) string {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	t.Fatal("no Uid line")
	return ""
}

// TestPgBouncerHarness: the bouncer runs unprivileged, pools in the mode
// asked for (transaction mode shares one server connection between two
// clients, session mode does not), and Stop ends it and removes its
// directory.
func TestPgBouncerHarness(t *testing.T) {
	t.Parallel()
	// Transaction mode with one server connection must share it; session
	// mode with two must not (with one, the second client would wait).
	for mode, size := range map[string]int{pgtest.PoolTransaction: 1, pgtest.PoolSession: 2} {
		t.Run(mode, func(t *testing.T) {
			b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: mode, PoolSize: size})
			if os.Geteuid() == 0 && uidOf(t, b.PID()) == "0" {
				t.Fatal("pgbouncer runs as root")
			}
			pids := backendPIDs(t, b.URL, 2)
			shared := pids[0] == pids[1]
			if shared != (mode == pgtest.PoolTransaction) {
				t.Fatalf("%s mode: two clients ran on backends %v; want shared=%v", mode, pids, mode == pgtest.PoolTransaction)
			}
			pid, dir := b.PID(), b.Dir
			b.Stop()
			if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
				t.Fatalf("pgbouncer %d still running after Stop (kill 0: %v)", pid, err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("bouncer dir %s left after Stop: %v", dir, err)
			}
		})
	}
}

const childEnv = "PGTEST_BOUNCER_CHILD"

// TestPgBouncerGoneWhenParentKilled: a test process killed with SIGKILL
// leaves no pgbouncer behind (parent-death signal), and its directory is
// removed by the next start.
func TestPgBouncerGoneWhenParentKilled(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		// The child: start a bouncer, report it, wait to be killed.
		b, err := pgtest.StartPgBouncer(context.Background(), os.Getenv(childEnv), pgtest.BouncerOptions{})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Println("BOUNCER", b.PID(), b.Dir)
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	t.Parallel()
	if _, err := pgtest.FindPgBouncer(); err != nil {
		pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{}) // skips or fails as configured
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPgBouncerGoneWhenParentKilled$")
	cmd.Env = append(os.Environ(), childEnv+"="+pgtest.ServerURL(t))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	var pid int
	var dir string
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "BOUNCER %d %s", &pid, &dir); err == nil {
			break
		}
		if strings.HasPrefix(sc.Text(), "ERR") {
			t.Fatal(sc.Text())
		}
	}
	if pid == 0 {
		t.Fatal("child did not start a bouncer")
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("bouncer %d not running: %v", pid, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) != syscall.ESRCH {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("pgbouncer %d outlived its killed parent by 10 s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The next start removes the dead process's directory.
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{})
	b.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("killed run's directory %s still there after the next start", dir)
	}
}
