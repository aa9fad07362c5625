package advisory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/pgerr"
)

// Options tune a Session. The zero value (or a nil *Options) gives the
// defaults; a negative or inconsistent value is InvalidArgument at Open.
//
// The lock connection's own settings are not options: a blocking Lock
// waits on the server in slices of ProbeInterval (lock_timeout), and the
// server frees the locks of a holder that vanished or stopped talking
// after 25 s (TCP keepalives, tcp_user_timeout and idle_session_timeout;
// see the package documentation, "Session guarantees" and "Behind a proxy
// or pooler").
type Options struct {
	// ProbeInterval is how long the session goes without proof that the
	// server still holds it before it checks: a probe is sent
	// ProbeInterval after the last statement the server answered was
	// sent. Together with ProbeTimeout it bounds how late the holder
	// hears of a lost session: see the package documentation, "Session
	// guarantees". Default 1 s. ProbeInterval + ProbeTimeout must be at
	// most 12.5 s, half the 25 s after which the server frees the locks
	// of a holder that stopped talking, so that the holder hears of the
	// loss first.
	ProbeInterval time.Duration
	// ProbeTimeout bounds each probe and every short statement (TryLock,
	// Release). A statement that has no reply by then ends the session:
	// the connection is closed and every held lock reports LockLost.
	// Default 1 s.
	ProbeTimeout time.Duration
	// HoldLimit caps how long each lock of the session is held, so that a
	// stuck holder is told to stop (the designs' 30-second limit). When
	// it passes, the lock's Context ends with a cause matching
	// pglease.ErrHoldLimitExceeded — not ErrLockLost: the lock is still
	// held, and stays held until the holder releases it, so that work
	// stopping at the limit finishes under the lock. A holder that ignores
	// its Context keeps the lock until it releases it or its session ends
	// (the process exits, or stops talking for 25 s). Zero means no
	// limit.
	HoldLimit time.Duration
	// Reentrant lets the session take a key it already holds in the same
	// mode: PostgreSQL stacks the lock and each returned *Lock must be
	// unlocked. Off by default: taking a held key again is
	// InvalidArgument, with no I/O. Taking a key in the other mode than
	// the session holds it (shared while held exclusive, or the reverse)
	// is InvalidArgument with no I/O whether or not Reentrant is set:
	// PostgreSQL would grant it (a session never conflicts with itself),
	// so the key would need one unlock of each kind, and turning a shared
	// hold into an exclusive one waits for every other shared holder and
	// deadlocks with a second session doing the same.
	Reentrant bool

	connSettings // internal defaults; this package's tests change them
}

// connSettings are the lock connection's settings. Zero fields mean the
// defaults (resolve).
type connSettings struct {
	// waitSlice is the session's lock_timeout: a blocking Lock waits on
	// the server in slices this long, freeing the connection between
	// slices for probes, Release and other calls. At most ProbeInterval
	// (a longer slice would keep the probe off the connection past the
	// loss-notice bound); default ProbeInterval; whole milliseconds.
	waitSlice time.Duration
	// keepaliveIdle, keepaliveInterval and keepaliveCount set the server
	// side tcp_keepalives_idle/interval/count of the lock connection, and
	// userTimeout its tcp_user_timeout, so the server drops a silently
	// vanished holder (and frees its locks) after about
	// min(userTimeout, keepaliveIdle + keepaliveInterval × keepaliveCount):
	// by default 25 s. That bound must be at least twice ProbeInterval +
	// ProbeTimeout, so the holder hears of the loss before the server
	// frees its locks (the timely loss signal). Defaults 10 s, 5 s, 4 and
	// 25 s; keepalive times in whole seconds up to 32767 s,
	// keepaliveCount up to 127, userTimeout in whole milliseconds up to
	// 2^31−1 ms (what the server and its TCP stack accept). They have no
	// effect on Unix-socket connections, and none through a TCP proxy or
	// pooler, whose own connection to the server stays alive.
	keepaliveIdle     time.Duration
	keepaliveInterval time.Duration
	keepaliveCount    int
	userTimeout       time.Duration
	// serverIdleTimeout is the lock connection's idle_session_timeout
	// (PostgreSQL 14 and later; ignored before): the server ends the
	// session, freeing its locks, when no statement has arrived for that
	// long. A healthy Session is never idle for longer than ProbeInterval
	// (it probes), so this ends only a holder that stopped talking. Unlike
	// the keepalive settings it works behind a TCP proxy or pooler. It
	// must be at least twice ProbeInterval + ProbeTimeout. Default: the
	// keepalive bound above (25 s by default); whole milliseconds.
	serverIdleTimeout time.Duration
}

func (o *Options) resolve(op string) (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.ProbeInterval < 0 || r.ProbeTimeout < 0 || r.waitSlice < 0 || r.keepaliveIdle < 0 ||
		r.keepaliveInterval < 0 || r.keepaliveCount < 0 || r.userTimeout < 0 || r.serverIdleTimeout < 0 || r.HoldLimit < 0 {
		return r, invalid(op, "negative option")
	}
	r.ProbeInterval = defDur(r.ProbeInterval, time.Second)
	r.ProbeTimeout = defDur(r.ProbeTimeout, time.Second)
	r.waitSlice = defDur(r.waitSlice, r.ProbeInterval)
	dl := connx.DefaultLiveness
	r.keepaliveIdle = defDur(r.keepaliveIdle, dl.KeepaliveIdle)
	r.keepaliveInterval = defDur(r.keepaliveInterval, dl.KeepaliveInterval)
	if r.keepaliveCount == 0 {
		r.keepaliveCount = dl.KeepaliveCount
	}
	r.userTimeout = defDur(r.userTimeout, dl.UserTimeout)
	if r.waitSlice > r.ProbeInterval {
		return r, invalid(op, "the wait slice must not exceed ProbeInterval")
	}
	if r.waitSlice%time.Millisecond != 0 || r.userTimeout%time.Millisecond != 0 || r.serverIdleTimeout%time.Millisecond != 0 {
		return r, invalid(op, "the wait slice, user timeout and server idle timeout must be whole milliseconds")
	}
	if r.keepaliveIdle%time.Second != 0 || r.keepaliveInterval%time.Second != 0 {
		return r, invalid(op, "the keepalive idle time and interval must be whole seconds")
	}
	// The server's limits: tcp_user_timeout, idle_session_timeout and
	// lock_timeout are int milliseconds; Linux refuses
	// TCP_KEEPIDLE/TCP_KEEPINTVL above 32767 s and TCP_KEEPCNT above 127,
	// and PostgreSQL then only logs the failed setsockopt, leaving the
	// session without the keepalive the bounds rely on.
	const serverMax = time.Duration(math.MaxInt32) * time.Millisecond
	if r.userTimeout > serverMax || r.serverIdleTimeout > serverMax || r.waitSlice > serverMax {
		return r, invalid(op, fmt.Sprintf("the user timeout, server idle timeout and wait slice must be at most %v (the server's int32 milliseconds)", serverMax))
	}
	if r.keepaliveIdle > maxKeepalive || r.keepaliveInterval > maxKeepalive || r.keepaliveCount > maxKeepaliveCount {
		return r, invalid(op, fmt.Sprintf("the keepalive idle time and interval must be at most %v and the keepalive count at most %d (what the server's TCP stack accepts)", maxKeepalive, maxKeepaliveCount))
	}
	release := r.liveness().Bound()
	if release < 2*(r.ProbeInterval+r.ProbeTimeout) {
		return r, invalid(op, fmt.Sprintf("ProbeInterval + ProbeTimeout must be at most half of %v, after which the server frees the locks of a holder that stopped talking: the holder must hear of the loss first", release))
	}
	r.serverIdleTimeout = defDur(r.serverIdleTimeout, release)
	if r.serverIdleTimeout < 2*(r.ProbeInterval+r.ProbeTimeout) {
		return r, invalid(op, "the server idle timeout must be at least 2×(ProbeInterval+ProbeTimeout)")
	}
	return r, nil
}

// liveness is the lock connection's connx.Liveness: the dedicated
// connection's defaults unless this package's tests changed them.
func (r Options) liveness() connx.Liveness {
	return connx.Liveness{KeepaliveIdle: r.keepaliveIdle, KeepaliveInterval: r.keepaliveInterval,
		KeepaliveCount: r.keepaliveCount, UserTimeout: r.userTimeout, IdleTimeout: r.serverIdleTimeout}
}

// Linux's limits for TCP_KEEPIDLE/TCP_KEEPINTVL and TCP_KEEPCNT.
const (
	maxKeepalive      = 32767 * time.Second
	maxKeepaliveCount = 127
)

func defDur(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

const (
	stateOpen = iota
	stateLost
	stateClosed
)

// Session holds session-level advisory locks on one dedicated connection
// hijacked from a pool; see the package documentation for what it
// guarantees. Its methods are safe for concurrent use; they take turns on
// the connection.
type Session struct {
	opts Options   // immutable
	pid  uint32    // immutable: the backend pid seen at Open
	conn *pgx.Conn // used only by whoever owns sem

	// sem has one slot: sending into it gives exclusive use of conn.
	sem chan struct{}
	// stmtCtx bounds every statement; it is never a caller's context, so
	// a caller giving up cannot make pgx close the connection. Cancelled
	// when the session ends.
	stmtCtx    context.Context
	stmtCancel context.CancelFunc
	// closing is cancelled when Close starts or the session is lost: the
	// probe stops and an in-flight lock wait is interrupted with a
	// CancelRequest.
	closing       context.Context
	closingCancel context.CancelFunc
	probeDone     chan struct{} // closed by probeLoop on exit
	closeDone     chan struct{} // closed when Close has finished
	// writable: the server was not read-only when the session opened
	// (connx.ReadOnly); a probe that finds it read-only since then ends
	// the session as lost (errDemoted).
	writable bool

	mu    sync.Mutex         // guards the fields below
	state int                // stateOpen, stateLost, stateClosed
	cause error              // why the session was lost
	held  map[Key]holding    // how the server holds each key for us
	locks map[*Lock]struct{} // live handles
	// alive is the latest time (monotonic) at which the server is known
	// to have held the session: the send time of the last statement it
	// answered (its reply came later, so the session was alive then), or
	// for a wait slice that ended with 55P03 its send time + the wait slice.
	// The next probe is due at alive + ProbeInterval.
	alive time.Time
}

// holding is how the server holds one key for a session: n stacked
// locks, all in one mode (precheck refuses the other mode).
type holding struct {
	n      int
	shared bool
}

// Open hijacks a connection from pool for session-level advisory locks
// and starts its probe. The connection never goes back to the pool: Close
// closes it. pool is not closed by the Session.
//
// Open sets, on that connection only: idle_session_timeout = 25 s,
// idle_in_transaction_session_timeout = 0, statement_timeout = 0,
// lock_timeout = ProbeInterval (the wait slice),
// tcp_keepalives_idle/interval/count (10 s, 5 s, 4),
// tcp_user_timeout (25 s) and client_connection_check_interval (5 s)
// (each only if the server knows it), and releases any advisory lock the
// pooled connection already held (pg_advisory_unlock_all). It refuses (InvalidArgument) a
// transaction-mode pooler (pgbouncer pool_mode=transaction), where session
// locks would leak to other clients: when pg_backend_pid() differs between
// two transactions, or, when a pooler answered the connection's start-up
// (its cancel key names another pid than pg_backend_pid(), as PgBouncer's
// does), when a second connection Open makes is handed the same backend.
// A session-mode pooler passes. The pid check is repeated by every probe.
// A pooled connection that the server had already closed (idle timeout,
// restart) is replaced once.
func Open(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Session, error) {
	const op = "advisory.Open"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, invalid(op, "nil pool")
	}
	o, err := opts.resolve(op)
	if err != nil {
		return nil, err
	}
	var (
		conn  *pgx.Conn
		pid   uint32
		alive time.Time
	)
	for try := 1; ; try++ {
		conn, pid, alive, err = open(ctx, pool, o)
		// A pooled connection the server had already closed (an idle
		// timeout, a restart) fails at its first statement, before any
		// lock is taken on it: take another one, once.
		if err == nil || try == 2 || conn == nil || !conn.IsClosed() || ctx.Err() != nil {
			break
		}
		_ = conn.Close(ctx) // already closed: releases nothing but the handle
	}
	if err != nil {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), o.ProbeTimeout)
			_ = conn.Close(cctx)
			cancel()
		}
		return nil, err
	}
	s := &Session{
		opts: o, pid: pid, conn: conn,
		sem:       make(chan struct{}, 1),
		probeDone: make(chan struct{}),
		closeDone: make(chan struct{}),
		held:      map[Key]holding{},
		locks:     map[*Lock]struct{}{},
		alive:     alive,
		writable:  !connx.ReadOnly(conn.PgConn()),
	}
	s.stmtCtx, s.stmtCancel = context.WithCancel(context.Background())
	s.closing, s.closingCancel = context.WithCancel(context.Background())
	go s.probeLoop()
	return s, nil
}

// open hijacks a connection from pool and sets it up (see Open). On an
// error after the hijack it returns the connection too, for the caller to
// close. alive is taken before setup's first statement: the session is
// alive at least since then.
func open(ctx context.Context, pool *pgxpool.Pool, o Options) (conn *pgx.Conn, pid uint32, alive time.Time, err error) {
	const op = "advisory.Open"
	conn, err = connx.Hijack(ctx, pool)
	if err != nil {
		return nil, 0, time.Time{}, mapErr(ctx, op, err)
	}
	alive = time.Now()
	pid, err = setup(ctx, conn, o)
	if err == nil {
		// Behind a pooler (something other than the backend answered the
		// start-up: its cancel key names another pid), refuse it unless
		// it keeps this backend for this client (session mode). The
		// second connection of that check is made from the pool's
		// config, its connect bounded per host.
		var shared bool
		if shared, err = connx.TransactionPooled(ctx, pool.Config().ConnConfig, conn, pid); err == nil && shared {
			err = pgerr.New(pglease.CodeInvalidArgument, op, "transaction-mode pooler detected", errPooler)
		}
		err = mapErr(ctx, op, err)
	}
	return conn, pid, alive, err
}

// errPooler is the cause of a refused Open or a lost session when the
// backend pid changes between transactions.
var errPooler = errors.New("backend pid changed between transactions: a transaction-mode pooler is in front of the database; " +
	"session advisory locks need a direct or session-mode connection")

// setup configures a fresh lock connection; see Open. No lock is held
// yet, so the caller's ctx may run on it.
func setup(ctx context.Context, conn *pgx.Conn, o Options) (uint32, error) {
	const op = "advisory.Open"
	// The dedicated connection's settings (connx.Liveness), and
	// lock_timeout: a blocking Lock waits on the server in slices of
	// waitSlice.
	settings := o.liveness().Settings(connx.Setting{Name: "lock_timeout", Value: strconv.FormatInt(o.waitSlice.Milliseconds(), 10)})
	var pid1, pid2 uint32
	var n int
	err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), ("+connx.SQL(settings)+")").Scan(&pid1, &n)
	if err != nil {
		return 0, mapErr(ctx, op, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		return 0, mapErr(ctx, op, err)
	}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid2); err != nil {
		return 0, mapErr(ctx, op, err)
	}
	if pid1 != pid2 {
		return 0, pgerr.New(pglease.CodeInvalidArgument, op, "transaction-mode pooler detected", errPooler)
	}
	return pid1, nil
}

// BackendPID returns the PostgreSQL backend pid of the session's
// connection, as pg_locks and pg_stat_activity show it.
func (s *Session) BackendPID() int32 { return int32(s.pid) }

// Err returns nil while the session is open, and otherwise the reason it
// ended (an error matching pglease.ErrLockLost or pglease.ErrClosed).
func (s *Session) Err() error {
	if s == nil || s.sem == nil {
		return invalid("advisory.Session.Err", "nil or zero Session (use Open)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endedErrLocked("advisory.Session.Err")
}

func (s *Session) endedErrLocked(op string) error {
	switch s.state {
	case stateLost:
		return pgerr.New(pglease.CodeClosed, op, "session lost its connection; open a new one", s.cause)
	case stateClosed:
		return pgerr.New(pglease.CodeClosed, op, "session closed", nil)
	}
	return nil
}

// check validates the receiver and the session state (no I/O).
func (s *Session) check(op string) error {
	if s == nil || s.sem == nil {
		return invalid(op, "nil or zero Session (use Open)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endedErrLocked(op)
}

// own takes exclusive use of the connection, or gives up when ctx or the
// session ends. The caller must release it with <-s.sem.
func (s *Session) own(ctx context.Context, op string) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended", ctx.Err())
	case <-s.closing.Done():
		return s.check(op)
	}
	if err := s.check(op); err != nil {
		<-s.sem
		return err
	}
	return nil
}

// do runs fn on the connection; the caller owns sem. fn's context comes
// from stmtCtx (never a caller's) with a deadline of bound: past it pgx
// closes the connection, and the caller must then end the session. If
// cancelOn ends first, a CancelRequest interrupts the statement and the
// connection (with its other locks) survives; sent reports that.
func (s *Session) do(cancelOn context.Context, bound time.Duration, fn func(context.Context, *pgx.Conn) error) (sent bool, err error) {
	qctx, qcancel := context.WithTimeout(s.stmtCtx, bound)
	defer qcancel()
	fired := make(chan struct{})
	stop := context.AfterFunc(cancelOn, func() {
		defer close(fired)
		cctx, cancel := context.WithTimeout(qctx, s.opts.ProbeTimeout)
		defer cancel()
		_ = s.conn.PgConn().CancelRequest(cctx)
	})
	sentAt := time.Now()
	err = fn(qctx, s.conn)
	if !stop() {
		// The CancelRequest went out; wait until the server has taken it
		// (CancelRequest reads until the server closes the cancel
		// connection) so it cannot hit a later statement unannounced.
		<-fired
		sent = true
	}
	if err == nil || (sqlState(err) != "" && !s.conn.IsClosed()) {
		// The server answered, so it held the session when it received
		// the statement, after sentAt; a wait slice that ran out (55P03,
		// lock_timeout = the wait slice) proves it for one wait slice
		// longer. Never the reply's arrival time: the session may have
		// died right after the server sent it.
		at := sentAt
		if sqlState(err) == pgerrcode.LockNotAvailable {
			at = at.Add(s.opts.waitSlice)
		}
		s.mu.Lock()
		if at.After(s.alive) {
			s.alive = at
		}
		s.mu.Unlock()
	}
	return sent, err
}

// broken reports whether err left the connection unusable; the caller
// then ends the session with fail.
func (s *Session) broken(err error) bool { return err != nil && s.conn.IsClosed() }

// fail ends the session as lost: every held lock's context is cancelled
// with a LockLost cause, the probe stops and the connection is closed (so
// the server frees whatever it still holds). The caller owns sem.
func (s *Session) fail(cause error) {
	s.mu.Lock()
	if s.state != stateOpen {
		s.mu.Unlock()
		return
	}
	lost := pgerr.New(pglease.CodeLockLost, "advisory.Session", "session ended; its advisory locks are gone", cause)
	s.state, s.cause = stateLost, lost
	locks := s.locks
	s.locks, s.held = map[*Lock]struct{}{}, map[Key]holding{}
	for l := range locks {
		l.endLocked()
	}
	s.mu.Unlock()
	s.closingCancel()
	for l := range locks {
		l.cancel(lost)
	}
	cctx, cancel := context.WithTimeout(context.Background(), s.opts.ProbeTimeout)
	_ = s.conn.Close(cctx)
	cancel()
	s.stmtCancel()
}

// probeDue returns how long until the next probe is due: ProbeInterval
// after the session was last known alive (see Session.alive). Zero or
// negative means due now.
func (s *Session) probeDue() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.ProbeInterval - time.Since(s.alive)
}

// probeLoop sends a probe whenever ProbeInterval has passed since the
// session was last known alive (another statement's answer counts), so
// that a session that died at time t is noticed by t + ProbeInterval +
// ProbeTimeout: the probe due then either gets its answer, fails at once
// (terminated backend, closed connection) or times out. The timer is set
// from the proof of life itself, not from a fixed tick: a tick-based
// check that skips when the last reply is younger than ProbeInterval
// skips every other tick, because the previous probe's reply arrives
// just after its own tick.
func (s *Session) probeLoop() {
	defer close(s.probeDone)
	t := time.NewTimer(s.probeDue())
	defer t.Stop()
	for {
		select {
		case <-s.closing.Done():
			return
		case <-t.C:
		}
		if d := s.probeDue(); d > 0 {
			t.Reset(d) // another statement proved the session alive meanwhile
			continue
		}
		select {
		case s.sem <- struct{}{}:
		case <-s.closing.Done():
			return
		}
		// Check again: the statement that had the connection may have
		// been answered while this waited for it.
		if s.check("") == nil && s.probeDue() <= 0 {
			_ = s.ping("advisory.Session.probe")
		}
		<-s.sem
		t.Reset(max(s.probeDue(), 0))
	}
}

// ping checks the session with one short statement bounded by
// ProbeTimeout (and interrupted by Close); the caller owns sem. A failed
// probe or a changed backend pid ends the session as lost, and ping
// returns the error; a probe interrupted by Close returns the session's
// Closed error (Close cleans up).
func (s *Session) ping(op string) error {
	var pid uint32
	_, err := s.do(s.closing, s.opts.ProbeTimeout, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	})
	switch {
	case s.closing.Err() != nil:
		return s.check(op)
	case err != nil:
		m := mapErr(context.Background(), op, err)
		s.fail(m)
		return m
	case pid != s.pid:
		s.fail(errPooler)
		return s.check(op)
	case s.writable && connx.ReadOnly(s.conn.PgConn()):
		s.fail(errDemoted)
		return s.check(op)
	}
	return nil
}

// errDemoted is the cause of a lost session whose server turned read-only
// under it (a primary demoted, or set default_transaction_read_only,
// without closing its connections): another server is likely the writer
// now, where another session can take the same keys, so this session's
// locks no longer exclude anyone.
var errDemoted = errors.New("the server turned read-only (a demoted primary?): advisory locks held there no longer exclude " +
	"holders on the new primary")

// TryLock takes k if it is free, without waiting: ok is false (and err
// nil) when another session holds it. Taking a key this session already
// holds is InvalidArgument unless Options.Reentrant. A nil or ended ctx,
// an invalid key and a closed session are errors with no I/O.
func (s *Session) TryLock(ctx context.Context, k Key) (l *Lock, ok bool, err error) {
	l, err = s.acquire(ctx, "advisory.Session.TryLock", k, false, false)
	return l, l != nil, err
}

// Lock takes k, waiting as long as ctx allows. When ctx ends first, the
// server-side wait is cancelled with a CancelRequest (the connection and
// the session's other locks are untouched), the lock state is checked
// (a grant that raced the cancel is released) and the error is Aborted
// wrapping ctx.Err(). Waiting is not FIFO across sessions: the wait is
// renewed every wait slice (ProbeInterval). Errors otherwise as TryLock.
func (s *Session) Lock(ctx context.Context, k Key) (*Lock, error) {
	return s.acquire(ctx, "advisory.Session.Lock", k, true, false)
}

// TryLockShared takes k in shared mode if it can without waiting
// (pg_try_advisory_lock_shared). Any number of sessions and transactions
// may hold a key shared at once; a shared hold excludes every exclusive
// one (Lock, TryLock, XactLock, on any session or transaction) and waits
// for it. ok is false (and err nil) when the key is held exclusively, and
// also while another session waits to take it exclusively: PostgreSQL
// queues a shared request behind a waiting exclusive one, so a stream of
// shared holders cannot starve an exclusive taker. The returned Lock is
// released with pg_advisory_unlock_shared, and is watched for loss like
// an exclusive one. A key this session holds exclusively is
// InvalidArgument, and so is one it holds shared unless Options.Reentrant
// (see there). Errors otherwise as TryLock.
func (s *Session) TryLockShared(ctx context.Context, k Key) (l *Lock, ok bool, err error) {
	l, err = s.acquire(ctx, "advisory.Session.TryLockShared", k, false, true)
	return l, l != nil, err
}

// LockShared takes k in shared mode (pg_advisory_lock_shared), waiting as
// long as ctx allows, as Lock does; see TryLockShared for what a shared
// lock excludes and which keys are refused.
func (s *Session) LockShared(ctx context.Context, k Key) (*Lock, error) {
	return s.acquire(ctx, "advisory.Session.LockShared", k, true, true)
}

// precheck validates a key for this session and mode (no I/O): see
// Options.Reentrant.
func (s *Session) precheck(op string, k Key, shared bool) error {
	if !k.valid() {
		return invalid(op, "invalid key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.endedErrLocked(op); err != nil {
		return err
	}
	h := s.held[k]
	switch {
	case h.n == 0:
	case h.shared != shared:
		return invalid(op, "key already held by this session in the other mode (shared or exclusive); release it first")
	case !s.opts.Reentrant:
		return invalid(op, "key already held by this session (Options.Reentrant is off)")
	}
	return nil
}

func (s *Session) acquire(ctx context.Context, op string, k Key, blocking, shared bool) (*Lock, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if err := s.check(op); err != nil {
		return nil, err
	}
	if err := s.precheck(op, k, shared); err != nil {
		return nil, err
	}
	for {
		if err := s.own(ctx, op); err != nil {
			return nil, err
		}
		l, again, err := s.attempt(ctx, op, k, blocking, shared)
		<-s.sem
		if !again {
			return l, err
		}
		if ctx.Err() != nil {
			return nil, pgerr.New(pglease.CodeAborted, op, "gave up waiting for the lock", ctx.Err())
		}
	}
}

func lockSQL(k Key, blocking, shared bool) (string, []any) {
	fn := "pg_try_advisory_lock"
	if blocking {
		fn = "pg_advisory_lock"
	}
	if shared {
		fn += "_shared"
	}
	return keyCall(fn, k)
}

// keyCall returns "SELECT fn(k)::text" with k's arguments: one bigint, or
// the int4 pair.
func keyCall(fn string, k Key) (string, []any) {
	if a, b, ok := k.Pair(); ok {
		return "SELECT " + fn + "($1::int4, $2::int4)::text", []any{a, b}
	}
	id, _ := k.Int64()
	return "SELECT " + fn + "($1::int8)::text", []any{id}
}

// attempt makes one try (or one wait slice of waiting); the caller owns
// sem. again reports a wait slice that ended without the lock.
func (s *Session) attempt(ctx context.Context, op string, k Key, blocking, shared bool) (l *Lock, again bool, err error) {
	if err := s.precheck(op, k, shared); err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	stacking := s.held[k].n > 0
	s.mu.Unlock()
	// The caller's ctx (and Close) may interrupt the statement, except when
	// stacking a held key: that never waits, and after an interruption the
	// server could not tell whether the stack grew.
	cancelOn, stopMerge := context.WithCancel(ctx)
	defer stopMerge()
	if stacking {
		cancelOn = context.Background()
	} else {
		defer context.AfterFunc(s.closing, stopMerge)()
	}
	bound := s.opts.ProbeTimeout
	if blocking {
		bound += s.opts.waitSlice
		// A wait slice keeps the probe off the connection for up to
		// the wait slice + ProbeTimeout. Start one only if it ends before the
		// probe would have given up (alive + ProbeInterval +
		// ProbeTimeout); otherwise probe first, so a session that died
		// just after its last answer is still noticed in time.
		if !stacking && s.probeDue() < s.opts.waitSlice {
			if err := s.ping(op); err != nil {
				return nil, false, err
			}
		}
	}
	q, args := lockSQL(k, blocking, shared)
	var res string
	sent, err := s.do(cancelOn, bound, func(qctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(qctx, q, args...).Scan(&res)
	})
	switch {
	case err == nil:
		if !blocking && res != "true" {
			return nil, false, nil
		}
		if l := s.grant(k, shared); l != nil {
			return l, false, nil
		}
		// Close began: its pg_advisory_unlock_all releases this grant.
		return nil, false, s.check(op)
	case s.broken(err):
		m := mapErr(context.Background(), op, err)
		s.fail(m)
		return nil, false, m
	}
	state := sqlState(err)
	if state == pgerrcode.OutOfMemory || (state != pgerrcode.LockNotAvailable && state != pgerrcode.QueryCanceled) {
		return nil, false, mapErr(context.Background(), op, err)
	}
	// 55P03 (a wait slice ended) or 57014 (cancelled): the grant can race
	// the interruption, and a session lock granted just before the error
	// stays held, so ask the server.
	if stacking {
		return nil, false, mapErr(context.Background(), op, err)
	}
	held, verr := s.serverHolds(op, k, shared)
	if verr != nil {
		return nil, false, verr
	}
	gaveUp := ctx.Err() != nil || s.closing.Err() != nil
	if held && !gaveUp {
		if l := s.grant(k, shared); l != nil {
			return l, false, nil
		}
	}
	if held {
		if _, uerr := s.unlockRaw(op, k, shared); uerr != nil {
			return nil, false, uerr
		}
	}
	switch {
	case s.closing.Err() != nil:
		return nil, false, s.check(op)
	case ctx.Err() != nil:
		return nil, false, pgerr.New(pglease.CodeAborted, op, "gave up waiting for the lock", ctx.Err())
	case state == pgerrcode.LockNotAvailable && blocking && !sent:
		return nil, true, nil
	}
	return nil, false, mapErr(context.Background(), op, err)
}

// grant records a lock the server granted; nil if the session is no
// longer open. The caller owns sem.
func (s *Session) grant(k Key, shared bool) *Lock {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateOpen {
		return nil
	}
	l := &Lock{s: s, key: k, shared: shared}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	s.held[k] = holding{n: s.held[k].n + 1, shared: shared}
	s.locks[l] = struct{}{}
	if d := s.opts.HoldLimit; d > 0 {
		l.limit = time.AfterFunc(d, func() { s.holdLimitPassed(l) })
	}
	return l
}

// holdLimitPassed ends l's Context with the hold-limit cause, unless l
// has ended already; the lock stays held (see Options.HoldLimit).
func (s *Session) holdLimitPassed(l *Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !l.ended { // under mu: a Release, loss or Close that ended l first keeps its cause
		l.cancel(pgerr.New(pglease.CodeHoldLimitExceeded, "advisory.Lock",
			"the lock reached the session's HoldLimit ("+s.opts.HoldLimit.String()+"); stop and release it (it is still held)", nil))
	}
}

// endLocked marks l ended and stops its hold-limit timer; s.mu is held.
func (l *Lock) endLocked() {
	l.ended = true
	if l.limit != nil {
		l.limit.Stop()
	}
}

// serverHolds asks pg_locks whether this session holds k in the given
// mode; the caller owns sem. A stray CancelRequest can hit this
// statement: it is retried.
func (s *Session) serverHolds(op string, k Key, shared bool) (bool, error) {
	classid, objid, objsubid := k.pgLocksIDs()
	mode := "ExclusiveLock"
	if shared {
		mode = "ShareLock"
	}
	var held bool
	var err error
	for range 3 {
		_, err = s.do(context.Background(), s.opts.ProbeTimeout, func(ctx context.Context, c *pgx.Conn) error {
			return c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
				AND pid = pg_backend_pid() AND granted AND classid = $1 AND objid = $2 AND objsubid = $3 AND mode = $4)`,
				classid, objid, objsubid, mode).Scan(&held)
		})
		if err == nil {
			return held, nil
		}
		if s.broken(err) {
			m := mapErr(context.Background(), op, err)
			s.fail(m)
			return false, m
		}
		if sqlState(err) != pgerrcode.QueryCanceled {
			break
		}
	}
	return false, mapErr(context.Background(), op, err)
}

// unlockRaw runs pg_advisory_unlock(k), or pg_advisory_unlock_shared(k);
// the caller owns sem.
func (s *Session) unlockRaw(op string, k Key, shared bool) (bool, error) {
	fn := "pg_advisory_unlock"
	if shared {
		fn += "_shared"
	}
	q, args := keyCall(fn, k)
	var res string
	_, err := s.do(context.Background(), s.opts.ProbeTimeout, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, q, args...).Scan(&res)
	})
	ok := res == "true"
	if s.broken(err) {
		m := mapErr(context.Background(), op, err)
		s.fail(m)
		return false, m
	}
	return ok, mapErr(context.Background(), op, err)
}

func (s *Session) live(l *Lock) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !l.ended && s.state == stateOpen
}

// LockAll takes every key with Lock, in ascending key order (Key.compare:
// int64 space first, then by id), so two callers taking overlapping sets
// cannot deadlock each other. It returns the locks in the order of keys.
// If one Lock fails, the locks already taken are released and the error
// is returned. An empty list, duplicate keys, an invalid key, or a key
// this session holds (without Reentrant) is InvalidArgument with no I/O.
func (s *Session) LockAll(ctx context.Context, keys ...Key) ([]*Lock, error) {
	const op = "advisory.Session.LockAll"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if err := s.check(op); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, invalid(op, "no keys")
	}
	order := make([]int, len(keys))
	for i, k := range keys {
		if err := s.precheck(op, k, false); err != nil {
			return nil, err
		}
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return keys[a].compare(keys[b]) })
	for i := 1; i < len(order); i++ {
		if keys[order[i-1]] == keys[order[i]] {
			return nil, invalid(op, "duplicate key")
		}
	}
	out := make([]*Lock, len(keys))
	for _, i := range order {
		l, err := s.Lock(ctx, keys[i])
		if err != nil {
			for _, got := range out {
				if got != nil {
					_ = got.Release(context.WithoutCancel(ctx))
				}
			}
			return nil, err
		}
		out[i] = l
	}
	return out, nil
}

// cleanupWait bounds how long Close waits for pgx's clean-up of a broken
// connection: its cancel request's dial and acknowledgement, bounded on
// a pool configured by pg.ConfigurePool (connx.BoundCleanup).
const cleanupWait = connx.DefaultConnectTimeout + 2*connx.CleanupAckBound

// awaitCleanup waits until pgx has finished closing the connection. A
// connection that broke (a statement got no answer) is closed by pgconn
// in a goroutine of its own: a cancel request on a new connection, then a
// drain of the socket, bounded only by 15 s. Closing the socket ends the
// drain at once; the cancel request is bounded on a pool configured by
// pg.ConfigurePool, so the goroutine ends within cleanupWait and none
// outlives Close. On another pool Close gives up waiting after
// cleanupWait (or when ctx ends).
func (s *Session) awaitCleanup(ctx context.Context) {
	pc := s.conn.PgConn()
	_ = pc.Conn().Close() // already closed unless pgx is still cleaning up
	t := time.NewTimer(cleanupWait)
	defer t.Stop()
	select {
	case <-pc.CleanupDone():
	case <-t.C:
	case <-ctx.Done():
	}
}

// Close releases every lock (pg_advisory_unlock_all, then closing the
// connection, which frees anything the unlock missed), stops the probe
// and cancels the held locks' contexts with a cause matching
// pglease.ErrClosed. An in-flight Lock is interrupted and returns Closed.
// If ctx ends before the connection is free, the connection is closed
// at once. When the connection broke (a statement got no answer), pgx
// cleans it up in a goroutine of its own (a cancel request on a new
// connection, then a drain); Close ends the drain and waits for that
// goroutine, which on a pool configured by pg.ConfigurePool (pg.NewPool,
// manager.Open) ends within the connect timeout + 2 s, so that no
// goroutine outlives Close. On another pool pgx's cancel request may run
// up to 15 s, and Close stops waiting for it after 4 s (or when ctx
// ends). Close is idempotent; it returns an error only for a nil ctx.
func (s *Session) Close(ctx context.Context) error {
	const op = "advisory.Session.Close"
	if ctx == nil {
		return invalid(op, "nil context")
	}
	if s == nil || s.sem == nil {
		return invalid(op, "nil or zero Session (use Open)")
	}
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		select {
		case <-s.closeDone:
		case <-ctx.Done():
		}
		return nil
	}
	wasOpen := s.state == stateOpen
	s.state = stateClosed
	s.mu.Unlock()
	s.closingCancel()
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		s.stmtCancel() // pgx closes the connection; the statement returns at once
		s.sem <- struct{}{}
	}
	s.mu.Lock()
	locks := s.locks
	s.locks, s.held = map[*Lock]struct{}{}, map[Key]holding{}
	for l := range locks {
		l.endLocked()
	}
	s.mu.Unlock()
	if wasOpen && !s.conn.IsClosed() {
		_, _ = s.do(context.Background(), s.opts.ProbeTimeout, func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SELECT pg_advisory_unlock_all()")
			return err
		})
	}
	cctx, cancel := context.WithTimeout(context.Background(), s.opts.ProbeTimeout)
	_ = s.conn.Close(cctx)
	cancel()
	s.stmtCancel()
	s.awaitCleanup(ctx)
	<-s.sem
	<-s.probeDone
	closed := pgerr.New(pglease.CodeClosed, op, "session closed", nil)
	for l := range locks {
		l.cancel(closed)
	}
	close(s.closeDone)
	return nil
}
