package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// ConfigurePool sets on cfg what a pool used for locks needs to recover
// quickly from a network fault, keeping everything else as the caller set
// it:
//
//   - The connect to each host is bounded by 2 s unless the connection
//     string sets connect_timeout, so that with several hosts (host=a,b …
//     target_session_attrs=read-write) the pool moves on from a host that
//     stopped answering without closing connections. pgxpool's own
//     default lets a connect begun during a fault hold a pool slot for up
//     to 2 minutes.
//   - BeforeClose closes the socket of a connection pgx found broken (a
//     statement or pgxpool's liveness ping ran out of time). pgxpool keeps
//     a destroyed connection's slot until pgconn has finished closing it,
//     and pgconn drains a silent (half-open, blackholed) socket for up to
//     15 s: with every pooled connection broken, nothing would run for
//     15 s after the network is back. A BeforeClose already set on cfg is
//     kept and runs first. Healthy connections are closed by pgx as usual.
//   - The server's WARNING notices are recorded per connection (an
//     OnNotice already set on cfg is kept and runs first). A lock write
//     whose commit drew one is reported Ambiguous, not as a success: the
//     warning is PostgreSQL's only sign that a wait for a synchronous
//     standby was cancelled (pg_cancel_backend), after which the write is
//     committed on the primary alone and a failover can undo it and issue
//     its fence again.
//   - application_name is this process's default holder identity,
//     "program[pid]@host" (cut to the server's 63 bytes), unless the
//     connection string or PGAPPNAME sets one: pg_stat_activity and
//     `pglease status` then name the process behind each backend.
//   - Before it drains, pgconn sends a cancel request for the broken
//     connection's statement on a new connection and waits for the server
//     to acknowledge it, again for up to 15 s, in a goroutine that
//     pgxpool.Pool.Close waits for. cfg's DialFunc is wrapped so that
//     this dial is bounded by the connect timeout and the wait for the
//     acknowledgement by a second (not seen inside TLS, where pgx's 15 s
//     stays): a pool closed after a network fault closes within about
//     3 s, not 15.
//
// manager.Open and NewPool configure their pools with it. It returns an
// InvalidArgument error for a nil cfg.
func ConfigurePool(cfg *pgxpool.Config) error {
	if cfg == nil || cfg.ConnConfig == nil {
		return pgerr.New(pglease.CodeInvalidArgument, "pg.ConfigurePool", "nil pool config (use pgxpool.ParseConfig)", nil)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connx.DefaultConnectTimeout
	}
	connx.AppName(&cfg.ConnConfig.Config, store.DefaultHolder())
	connx.BoundCleanup(&cfg.ConnConfig.Config)
	connx.NoteWarnings(&cfg.ConnConfig.Config)
	prev := cfg.BeforeClose
	cfg.BeforeClose = func(c *pgx.Conn) {
		if prev != nil {
			prev(c)
		}
		connx.TakeWarning(c.PgConn())
		if pc := c.PgConn(); pc.IsClosed() {
			_ = pc.Conn().Close()
		}
	}
	return nil
}

// NewPool opens a pgxpool.Pool from connString (pgxpool.ParseConfig
// syntax) configured by ConfigurePool: the pool to give manager.New or New
// when pglease is what the pool is for. Like pgxpool.New it connects
// lazily; close it after the Manager or Store that uses it.
func NewPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	const op = "pg.NewPool"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		// The parse error can quote the connection string, password included.
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "bad connection string", nil)
	}
	if err := ConfigurePool(cfg); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "cannot create pool", err)
	}
	return pool, nil
}
