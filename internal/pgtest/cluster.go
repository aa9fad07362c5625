// Package pgtest starts throwaway PostgreSQL clusters and gives tests
// isolated databases and schemas on them. It is test infrastructure: its
// API is unstable and not for use outside this module.
//
// One implementation serves every entry point: TestMain (Main), the
// `withpg` launcher behind `make test`, `make demo` and `make bench`, and
// examples. When DATABASE_URL is set, no cluster is started.
//
// The cluster is found from initdb on PATH or the newest
// /usr/lib/postgresql/*/bin, initialised in a temporary directory, started on
// a free loopback port with its Unix socket inside that directory, and
// always stopped and removed afterwards. Run as root (CI, these machines),
// initdb and postgres run as the unprivileged "postgres" user, or "nobody"
// when that user does not exist, since both refuse to run as root.
//
// It is also the tests' one kit: the lease-schema pools (RuntimePool,
// LeasePool), the server-clock helpers (ServerNowMs, WaitServerMs), and the
// statement recorder (Recorder, package pgrec). It sits below the packages
// it tests and imports none of them: the lease schema is set up with what
// pg/migrate registers in the store when it is linked (store.Setup).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options tune a throwaway cluster. The zero value is fit for tests.
type Options struct {
	// Durable keeps fsync on (benchmarks, demos). Tests default to
	// fsync=off, which is safe against process crashes and server restarts
	// (the OS keeps the pages), not against machine crashes.
	Durable bool
	// MaxConnections defaults to 300.
	MaxConnections int
	// Log receives the server's output; nil discards it.
	Log *os.File
	// Settings are extra server settings (-c name=value), applied after
	// the harness's own, so they may override them.
	Settings map[string]string
	// Template copies one initdb'd data directory made once per process
	// instead of running initdb (seconds on a loaded machine) for each
	// cluster: for callers that start many (pgleasetest, one per test).
	Template bool
	// Env is extra environment (name=value) for the server process only,
	// not initdb: e.g. LD_PRELOAD of libfaketime for clock-step tests.
	Env []string
	// ParentDir is where the cluster's temporary directory is made
	// (default os.TempDir()): e.g. a small filesystem for disk-full tests.
	ParentDir string
}

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	// URL connects as the superuser "postgres" to database "postgres".
	URL string
	// Port is the loopback TCP port.
	Port int
	// Dir is the temporary directory holding data and socket.
	Dir string
	// BinDir holds initdb, pg_ctl and postgres.
	BinDir string

	cred    *syscall.Credential
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	dataDir string
	sockDir string
	opts    Options
}

// ErrNoPostgres is returned by Start when no PostgreSQL server binaries exist.
var ErrNoPostgres = errors.New("pgtest: no PostgreSQL server binaries found (initdb/postgres not on PATH nor under /usr/lib/postgresql/*/bin): " +
	"install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL to an existing database")

// FindBinDir returns the directory holding initdb, pg_ctl and postgres: the
// directory of initdb on PATH (symlinks resolved), else the newest
// /usr/lib/postgresql/N/bin.
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir := filepath.Dir(real)
			if isExec(filepath.Join(dir, "postgres")) {
				return dir, nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// serverCredential returns the credential to run the server under: nil
// when not root, else the "postgres" user, else "nobody".
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("pgtest: running as root, and neither a \"postgres\" nor a \"nobody\" user exists to run the server as (initdb refuses root)")
}

const dirPrefix = "pglease-pg-"

// removeStale deletes temp dirs left by processes that died without cleanup
// (e.g. SIGKILL). Their servers died with them (parent-death signal).
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		rest := strings.TrimPrefix(filepath.Base(d), dirPrefix)
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.RemoveAll(d)
		}
	}
}

// Start initialises and starts a throwaway cluster. Stop it with Stop.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	c, err := newCluster(binDir, cred, opts)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	if opts.Template {
		tmpl, err := initdbTemplate(ctx, binDir, cred)
		if err != nil {
			return nil, err
		}
		if err := copyDir(ctx, tmpl, c.dataDir); err != nil {
			return nil, err
		}
	} else if err := c.run(ctx, "initdb", initdbArgs(c.dataDir)...); err != nil {
		return nil, err
	}
	if err := c.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	if err := c.checkMajor(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// initdbArgs are initdb's arguments for a test cluster in dataDir: UTF8,
// the C locale (the same sorting and character classes on every machine,
// whatever locales it has installed), trust authentication, no fsync.
func initdbArgs(dataDir string) []string {
	return []string{"-D", dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "-N"}
}

// checkMajor fails when PGLEASE_EXPECT_PG_MAJOR is set (make
// test-versions sets it) and the server is another major, so a version
// matrix cannot pass on the wrong binaries.
func (c *Cluster) checkMajor(ctx context.Context) error {
	want := os.Getenv("PGLEASE_EXPECT_PG_MAJOR")
	if want == "" {
		return nil
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	var num int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		return fmt.Errorf("pgtest: server version: %w", err)
	}
	if got := strconv.Itoa(num / 10000); got != want {
		return fmt.Errorf("pgtest: the server in %s is PostgreSQL %s, not %s (PGLEASE_EXPECT_PG_MAJOR)", c.BinDir, got, want)
	}
	return nil
}

// newCluster makes the temporary directory of a cluster (owned by the
// server's user), without a data directory yet.
func newCluster(binDir string, cred *syscall.Credential, opts Options) (*Cluster, error) {
	removeStale()
	dir, err := os.MkdirTemp(opts.ParentDir, fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{Dir: dir, BinDir: binDir, cred: cred, opts: opts,
		dataDir: filepath.Join(dir, "data"), sockDir: filepath.Join(dir, "sock")}
	if opts.MaxConnections == 0 {
		c.opts.MaxConnections = 300
	}
	if err := os.Mkdir(c.sockDir, 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		for _, p := range []string{dir, c.sockDir} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				_ = os.RemoveAll(dir)
				return nil, fmt.Errorf("pgtest: chown %s: %w", p, err)
			}
		}
	}
	return c, nil
}

// run runs one of the cluster's binaries (initdb, pg_basebackup, …) as the
// server's user, in the cluster's directory.
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: %s: %w\n%s", name, err, out)
	}
	return nil
}

// startOnFreePort starts the server on a free loopback port, trying
// another port if one was taken meanwhile.
func (c *Cluster) startOnFreePort(ctx context.Context) error {
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return err
		}
		if lastErr = c.startServer(ctx, port); lastErr == nil {
			return nil
		}
	}
	return lastErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: no free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) startServer(ctx context.Context, port int) error {
	fsync := "off"
	if c.opts.Durable {
		fsync = "on"
	}
	args := []string{"-D", c.dataDir, "-p", strconv.Itoa(port), "-k", c.sockDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=" + strconv.Itoa(c.opts.MaxConnections),
		"-c", "fsync=" + fsync,
		"-c", "full_page_writes=" + fsync,
		"-c", "shared_buffers=128MB",
		"-c", "log_min_messages=warning",
	}
	keys := make([]string, 0, len(c.opts.Settings))
	for k := range c.opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+c.opts.Settings[k])
	}
	started := make(chan error, 1)
	c.exited = make(chan struct{})
	// The parent-death signal fires when the thread that started the child
	// exits, so start it from a locked thread that lives until the server
	// exits: if this process dies (even by SIGKILL), the server gets SIGQUIT.
	go func() {
		runtime.LockOSThread()
		cmd := exec.Command(filepath.Join(c.BinDir, "postgres"), args...)
		cmd.Dir = c.Dir
		if len(c.opts.Env) > 0 {
			cmd.Env = append(os.Environ(), c.opts.Env...)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
		if c.opts.Log != nil {
			cmd.Stdout, cmd.Stderr = c.opts.Log, c.opts.Log
		}
		if err := cmd.Start(); err != nil {
			started <- err
			close(c.exited)
			return
		}
		c.cmd = cmd
		started <- nil
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	c.Port = port
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-c.exited:
			return fmt.Errorf("pgtest: postgres exited during start-up: %v", c.waitErr)
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, c.URL)
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.kill(syscall.SIGQUIT)
			return fmt.Errorf("pgtest: postgres did not accept connections: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) kill(sig syscall.Signal) {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(sig)
	}
}

// Restart stops the server with the given mode ("fast" or "immediate") and
// starts it again on the same port and data directory. It is for fault
// tests (connections are lost; committed data survives).
func (c *Cluster) Restart(ctx context.Context, immediate bool) error {
	if err := c.StopServer(immediate); err != nil {
		return err
	}
	return c.startServer(ctx, c.Port)
}

// StopServer stops the server process but keeps the data directory, so
// StartServer can bring it back.
func (c *Cluster) StopServer(immediate bool) error {
	if c.exited == nil {
		return nil
	}
	sig := syscall.SIGINT // fast shutdown
	if immediate {
		sig = syscall.SIGQUIT
	}
	c.kill(sig)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.kill(syscall.SIGKILL)
		<-c.exited
	}
	return nil
}

// StartServer starts a server stopped by StopServer again, on its old port.
func (c *Cluster) StartServer(ctx context.Context) error {
	return c.startServer(ctx, c.Port)
}

// Stop stops the server and removes its directory. It is safe to call
// more than once.
func (c *Cluster) Stop() {
	if c == nil {
		return
	}
	_ = c.StopServer(false)
	if c.Dir != "" {
		_ = os.RemoveAll(c.Dir)
	}
}
