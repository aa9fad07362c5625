package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
)

// serverProbe reads what the fleet scenario measures on the server side:
// pg_stat_database, the WAL position, pg_stat_activity, pg_locks, the
// lease tables' sizes, and the cluster's CPU time from /proc when the
// server runs on this machine.
type serverProbe struct {
	pool                  *pgxpool.Pool
	app, listenApp        string // application_name of the fleet's pools and listeners
	lockTable, fenceTable string // schema-qualified, quoted
	postmaster            int    // 0: CPU unknown (server not local, or not Linux)
}

func newServerProbe(ctx context.Context, pool *pgxpool.Pool, app, schema string) (*serverProbe, error) {
	p := &serverProbe{pool: pool, app: app, listenApp: app + "-listen",
		lockTable:  pgx.Identifier{schema, store.DefaultLockTable}.Sanitize(),
		fenceTable: pgx.Identifier{schema, store.DefaultFenceTable}.Sanitize()}
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return nil, err
	}
	p.postmaster = postmasterOf(pid)
	return p, nil
}

// serverSnap is the server's cumulative counters at one moment.
type serverSnap struct {
	at       time.Time
	xacts    int64 // xact_commit + xact_rollback of this database
	walBytes int64 // pg_current_wal_lsn as a byte position
	cpuTicks int64 // the cluster's user+system CPU time, 1/userHZ s; -1 unknown
}

func (p *serverProbe) snap(ctx context.Context) (serverSnap, error) {
	var s serverSnap
	var lsn string
	err := p.pool.QueryRow(ctx, `SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()),
		pg_current_wal_lsn()::text`).Scan(&s.xacts, &lsn)
	if err != nil {
		return s, err
	}
	s.at = time.Now()
	if s.walBytes, err = parseLSN(lsn); err != nil {
		return s, err
	}
	s.cpuTicks = -1
	if p.postmaster != 0 {
		if t, ok := clusterCPUTicks(p.postmaster); ok {
			s.cpuTicks = t
		}
	}
	return s, nil
}

// parseLSN turns "16/B374D848" into a byte position.
func parseLSN(s string) (int64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("bad LSN %q", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad LSN %q", s)
	}
	return int64(h<<32 | l), nil
}

// serverCounts are the sampled gauges.
type serverCounts struct {
	conns, listen, clients int64 // the fleet's pool connections + listeners; its listeners; all client backends of the database
	advisory, locks        int64 // pg_locks: advisory locks of this database; all rows
	lockRows, fenceRows    int64 // rows of the lease tables (-1 when not asked)
}

// counts samples the gauges; with tables, the lease tables' row counts too.
//
// The fleet's connections are told apart by application_name: the
// workers set one on their pools and another on their listening
// connections (fleetManager). pg_stat_activity cannot tell a LISTEN
// backend otherwise: its last statement may be the listener's probe
// (SELECT 1) or a waiter lock, and pg_listening_channels() answers only
// for the session that asks.
func (p *serverProbe) counts(ctx context.Context, tables bool) (serverCounts, error) {
	var c serverCounts
	err := p.pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE application_name IN ($1, $2)),
		count(*) FILTER (WHERE application_name = $2),
		count(*) FILTER (WHERE backend_type = 'client backend' AND datname = current_database()),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
		(SELECT count(*) FROM pg_locks)
		FROM pg_stat_activity`, p.app, p.listenApp).Scan(&c.conns, &c.listen, &c.clients, &c.advisory, &c.locks)
	if err != nil {
		return c, err
	}
	c.lockRows, c.fenceRows = -1, -1
	if tables {
		err = p.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+p.lockTable+"), (SELECT count(*) FROM "+p.fenceTable+")").
			Scan(&c.lockRows, &c.fenceRows)
	}
	return c, err
}

// connBudget returns how many more client connections the server accepts
// (max_connections less the superuser-reserved ones and those in use).
func connBudget(ctx context.Context, url string) (int, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int
	err = c.QueryRow(ctx, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&n)
	return n, err
}

// notifyObserver LISTENs on the fleet's channel and its 256 wake
// channels (store.WakeChannel) on a connection of its own and counts the
// notifications: every NOTIFY the fleet's releases send (PostgreSQL
// delivers each one to every session listening on its channel, this one
// included; duplicates within one transaction are folded, for every
// listener alike).
type notifyObserver struct {
	n      atomic.Int64
	failed atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
}

func startObserver(ctx context.Context, url, channel string) (*notifyObserver, error) {
	cs, err := withConnParams(url, [][2]string{{"application_name", "pglease-fleet-observer"}})
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, cs)
	if err != nil {
		return nil, err
	}
	q := "LISTEN " + pgx.Identifier{channel}.Sanitize()
	for i := range 256 {
		q += "; LISTEN " + pgx.Identifier{fmt.Sprintf("%s.%02x", channel, i)}.Sanitize()
	}
	if _, err := conn.Exec(ctx, q); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	octx, cancel := context.WithCancel(context.Background())
	o := &notifyObserver{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		defer conn.Close(context.Background())
		for {
			if _, err := conn.WaitForNotification(octx); err != nil {
				if octx.Err() == nil {
					o.failed.Store(true)
				}
				return
			}
			o.n.Add(1)
		}
	}()
	return o, nil
}

// count returns the notifications seen so far; an error if the observer's
// connection failed (its count is then short).
func (o *notifyObserver) count() (int64, error) {
	if o.failed.Load() {
		return 0, errors.New("the notification observer's connection failed")
	}
	return o.n.Load(), nil
}

func (o *notifyObserver) close() {
	o.cancel()
	<-o.done
}

// procStat is what the bench reads of /proc/<pid>/stat.
type procStat struct {
	comm  string
	ppid  int
	ticks int64 // utime + stime + cutime + cstime
}

// readProcStat reads /proc/<pid>/stat (false where there is none).
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	return parseProcStat(string(b))
}

// parseProcStat parses one /proc/<pid>/stat line: "pid (comm) state ppid
// … utime stime cutime cstime …" (fields 14-17); comm may hold spaces and
// parentheses, so the fields after it are found from the last ')'.
func parseProcStat(s string) (procStat, bool) {
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return procStat{}, false
	}
	f := strings.Fields(s[closing+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return procStat{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, false
	}
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // fields 14-17
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return procStat{}, false
		}
		ticks += v
	}
	return procStat{comm: s[open+1 : closing], ppid: ppid, ticks: ticks}, true
}

func isPostgresComm(c string) bool { return c == "postgres" || c == "postmaster" }
