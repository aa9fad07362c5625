package advisory

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestProxyPinsPartitionedHoldersLock shows why the
// keepalive settings alone do not free a partitioned holder's locks
// behind a TCP proxy: a connection through a proxy takes a session lock
// with the keepalive and user timeouts a Session sets (here 1 s) but no
// idle_session_timeout, then the proxy goes silent both ways (blackhole)
// and the holder never closes (a partitioned holder's FIN does not
// arrive either). The server's TCP peer is the proxy, which is alive and
// answers keepalives, so three times the keepalive bound later the
// server still holds the lock and nobody else can take it. This is why a
// Session also sets idle_session_timeout (Options.serverIdleTimeout;
// TestServerIdleTimeoutFreesPartitionedHolderBehindProxy).
func TestProxyPinsPartitionedHoldersLock(t *testing.T) {
	t.Parallel()
	through, p := viaProxy(t)
	ctx := ctxT(t, 30*time.Second)
	k, pid := lockThrough(t, ctx, pgtest.URL(t), through, 0)
	if err := p.Blackhole(); err != nil {
		t.Fatal(err)
	}
	admin := superConn(t)
	time.Sleep(3 * keepaliveBound) // nothing to wait for: the point is that nothing happens
	if !heldBy(t, admin, pid, k) {
		t.Fatal("the server freed the lock of a holder behind a blackholed proxy; the docs say it pins it")
	}
	id, _ := k.Int64()
	var got bool
	if err := admin.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&got); err != nil || got {
		t.Fatalf("another session took the pinned lock: %v %v", got, err)
	}
	// The proxy lets go of the server connection: now the server frees it.
	if err := p.Cut(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lock freed after the proxy closed its server connection", func() bool { return !heldBy(t, admin, pid, k) })
}

// keepaliveBound is min(tcp_user_timeout, idle + interval × count) as
// lockThrough sets them.
const keepaliveBound = time.Second

// lockThrough connects to url through a proxy (through sets the host and
// port), sets the keepalive and user timeouts a Session sets (here 1 s)
// and idle_session_timeout (0: off), and takes a session lock; the connection is never closed by the test
// (closed when the proxy closes). It returns the key and the backend pid.
func lockThrough(t *testing.T, ctx context.Context, url string, through func(*pgxpool.Config), idleSession time.Duration) (Key, int32) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	through(cfg)
	holder, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = holder.Close(cctx)
	})
	k := randKey()
	id, _ := k.Int64()
	var pid int32
	// client_connection_check_interval and idle_session_timeout are
	// PostgreSQL 14+: set only where the server has them.
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid(),
		set_config('tcp_keepalives_idle', '1', false), set_config('tcp_keepalives_interval', '1', false),
		set_config('tcp_keepalives_count', '1', false), set_config('tcp_user_timeout', '1000', false),
		(SELECT count(set_config(name, CASE name WHEN 'idle_session_timeout' THEN $2 ELSE '1000' END, false)) FROM pg_settings
		 WHERE name IN ('client_connection_check_interval', 'idle_session_timeout')),
		pg_advisory_lock($1)`,
		id, strconv.FormatInt(idleSession.Milliseconds(), 10)).Scan(&pid, nil, nil, nil, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	return k, pid
}

// TestPgBouncerPartitionedHolder: a holder reaches
// PostgreSQL through a session-mode PgBouncer and is partitioned from it
// (a blackholed proxy between them). PgBouncer's client_idle_timeout
// does not free the lock: it skips clients linked to a server
// connection, which in session mode every client is. The server's
// idle_session_timeout on the lock connection (what a Session sets from
// ServerIdleTimeout) does.
func TestPgBouncerPartitionedHolder(t *testing.T) {
	t.Parallel()
	const idle = 2 * time.Second
	for _, c := range []struct {
		name        string
		bouncer     map[string]string
		idleSession time.Duration
		freed       bool
	}{
		{"client_idle_timeout does not free it", map[string]string{"client_idle_timeout": "2"}, 0, false},
		{"idle_session_timeout frees it", nil, idle, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.freed && serverMajor(t) < 14 {
				t.Skip("idle_session_timeout is PostgreSQL 14+: on older servers nothing frees the lock (docs: advisory-locks.md)")
			}
			b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolSession, Settings: c.bouncer})
			bcfg, err := pgxpool.ParseConfig(b.URL)
			if err != nil {
				t.Fatal(err)
			}
			p, err := faultproxy.New(net.JoinHostPort(bcfg.ConnConfig.Host, strconv.Itoa(int(bcfg.ConnConfig.Port))))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			through := func(c *pgxpool.Config) {
				c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", uint16(p.Port())
				for _, fb := range c.ConnConfig.Fallbacks { // sslmode=prefer's plain connection is one
					fb.Host, fb.Port = "127.0.0.1", uint16(p.Port())
				}
			}
			ctx := ctxT(t, 30*time.Second)
			k, pid := lockThrough(t, ctx, b.URL, through, c.idleSession)
			if err := p.Blackhole(); err != nil {
				t.Fatal(err)
			}
			admin := superConn(t)
			start := time.Now()
			if c.freed {
				waitFor(t, "the server to end the idle session and free its lock", func() bool { return !heldBy(t, admin, pid, k) })
				t.Logf("freed %v after the partition", time.Since(start))
				return
			}
			time.Sleep(3 * idle) // the absence of an event: nothing to wait for
			if !heldBy(t, admin, pid, k) {
				t.Fatal("PgBouncer's client_idle_timeout freed a session-mode client's lock; the docs say it does not")
			}
			if err := p.Cut(); err != nil { // let go, so the test leaves nothing held
				t.Fatal(err)
			}
		})
	}
}

// holderEnv makes the test binary a holder process (holderProcess)
// instead of running tests; its value is the connection string.
const holderEnv = "PGLEASE_ADVISORY_HOLDER_URL"

// holderProcess is a child process that opens a Session on the
// connection string in holderEnv with ServerIdleTimeout from
// PGLEASE_ADVISORY_HOLDER_IDLE, takes a lock, prints "held PID KEY" and
// waits to be killed.
func holderProcess() int {
	ctx := context.Background()
	idle, err := time.ParseDuration(os.Getenv("PGLEASE_ADVISORY_HOLDER_IDLE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pool, err := pgxpool.New(ctx, os.Getenv(holderEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := Open(ctx, pool, &Options{ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 200 * time.Millisecond, connSettings: connSettings{serverIdleTimeout: idle}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	k := randKey()
	if _, ok, err := s.TryLock(ctx, k); !ok || err != nil {
		fmt.Fprintln(os.Stderr, ok, err)
		return 2
	}
	fmt.Printf("held %d %s\n", s.BackendPID(), k)
	select {}
}

// TestServerIdleTimeoutFreesPartitionedHolderBehindProxy:
// a holder process reaches the server through a TCP proxy, takes a lock,
// and is then partitioned (the proxy goes silent both ways) and stopped
// (SIGSTOP, so that it cannot close its connection either: a partitioned
// holder's FIN never arrives). Keepalives cannot free the lock (the
// server's TCP peer is the proxy, alive); the Session's
// ServerIdleTimeout (idle_session_timeout) does, about that long after
// the holder's last probe. The control, with a long ServerIdleTimeout,
// stays pinned.
func TestServerIdleTimeoutFreesPartitionedHolderBehindProxy(t *testing.T) {
	t.Parallel()
	const idle = 2 * time.Second
	for _, c := range []struct {
		name  string
		idle  time.Duration
		freed bool
	}{
		{"ServerIdleTimeout 2s", idle, true},
		{"ServerIdleTimeout 60s (control)", time.Minute, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.freed && serverMajor(t) < 14 {
				t.Skip("idle_session_timeout is PostgreSQL 14+: on older servers nothing frees the lock (docs: advisory-locks.md)")
			}
			_, p := viaProxy(t)
			url, err := p.ConnString(pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), holderEnv+"="+url, "PGLEASE_ADVISORY_HOLDER_IDLE="+c.idle.String())
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cmd.Process.Kill() // SIGKILL ends a stopped process too
				_ = cmd.Wait()
			})
			line, err := bufio.NewReader(out).ReadString('\n')
			var pid int32
			var ks string
			if _, serr := fmt.Sscanf(line, "held %d %s", &pid, &ks); err != nil || serr != nil {
				t.Fatalf("holder: %q %v %v", line, err, serr)
			}
			k, err := ParseKey(ks)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Blackhole(); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			admin := superConn(t)
			start := time.Now()
			if c.freed {
				waitFor(t, "the server to end the idle session and free its lock", func() bool { return !heldBy(t, admin, pid, k) })
				t.Logf("freed %v after the partition (ServerIdleTimeout %v)", time.Since(start), c.idle)
				return
			}
			time.Sleep(3 * idle) // the absence of an event: nothing to wait for
			if !heldBy(t, admin, pid, k) {
				t.Fatal("the lock was freed with a 60 s ServerIdleTimeout; the control shows nothing")
			}
		})
	}
}
