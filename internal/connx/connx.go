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
	"encoding/binary"
	"net"
	"sync"
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
// cfg's own connect_timeout when it has one, else d; and whose clean-up
// after a failure is bounded too (BoundCleanup).
func Bounded(cfg *pgx.ConnConfig, d time.Duration) *pgx.ConnConfig {
	c := cfg.Copy()
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d
	}
	BoundCleanup(&c.Config)
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

// ReadOnly reports whether conn's server said (ParameterStatus, which
// PostgreSQL 14+ sends at connect and with every change) that the
// session's transactions are read-only by default or that it is a hot
// standby. A primary demoted, or set default_transaction_read_only,
// without closing its connections says so on them at their next
// statement; a server older than 14 says nothing (false).
func ReadOnly(conn *pgconn.PgConn) bool {
	return conn.ParameterStatus("default_transaction_read_only") == "on" || conn.ParameterStatus("in_hot_standby") == "on"
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

// Clean-up of a broken connection. When a statement fails on a connection
// that stopped answering (half-open, blackholed), pgconn closes it in a
// goroutine of its own that first sends a cancel request on a new
// connection and waits for the server to acknowledge it, then sends
// Terminate and drains the socket, all bounded only by 15 s. Until that
// goroutine ends, pgxpool.Pool.Close waits for the connection, and the
// goroutine outlives whatever Close of pglease's ran the statement.
// BoundCleanup bounds each step instead: the cancel connection's dial by
// the connect timeout, the wait for the acknowledgement and the drain
// after Terminate by CleanupAckBound.

// CleanupAckBound bounds the wait for a cancel request's acknowledgement
// and the drain after Terminate, on a connection whose DialFunc
// BoundCleanup wrapped. A live server acknowledges a cancel request (it
// closes the cancel connection) at once, and ends a session at once on
// Terminate.
const CleanupAckBound = time.Second

// BoundCleanup wraps cfg's DialFunc (pgconn's default when nil) so that
// the clean-up of a broken connection ends within the connect timeout
// (cfg.ConnectTimeout, or DefaultConnectTimeout) + 2 × CleanupAckBound
// (see above): every dial is bounded by the connect timeout, and a
// connection that writes a cancel request or Terminate waits at most
// CleanupAckBound longer for its peer. A cancel request written inside
// TLS (pgx encrypts the cancel connection of a TLS connection) is not
// seen: its wait stays bounded by pgx's own 15 s. Statements on healthy
// connections are unaffected.
func BoundCleanup(cfg *pgconn.Config) {
	dial := cfg.DialFunc
	if dial == nil {
		d := &net.Dialer{KeepAlive: 5 * time.Minute}
		dial = d.DialContext
	}
	bound := cfg.ConnectTimeout
	if bound <= 0 {
		bound = DefaultConnectTimeout
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		c, err := dial(dctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cleanupConn{Conn: c}, nil
	}
}

// cleanupConn caps its deadline at CleanupAckBound once it has written a
// cancel request or Terminate (see BoundCleanup).
type cleanupConn struct {
	net.Conn
	mu  sync.Mutex
	cap time.Time // zero until a cancel request or Terminate is written
}

// cancelRequestCode is the protocol code of a CancelRequest message (its
// bytes 4–8).
const cancelRequestCode = 80877102

func (c *cleanupConn) Write(b []byte) (int, error) {
	if isCancelRequest(b) || isTerminate(b) {
		c.mu.Lock()
		c.cap = time.Now().Add(CleanupAckBound)
		_ = c.Conn.SetDeadline(c.cap)
		c.mu.Unlock()
	}
	return c.Conn.Write(b)
}

func (c *cleanupConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn.SetDeadline(c.capped(t))
}

func (c *cleanupConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn.SetReadDeadline(c.capped(t))
}

func (c *cleanupConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn.SetWriteDeadline(c.capped(t))
}

// capped returns t, or the cap when one is set and t is later (or none).
func (c *cleanupConn) capped(t time.Time) time.Time {
	if !c.cap.IsZero() && (t.IsZero() || t.After(c.cap)) {
		return c.cap
	}
	return t
}

// isCancelRequest reports whether b is exactly one CancelRequest message:
// its length (16, or more with a longer secret key of protocol 3.2), then
// its code.
func isCancelRequest(b []byte) bool {
	return len(b) >= 16 && len(b) <= 268 && int(binary.BigEndian.Uint32(b)) == len(b) &&
		binary.BigEndian.Uint32(b[4:8]) == cancelRequestCode
}

// isTerminate reports whether b is exactly one Terminate message ('X',
// length 4): pgconn writes it alone when it closes a connection.
func isTerminate(b []byte) bool {
	return len(b) == 5 && b[0] == 'X' && binary.BigEndian.Uint32(b[1:]) == 4
}
