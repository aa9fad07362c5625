package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/faultproxy"
)

// ReplOptions tune StartReplicated. The zero value is an asynchronous
// primary + standby pair, reached directly.
type ReplOptions struct {
	// Options apply to both servers (Settings included).
	Options
	// Sync makes the standby synchronous (synchronous_standby_names names
	// it, synchronous_commit stays on): a commit on the primary returns
	// only once the standby has flushed its WAL, and blocks while the
	// standby is down.
	Sync bool
	// Proxy puts a faultproxy in front of each node; URL and Node.Addr go
	// through it, so a test can silence, cut or delay one host (Node.Proxy).
	Proxy bool
}

// Node is one server of a Replicated pair.
type Node struct {
	*Cluster
	// Name is the node's cluster_name, which is also the application_name
	// its WAL receiver reports while it is a standby ("node0", "node1").
	Name string
	// Proxy is the fault proxy in front of the node, nil unless
	// ReplOptions.Proxy.
	Proxy *faultproxy.Proxy
}

// Addr is the address clients use for the node: its proxy's when it has
// one, else the server's own loopback address.
func (n *Node) Addr() string {
	if n.Proxy != nil {
		return n.Proxy.Addr()
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port))
}

// Replicated is a throwaway primary with a streaming standby
// (pg_basebackup -R), both run unprivileged in temporary directories on
// free loopback ports, like Start's cluster. Nodes[0] starts as the
// primary and Nodes[1] as its standby; after Promote(1), Nodes[1] is the
// primary and Nodes[0] (crashed or not) is left alone: nothing re-attaches
// it as a standby.
//
// Each node keeps its WAL for the standby through a physical replication
// slot, and wal_sender/receiver timeouts are short (5 s), so a dead peer
// is noticed quickly.
type Replicated struct {
	Nodes [2]*Node
	// Sync reports whether the standby is synchronous.
	Sync bool
}

// StartReplicated starts a primary, takes a base backup of it for the
// standby, starts the standby and returns once the standby streams (and,
// with Sync, once the primary counts it as its synchronous standby).
// Stop them with Stop.
func StartReplicated(ctx context.Context, opts ReplOptions) (*Replicated, error) {
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	r := &Replicated{Sync: opts.Sync}
	ok := false
	defer func() {
		if !ok {
			r.Stop()
		}
	}()
	common := map[string]string{
		"wal_level":                    "replica",
		"max_wal_senders":              "10",
		"max_replication_slots":        "10",
		"hot_standby":                  "on",
		"wal_sender_timeout":           "5s",
		"wal_receiver_timeout":         "5s",
		"wal_receiver_status_interval": "1s",
		"wal_retrieve_retry_interval":  "200ms",
	}
	for i := range r.Nodes {
		o := opts.Options
		o.Settings = map[string]string{}
		for k, v := range common {
			o.Settings[k] = v
		}
		o.Settings["cluster_name"] = fmt.Sprintf("node%d", i)
		for k, v := range opts.Options.Settings {
			o.Settings[k] = v
		}
		c, err := newCluster(binDir, cred, o)
		if err != nil {
			return nil, err
		}
		r.Nodes[i] = &Node{Cluster: c, Name: o.Settings["cluster_name"]}
	}
	primary, standby := r.Nodes[0], r.Nodes[1]
	tmpl, err := initdbTemplate(ctx, binDir, cred)
	if err != nil {
		return nil, err
	}
	if err := copyDir(ctx, tmpl, primary.dataDir); err != nil {
		return nil, err
	}
	if err := primary.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	// The base backup creates the slot and writes primary_conninfo and
	// primary_slot_name (-R) with standby.signal into the standby's data.
	if err := standby.run(ctx, "pg_basebackup", "-D", standby.dataDir, "-R", "-X", "stream",
		"-C", "-S", standby.Name, "-c", "fast", "-N", "--no-manifest",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres", primary.Port)); err != nil {
		return nil, err
	}
	if err := standby.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, primary.URL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to primary: %w", err)
	}
	defer conn.Close(context.Background())
	if opts.Sync {
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(standby.Name)); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	want := "async"
	if opts.Sync {
		want = "sync"
	}
	if err := waitFor(ctx, 60*time.Second, func() (bool, error) {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`, standby.Name, want).Scan(&n)
		return n == 1, err
	}); err != nil {
		return nil, fmt.Errorf("pgtest: standby did not start streaming (%s): %w", want, err)
	}
	if opts.Proxy {
		for _, n := range r.Nodes {
			p, err := faultproxy.New(net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)))
			if err != nil {
				return nil, err
			}
			n.Proxy = p
		}
	}
	ok = true
	return r, nil
}

// template is one initdb'd data directory per process, copied for every
// Replicated primary: initdb takes seconds (10 s on a loaded 2-core
// machine), a copy a fraction of one. It lives in a directory named like
// the clusters' (pid included), so removeStale deletes it after this
// process ends, and Main removes it when the tests end.
var template struct {
	mu  sync.Mutex
	dir string // the directory holding data/, "" until made
}

func initdbTemplate(ctx context.Context, binDir string, cred *syscall.Credential) (string, error) {
	template.mu.Lock()
	defer template.mu.Unlock()
	if template.dir != "" {
		return filepath.Join(template.dir, "data"), nil
	}
	c, err := newCluster(binDir, cred, Options{})
	if err != nil {
		return "", err
	}
	if err := c.run(ctx, "initdb", initdbArgs(c.dataDir)...); err != nil {
		_ = os.RemoveAll(c.Dir)
		return "", err
	}
	template.dir = c.Dir
	return c.dataDir, nil
}

// removeTemplate deletes the initdb template, if any.
func removeTemplate() {
	template.mu.Lock()
	defer template.mu.Unlock()
	if template.dir != "" {
		_ = os.RemoveAll(template.dir)
		template.dir = ""
	}
}

// copyDir copies directory src to dst (which must not exist), keeping
// owners and modes.
func copyDir(ctx context.Context, src, dst string) error {
	if out, err := exec.CommandContext(ctx, "cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: copy %s: %w\n%s", src, err, out)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// waitFor polls cond every 20 ms until it is true, it fails, ctx ends or
// bound passes.
func waitFor(ctx context.Context, bound time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(bound)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not true after %v", bound)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL returns a multi-host connection string (URL form) to database db
// ("" = postgres) on both nodes, in node order, through their proxies when
// they have them, with target_session_attrs=read-write, so a client lands
// on whichever node is the primary. params are extra "name=value" pairs
// (e.g. "connect_timeout=2", "default_query_exec_mode=exec").
func (r *Replicated) URL(db string, params ...string) string {
	if db == "" {
		db = "postgres"
	}
	hosts := make([]string, len(r.Nodes))
	for i, n := range r.Nodes {
		hosts[i] = n.Addr()
	}
	q := url.Values{"sslmode": {"disable"}, "target_session_attrs": {"read-write"}}
	for _, p := range params {
		k, v, _ := strings.Cut(p, "=")
		q.Set(k, v)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + url.PathEscape(db) + "?" + q.Encode()
}

// NodeURL returns a connection string to database db ("" = postgres) on
// node i alone (through its proxy when it has one).
func (r *Replicated) NodeURL(i int, db string) string {
	if db == "" {
		db = "postgres"
	}
	return "postgres://postgres@" + r.Nodes[i].Addr() + "/" + url.PathEscape(db) + "?sslmode=disable"
}

// Crash stops node i the way `pg_ctl stop -m immediate` does (SIGQUIT to
// the postmaster: no checkpoint, connections dropped, crash recovery at
// the next start). Its data directory stays; StartServer restarts it.
func (r *Replicated) Crash(i int) error { return r.Nodes[i].StopServer(true) }

// Promote promotes standby node i to primary (pg_promote, waiting until it
// accepts writes).
func (r *Replicated) Promote(ctx context.Context, i int) error {
	n := r.Nodes[i]
	conn, err := pgx.Connect(ctx, n.URL)
	if err != nil {
		return fmt.Errorf("pgtest: connect to %s: %w", n.Name, err)
	}
	defer conn.Close(context.Background())
	var done bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&done); err != nil {
		return fmt.Errorf("pgtest: promote %s: %w", n.Name, err)
	}
	if !done {
		return fmt.Errorf("pgtest: promote %s: not done within 60 s", n.Name)
	}
	return nil
}

// Rejoin makes node i, stopped (crashed or not) after the other node was
// promoted, a streaming standby of that node again, so that a test can
// fail over more than once: node i's data directory is replaced by a
// fresh base backup of the primary (pg_basebackup -R with a slot named
// after node i), it is started on its old port (its proxy, if any, still
// reaches it), and with Sync the primary names it as its synchronous
// standby. It returns once the primary counts it as streaming (and
// synchronous with Sync). A node promoted later never names itself as its
// own synchronous standby: the copied synchronous_standby_names is reset
// in its configuration.
func (r *Replicated) Rejoin(ctx context.Context, i int) error {
	n, p := r.Nodes[i], r.Nodes[1-i]
	if err := n.StopServer(true); err != nil {
		return err
	}
	if err := os.RemoveAll(n.dataDir); err != nil {
		return fmt.Errorf("pgtest: rejoin %s: %w", n.Name, err)
	}
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return fmt.Errorf("pgtest: connect to primary %s: %w", p.Name, err)
	}
	defer conn.Close(context.Background())
	// A slot left from an earlier round would make -C fail.
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE slot_name = $1 AND NOT active`, n.Name); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := n.run(ctx, "pg_basebackup", "-D", n.dataDir, "-R", "-X", "stream",
		"-C", "-S", n.Name, "-c", "fast", "-N", "--no-manifest",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres", p.Port)); err != nil {
		return err
	}
	// The copy carries the primary's postgresql.auto.conf, which may name
	// this node as the synchronous standby: as a primary later it would
	// wait for itself forever. A later line overrides an earlier one.
	f, err := os.OpenFile(filepath.Join(n.dataDir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	_, err = f.WriteString("synchronous_standby_names = ''\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := n.StartServer(ctx); err != nil {
		return err
	}
	want := "async"
	if r.Sync {
		want = "sync"
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(n.Name)); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	if err := waitFor(ctx, 60*time.Second, func() (bool, error) {
		var k int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`, n.Name, want).Scan(&k)
		return k == 1, err
	}); err != nil {
		return fmt.Errorf("pgtest: %s did not stream again (%s): %w", n.Name, want, err)
	}
	return nil
}

// Primary returns the index of the node that accepts writes now (not in
// recovery), or an error if neither does.
func (r *Replicated) Primary(ctx context.Context) (int, error) {
	for i := range r.Nodes {
		if rec, err := r.InRecovery(ctx, i); err == nil && !rec {
			return i, nil
		}
	}
	return -1, errors.New("pgtest: no node accepts writes")
}

// InRecovery reports whether node i is a standby (pg_is_in_recovery).
func (r *Replicated) InRecovery(ctx context.Context, i int) (bool, error) {
	conn, err := pgx.Connect(ctx, r.Nodes[i].URL)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	var rec bool
	err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec)
	return rec, err
}

// WaitReplayed waits until standby node i has replayed everything the
// primary node p had written when WaitReplayed was called.
func (r *Replicated) WaitReplayed(ctx context.Context, p, i int) error {
	pc, err := pgx.Connect(ctx, r.Nodes[p].URL)
	if err != nil {
		return err
	}
	defer pc.Close(context.Background())
	var lsn string
	if err := pc.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	sc, err := pgx.Connect(ctx, r.Nodes[i].URL)
	if err != nil {
		return err
	}
	defer sc.Close(context.Background())
	return waitFor(ctx, 60*time.Second, func() (bool, error) {
		var ok bool
		err := sc.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&ok)
		return ok, err
	})
}

// Stop stops both servers and their proxies and removes their
// directories. It is safe to call more than once.
func (r *Replicated) Stop() {
	if r == nil {
		return
	}
	for _, n := range r.Nodes {
		if n == nil {
			continue
		}
		if n.Proxy != nil {
			_ = n.Proxy.Close()
		}
		// Immediate: the directory is deleted anyway, so skip the checkpoint.
		_ = n.StopServer(true)
		n.Stop()
	}
}

// ReplicatedForTest starts a Replicated pair for one test, stopped when it
// ends. It needs the PostgreSQL server binaries (also when DATABASE_URL is
// set: the pair is always throwaway), and skips without them, or without
// pg_basebackup next to them (the npm server packages make test-versions
// uses ship none).
func ReplicatedForTest(tb testing.TB, opts ReplOptions) *Replicated {
	tb.Helper()
	binDir, err := FindBinDir()
	if errors.Is(err, ErrNoPostgres) {
		tb.Skip(err.Error())
	}
	if err == nil && !isExec(filepath.Join(binDir, "pg_basebackup")) {
		tb.Skip("pgtest: no pg_basebackup in " + binDir + ": a replicated pair needs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := StartReplicated(ctx, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Stop)
	return r
}
