// Package pgrec is the one pgx statement recorder of the tests and the
// benchmarks: it counts the statements started, the statements prepared
// and the network writes (each round trip starts with one) on the
// connections it is installed on, and calls the hooks a test or a
// benchmark gives it for each statement. It does not import testing, so
// that benchmark programs (bench) use it too.
//
// This package is test infrastructure: unstable, for this module only.
package pgrec

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Statement is a statement started on a traced connection.
type Statement struct {
	Conn  *pgx.Conn
	SQL   string
	Args  []any
	Start time.Time // when it was started (before it was sent)
}

// Recorder is a pgx QueryTracer and PrepareTracer. Set its hooks before
// installing it; its counters are safe for concurrent use.
type Recorder struct {
	// OnStart, if set, is called for each statement started, on the
	// goroutine that runs it (so concurrently for a pool).
	OnStart func(Statement)
	// OnEnd, if set, is called when a statement ends, with its error.
	OnEnd func(Statement, error)

	queries, prepares, writes atomic.Int64
}

type stmtKey struct{}

// TraceQueryStart counts the statement and calls OnStart.
func (r *Recorder) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.queries.Add(1)
	if r.OnStart == nil && r.OnEnd == nil {
		return ctx
	}
	st := Statement{Conn: c, SQL: d.SQL, Args: d.Args, Start: time.Now()}
	if r.OnStart != nil {
		r.OnStart(st)
	}
	if r.OnEnd != nil {
		ctx = context.WithValue(ctx, stmtKey{}, st)
	}
	return ctx
}

// TraceQueryEnd calls OnEnd.
func (r *Recorder) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if r.OnEnd == nil {
		return
	}
	if st, ok := ctx.Value(stmtKey{}).(Statement); ok {
		r.OnEnd(st, d.Err)
	}
}

// TracePrepareStart counts the statement prepared.
func (r *Recorder) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.prepares.Add(1)
	return ctx
}

// TracePrepareEnd does nothing.
func (r *Recorder) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// Queries, Prepares and Writes return the counts since the last Reset.
func (r *Recorder) Queries() int64  { return r.queries.Load() }
func (r *Recorder) Prepares() int64 { return r.prepares.Load() }
func (r *Recorder) Writes() int64   { return r.writes.Load() }

// Reset zeroes the counts.
func (r *Recorder) Reset() { r.queries.Store(0); r.prepares.Store(0); r.writes.Store(0) }

// Configure installs r on a pool's connections: as their tracer, and
// around their network connections to count writes. Its type fits the
// configure arguments of pgtest's pool constructors.
func (r *Recorder) Configure(cfg *pgxpool.Config) { r.ConfigureConn(cfg.ConnConfig) }

// ConfigureConn is Configure for one connection's config.
func (r *Recorder) ConfigureConn(cfg *pgx.ConnConfig) {
	cfg.Tracer = r
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{conn, r}, nil
	}
}

type writeCounter struct {
	net.Conn
	r *Recorder
}

func (w writeCounter) Write(b []byte) (int, error) {
	w.r.writes.Add(1)
	return w.Conn.Write(b)
}
