// Package connx holds what pglease does on the connections it opens or
// keeps itself (the Manager's listening connection, advisory sessions: its
// dedicated connections, dedicated.go): a bounded connect timeout per
// host, one set of server-side liveness settings, and telling whether a
// connection reaches PostgreSQL through a pooler that hands its server
// connection to other clients between transactions (PgBouncer
// pool_mode=transaction or statement), where session state (LISTEN,
// session advisory locks, set_config) does not stay with the client.
package connx

import (
	"context"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultConnectTimeout bounds the connect to each host where pglease
// opens a connection of its own and the connection string sets no
// connect_timeout: with several hosts (host=a,b …
// target_session_attrs=read-write), a connect to a host that stopped
// answering without closing connections (a crashed machine, a partition,
// a blackholed address) would otherwise wait on that host until the whole
// attempt's deadline and never try the next one.
const DefaultConnectTimeout = 2 * time.Second

// Bounded returns a copy of cfg whose connect to each host is bounded:
// cfg's own connect_timeout when it has one, else d.
func Bounded(cfg *pgx.ConnConfig, d time.Duration) *pgx.ConnConfig {
	c := cfg.Copy()
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d
	}
	return c
}

// Hosts returns how many distinct host:port pairs cfg connects to, in
// order (a multi-host connection string lists several; sslmode=prefer adds
// a fallback for the same host, which does not count).
func Hosts(cfg *pgconn.Config) int {
	type hp struct {
		host string
		port uint16
	}
	seen := map[hp]bool{{cfg.Host, cfg.Port}: true}
	for _, fb := range cfg.Fallbacks {
		seen[hp{fb.Host, fb.Port}] = true
	}
	return len(seen)
}

// UnboundedMultiHost reports whether cfg lists several hosts and sets no
// connect_timeout: a pool made from it never moves off a host that stopped
// answering without closing connections, as every connect waits on that
// host until its caller's deadline.
func UnboundedMultiHost(cfg *pgconn.Config) bool {
	return cfg.ConnectTimeout == 0 && Hosts(cfg) > 1
}

// BackendPID returns the server process id of conn's session
// (pg_backend_pid()), asked with the simple protocol so that it works
// whatever the connection's statement cache mode and pooler.
func BackendPID(ctx context.Context, conn *pgx.Conn) (uint32, error) {
	var pid uint32
	err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return pid, err
}

// Pooled reports whether something other than the backend answered conn's
// start-up: its cancel key names another pid than pg_backend_pid() (pid),
// as PgBouncer's does. A direct connection's cancel key names its backend.
func Pooled(conn *pgx.Conn, pid uint32) bool { return conn.PgConn().PID() != pid }

// SharedBackend reports whether the server connection (backend pid) that
// conn runs on is handed to other clients between conn's statements: a
// transaction- or statement-mode pooler. A second client, connected with
// cfg, asks for its backend pid right after conn used (and, in those
// modes, gave back) pid; PgBouncer reuses the most recently used idle
// server connection first, so it gets pid. A direct connection or a
// session-mode pooler never gives pid to another client. Three rounds, in
// case other clients took the server connection in between. Call it only
// when Pooled: it opens a connection.
func SharedBackend(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn, pid uint32) (bool, error) {
	other, err := pgx.ConnectConfig(ctx, Bounded(cfg, DefaultConnectTimeout))
	if err != nil {
		return false, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = other.Close(cctx)
		cancel()
	}()
	for range 3 {
		mine, err := BackendPID(ctx, conn)
		if err != nil {
			return false, err
		}
		if mine != pid {
			return true, nil
		}
		theirs, err := BackendPID(ctx, other)
		if err != nil {
			return false, err
		}
		if theirs == pid {
			return true, nil
		}
	}
	return false, nil
}

// maxAppName is the longest application_name the server keeps
// (NAMEDATALEN − 1 bytes); it truncates longer ones.
const maxAppName = 63

// AppName sets cfg's application_name to identity (a holder identity,
// "program[pid]@host"), cut to what the server keeps, unless the
// connection string or PGAPPNAME set one: the process's connections are
// then named in pg_stat_activity, pg_locks views and `pglease status`.
func AppName(cfg *pgconn.Config, identity string) {
	if cfg == nil || identity == "" {
		return
	}
	if _, ok := cfg.RuntimeParams["application_name"]; ok {
		return
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if len(identity) > maxAppName {
		cut := maxAppName
		for cut > 0 && !utf8.RuneStart(identity[cut]) {
			cut--
		}
		identity = identity[:cut]
	}
	cfg.RuntimeParams["application_name"] = identity
}
