package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoPgBouncer is returned by StartPgBouncer when no pgbouncer binary
// exists. Tests skip with it (PgBouncerForTest) unless
// PGLEASE_REQUIRE_PGBOUNCER=1, which CI (.ci/run) sets.
var ErrNoPgBouncer = errors.New("pgtest: pgbouncer not found (not on PATH nor at /usr/sbin/pgbouncer): " +
	"install it (Debian/Ubuntu: apt-get install -y pgbouncer; .ci/run does this) to run the TestPgBouncer… tests")

// FindPgBouncer returns the pgbouncer binary: from PATH, else Debian's
// /usr/sbin/pgbouncer.
func FindPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if isExec("/usr/sbin/pgbouncer") {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoPgBouncer
}

// Pool modes of PgBouncer.
const (
	PoolTransaction = "transaction"
	PoolSession     = "session"
	PoolStatement   = "statement"
)

// BouncerOptions tune StartPgBouncer. The zero value is a transaction-mode
// pooler fit for tests.
type BouncerOptions struct {
	// PoolMode is PoolTransaction (default), PoolSession or PoolStatement.
	PoolMode string
	// PoolSize is default_pool_size, the server connections per (database,
	// user) pair; default 20. A size of 1 makes every client share one
	// server connection (deterministic statement-cache collisions).
	PoolSize int
	// MaxClientConn defaults to 1000.
	MaxClientConn int
	// Settings add to or override the [pgbouncer] section (e.g.
	// "server_round_robin": "1"); values are written as given.
	Settings map[string]string
	// Log receives PgBouncer's log; nil discards it.
	Log io.Writer
}

// Bouncer is a running throwaway PgBouncer, listening on a free loopback
// port, run as the same unprivileged user as the throwaway cluster, with
// its config in a temporary directory that Stop removes.
//
// Every database name is forwarded to the target server (a "*" fallback
// entry). Clients are not authenticated (auth_type trust, users looked up
// on the server through auth_user = the target's user), and the server
// sees each client's own user, so roles created by tests work through
// it. When the target needs a password, only the target's user works.
// PgBouncer forwards only the startup parameters it tracks: a pgx
// RuntimeParams["search_path"] (as Pool sets) is refused, so tests
// through it use schema-qualified names.
type Bouncer struct {
	// URL is the target connection string with host and port replaced by
	// the bouncer's (same database, user and parameters).
	URL string
	// Port is the loopback TCP port it listens on.
	Port int
	// Dir holds pgbouncer.ini (and the auth file when there is one).
	Dir string
	// PoolMode is the pool mode it runs in.
	PoolMode string
	// Target is the server's address ("host:port", or a socket directory
	// and port).
	Target string

	bin     string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	logs    *tailBuffer
	stop    sync.Once
}

// StartPgBouncer starts a PgBouncer in front of the server that target
// (a connection string, URL or keyword/value) points at. Stop it with Stop.
func StartPgBouncer(ctx context.Context, target string, opts BouncerOptions) (*Bouncer, error) {
	bin, err := FindPgBouncer()
	if err != nil {
		return nil, err
	}
	mode := opts.PoolMode
	if mode == "" {
		mode = PoolTransaction
	}
	if mode != PoolTransaction && mode != PoolSession && mode != PoolStatement {
		return nil, fmt.Errorf("pgtest: unknown PgBouncer pool mode %q", mode)
	}
	cfg, err := pgconn.ParseConfig(target)
	if err != nil {
		return nil, fmt.Errorf("pgtest: bouncer target: %w", err)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	removeStale()
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-bouncer-", dirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	b := &Bouncer{Dir: dir, PoolMode: mode, bin: bin,
		Target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	ok := false
	defer func() {
		if !ok {
			b.Stop()
		}
	}()
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		if err := b.writeConfig(cfg, cred, port, mode, opts); err != nil {
			return nil, err
		}
		if lastErr = b.start(ctx, cred, port, opts.Log); lastErr == nil {
			b.URL = ReplaceHostPort(target, "127.0.0.1", port)
			ok = true
			return b, nil
		}
	}
	return nil, lastErr
}

// iniQuote quotes a libpq-style connect-string value for the [databases]
// section.
func iniQuote(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}

func (b *Bouncer) writeConfig(cfg *pgconn.Config, cred *syscall.Credential, port int, mode string, opts BouncerOptions) error {
	size := opts.PoolSize
	if size == 0 {
		size = 20
	}
	maxClient := opts.MaxClientConn
	if maxClient == 0 {
		maxClient = 1000
	}
	db := "host=" + iniQuote(cfg.Host) + " port=" + strconv.Itoa(int(cfg.Port))
	settings := map[string]string{
		"listen_addr":       "127.0.0.1",
		"listen_port":       strconv.Itoa(port),
		"unix_socket_dir":   "",
		"pidfile":           "",
		"logfile":           "",
		"pool_mode":         mode,
		"default_pool_size": strconv.Itoa(size),
		"max_client_conn":   strconv.Itoa(maxClient),
		"auth_type":         "trust",
		"auth_user":         cfg.User,
		"admin_users":       cfg.User,
		"stats_users":       cfg.User,
		// pgx sends none of these today; other drivers do.
		"ignore_startup_parameters": "extra_float_digits",
		// Come back fast after a server restart or failover (default 15 s).
		"server_login_retry": "1",
		"stats_period":       "3600",
		"log_connections":    "0",
		"log_disconnections": "0",
	}
	if cfg.Password != "" {
		// Server logins need the password: keep it in an auth file that
		// only the bouncer's user can read. Only this user works then.
		auth := filepath.Join(b.Dir, "userlist.txt")
		line := fmt.Sprintf("%q %q\n", cfg.User, cfg.Password)
		if err := os.WriteFile(auth, []byte(line), 0o600); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		if cred != nil {
			if err := os.Chown(auth, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("pgtest: %w", err)
			}
		}
		settings["auth_file"] = auth
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n* = %s\n\n[pgbouncer]\n", db)
	for _, k := range keys {
		fmt.Fprintf(&ini, "%s = %s\n", k, settings[k])
	}
	path := filepath.Join(b.Dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini.String()), 0o600); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		for _, p := range []string{b.Dir, path} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("pgtest: chown %s: %w", p, err)
			}
		}
	}
	return nil
}

// tailBuffer keeps the last few KiB written to it (start-up errors) and
// copies everything to an optional writer.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	out io.Writer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 8<<10 {
		t.buf = t.buf[len(t.buf)-4<<10:]
	}
	if t.out != nil {
		_, _ = t.out.Write(p)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

func (b *Bouncer) start(ctx context.Context, cred *syscall.Credential, port int, log io.Writer) error {
	b.logs = &tailBuffer{out: log}
	started := make(chan error, 1)
	b.exited = make(chan struct{})
	exited := b.exited
	// As for the cluster: started from a locked thread that lives as long
	// as the child, so the parent-death signal reaches it if this process
	// dies, even by SIGKILL. SIGTERM is PgBouncer's immediate shutdown.
	go func() {
		runtime.LockOSThread()
		cmd := exec.Command(b.bin, filepath.Join(b.Dir, "pgbouncer.ini"))
		cmd.Dir = b.Dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
		cmd.Stdout, cmd.Stderr = b.logs, b.logs
		if err := cmd.Start(); err != nil {
			started <- err
			close(exited)
			return
		}
		b.cmd = cmd
		started <- nil
		b.waitErr = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgtest: start pgbouncer: %w", err)
	}
	b.Port = port
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("pgtest: pgbouncer exited during start-up: %v\n%s", b.waitErr, b.logs)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.kill()
			return fmt.Errorf("pgtest: pgbouncer did not listen on %s: %w\n%s", addr, err, b.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *Bouncer) kill() {
	if b.cmd != nil && b.cmd.Process != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
	}
}

// ConnString returns base (a connection string to the bouncer's target
// server, e.g. URL(tb) for the package database) rewritten to go through
// the bouncer.
func (b *Bouncer) ConnString(base string) string {
	return ReplaceHostPort(base, "127.0.0.1", b.Port)
}

// PID returns the pgbouncer process id (0 before start).
func (b *Bouncer) PID() int {
	if b == nil || b.cmd == nil || b.cmd.Process == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// Log returns the last few KiB of PgBouncer's log (for failure messages).
func (b *Bouncer) Log() string {
	if b == nil || b.logs == nil {
		return ""
	}
	return b.logs.String()
}

// Stop stops PgBouncer (immediate shutdown: its client connections are
// closed) and removes its directory. It is safe to call more than once.
func (b *Bouncer) Stop() {
	if b == nil {
		return
	}
	b.stop.Do(func() {
		b.kill()
		if b.Dir != "" {
			_ = os.RemoveAll(b.Dir)
		}
	})
}

// Restart stops PgBouncer as Stop does (immediate shutdown: its client
// connections are closed) and starts it again with the same config on the
// same port, as an operator's restart does. For fault tests.
func (b *Bouncer) Restart(ctx context.Context) error {
	b.kill()
	cred, err := serverCredential()
	if err != nil {
		return err
	}
	return b.start(ctx, cred, b.Port, b.logs.out)
}

// Admin runs one command (PAUSE, RESUME, RECONNECT, SHOW …) on
// PgBouncer's admin console, as the target's user. PAUSE returns once
// every server connection is released.
func (b *Bouncer) Admin(ctx context.Context, command string) error {
	cfg, err := pgconn.ParseConfig(WithDatabase(b.URL, "pgbouncer"))
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pgtest: pgbouncer admin console: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, command).ReadAll(); err != nil {
		return fmt.Errorf("pgtest: pgbouncer %s: %w", command, err)
	}
	return nil
}

// ReplaceHostPort returns the connection string s (URL or keyword/value)
// with its host and port replaced (a multi-host list becomes one host).
func ReplaceHostPort(s, host string, port int) string {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = net.JoinHostPort(host, strconv.Itoa(port))
		q := u.Query()
		if q.Has("host") || q.Has("port") {
			q.Del("host")
			q.Del("port")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	// Keyword/value form: a later setting overrides an earlier one.
	return s + " host=" + host + " port=" + strconv.Itoa(port)
}

// requireEnv names the variable that turns a missing optional binary
// (pgbouncer) from a skip into a failure; CI sets it.
const requireEnv = "PGLEASE_REQUIRE_PGBOUNCER"

// PgBouncerForTest starts a PgBouncer in front of the package's server
// (ServerURL), stopped when the test ends. Its URL goes to the package's
// database (URL) through it. Without a pgbouncer binary the test is
// skipped with how to install it, or fails when
// PGLEASE_REQUIRE_PGBOUNCER=1 (CI).
func PgBouncerForTest(tb testing.TB, opts BouncerOptions) *Bouncer {
	tb.Helper()
	if _, err := FindPgBouncer(); err != nil {
		if os.Getenv(requireEnv) == "1" {
			tb.Fatalf("%v (%s=1)", err, requireEnv)
		}
		tb.Skip(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := StartPgBouncer(ctx, ServerURL(tb), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(b.Stop)
	b.URL = b.ConnString(URL(tb))
	return b
}
