package connx

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A dedicated connection is one pglease keeps open on its own for a long
// time, outside any pool's turnover: the Manager's listening connection
// (LISTEN, and the waiter locks of the keys it waits for) and an advisory
// Session's lock connection (session advisory locks). Both hold session
// state the server must drop when the client is gone (a listener backend
// that never reads pins the server's notification queue; a lock session
// keeps its locks), and both probe their connection at least once a
// second while healthy, so the server may end a session that has been
// silent much longer. Both are set up the same way: a connection of their
// own (Dial, or Hijack from the caller's pool), a check that no
// transaction-mode pooler hands its server connection to other clients
// (TransactionPooled), and one round trip that applies Liveness (SQL).

// Setting is one session setting, by name (pg_settings.name) and value.
type Setting struct{ Name, Value string }

// Liveness is what a dedicated connection's server side is told so that
// it ends the session of a client that vanished without a word (its
// machine died, a network partition, a NAT or proxy that dropped the
// connection's state) or stopped talking (a process stopped, or
// partitioned behind a proxy whose own connection to the server stays
// alive). The server then frees what the session held.
type Liveness struct {
	// KeepaliveIdle, KeepaliveInterval and KeepaliveCount are the
	// server's TCP keepalives (tcp_keepalives_idle, _interval, _count):
	// an idle socket whose peer stopped answering is dropped. Whole
	// seconds; Linux accepts at most 32767 s and a count of 127.
	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	// UserTimeout is tcp_user_timeout: a socket with data unacknowledged
	// that long is dropped, and on Linux it also caps how long the
	// keepalives take to drop an idle one. Whole milliseconds.
	UserTimeout time.Duration
	// IdleTimeout is idle_session_timeout (PostgreSQL 14 and later): the
	// server ends a session that sent no statement for that long. Unlike
	// the keepalives it works behind a TCP proxy or pooler, whose own
	// connection to the server stays alive. A healthy dedicated
	// connection probes far more often. Whole milliseconds.
	IdleTimeout time.Duration
}

// DefaultLiveness is the liveness of every dedicated connection unless a
// test says otherwise: the server drops a client that vanished, or stopped
// talking, after about 25 s. That is long next to the clients' own probes
// (a listener probes after a quiet second, within a second; a lock
// session's probe window is 2 s by default and at most half this bound),
// so a live but slow client is never cut off, and short enough that a
// dead one's locks and LISTEN do not outlive it by long. The keepalives
// (10 s idle, then 4 probes 5 s apart) would take 30 s; tcp_user_timeout
// caps that at 25 s.
var DefaultLiveness = Liveness{
	KeepaliveIdle:     10 * time.Second,
	KeepaliveInterval: 5 * time.Second,
	KeepaliveCount:    4,
	UserTimeout:       25 * time.Second,
	IdleTimeout:       25 * time.Second,
}

// Bound is how long after its client vanished the server drops the
// socket by the keepalives and tcp_user_timeout: min(UserTimeout,
// KeepaliveIdle + KeepaliveCount × KeepaliveInterval).
func (l Liveness) Bound() time.Duration {
	return min(l.UserTimeout, l.KeepaliveIdle+time.Duration(l.KeepaliveCount)*l.KeepaliveInterval)
}

// Settings returns the session settings of a dedicated connection with
// liveness l, followed by extra (settings of the caller's own, such as a
// lock session's lock_timeout).
func (l Liveness) Settings(extra ...Setting) []Setting {
	sec := func(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) }
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	s := []Setting{
		{"tcp_keepalives_idle", sec(l.KeepaliveIdle)},
		{"tcp_keepalives_interval", sec(l.KeepaliveInterval)},
		{"tcp_keepalives_count", strconv.Itoa(l.KeepaliveCount)},
		{"tcp_user_timeout", ms(l.UserTimeout)},
		{"idle_session_timeout", ms(l.IdleTimeout)},
		// While a statement runs (a lock session's wait for a lock), the
		// server checks this often whether the client is still there, so
		// a vanished client's wait does not run on (PostgreSQL 14 and
		// later; Linux).
		{"client_connection_check_interval", ms(l.KeepaliveInterval)},
		// Role or database defaults meant for pooled connections must not
		// end or cancel a dedicated session: its statements are bounded
		// by the client (probe timeouts, lock wait slices), and it is
		// never idle in a transaction.
		{"idle_in_transaction_session_timeout", "0"},
		{"statement_timeout", "0"},
	}
	return append(s, extra...)
}

// SQL returns one statement that applies settings to the session, each
// only if the server has it (older servers lack idle_session_timeout and
// client_connection_check_interval), and yields how many it applied. It
// has no parameters, so it runs with the simple protocol, and a caller
// may embed it (as a scalar subquery) or follow it with another statement
// in the same round trip.
func SQL(settings []Setting) string {
	var b strings.Builder
	b.WriteString("SELECT count(set_config(s.name, s.value, false)) FROM (VALUES ")
	for i, kv := range settings {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(" + literal(kv.Name) + ", " + literal(kv.Value) + ")")
	}
	b.WriteString(") AS s(name, value) WHERE s.name IN (SELECT name FROM pg_settings)")
	return b.String()
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Dial opens a dedicated connection with cfg, its connect to each host
// bounded (Bounded with DefaultConnectTimeout, unless cfg sets one).
func Dial(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, Bounded(cfg, DefaultConnectTimeout))
}

// Hijack takes a connection out of pool for good, as a dedicated one: it
// never goes back (the caller closes it), so its session state cannot
// leak to the pool's next user.
//
// A pooled connection whose server has turned read-only since it was
// opened (a primary demoted without closing its connections: the pool
// keeps them until a write fails there) is closed instead, when the
// pool's config lists several hosts, and a new connection is dialled with
// that config, whose target_session_attrs then finds the writer.
func Hijack(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	cfg := pool.Config().ConnConfig
	if !ReadOnly(conn.PgConn()) || Hosts(&cfg.Config) < 2 {
		return conn, nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_ = conn.Close(cctx)
	cancel()
	return Dial(ctx, cfg)
}

// TransactionPooled reports whether conn, whose backend pid is pid,
// reaches PostgreSQL through a pooler that hands its server connection to
// other clients between transactions, where session state (LISTEN,
// session locks, settings) does not stay with the client. A connection
// whose start-up the backend answered itself costs nothing more to check;
// only behind a pooler (Pooled) does the check open a second connection,
// with cfg (SharedBackend).
func TransactionPooled(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn, pid uint32) (bool, error) {
	if !Pooled(conn, pid) {
		return false, nil
	}
	return SharedBackend(ctx, cfg, conn, pid)
}
