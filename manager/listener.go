package manager

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/backoff"
	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/retry"
)

// The listener's liveness settings. A connection can die without a word:
// half-open (the server side is gone, a NAT or proxy dropped its state,
// the client side stays open and silent) or blackholed. WaitForNotification
// then blocks forever and the Manager silently loses its wake-ups, so the
// listener probes its connection whenever it has been quiet for
// listenProbeInterval, with a round trip bounded by listenProbeTimeout, and
// reconnects when the probe fails. Notifications sent meanwhile are lost:
// after reconnecting, every waiting key is tried once (resync).
const (
	listenProbeInterval = time.Second
	listenProbeTimeout  = time.Second
	// waiterRetryDelay is how soon the listener tries again to take a
	// waiter lock it could not take (waiters.go).
	waiterRetryDelay = 20 * time.Millisecond
)

// listenServerSettings are session settings of the listening connection,
// each set only if the server has it: the server drops the session of a
// client that vanished silently after about 25 s (keepalives, unacked
// data), and a listener that stops probing is ended after 30 s idle, so a
// dead listener's backend does not stay behind (a listener backend that
// never reads pins PostgreSQL's notification queue). The probe keeps a
// live listener from ever being idle that long.
var listenServerSettings = [][2]string{
	{"tcp_keepalives_idle", "10"},
	{"tcp_keepalives_interval", "5"},
	{"tcp_keepalives_count", "3"},
	{"tcp_user_timeout", "25000"},
	{"idle_session_timeout", "30000"},
	{"idle_in_transaction_session_timeout", "0"},
	{"statement_timeout", "0"},
}

// startListener starts the goroutine that LISTENs for release
// notifications on one dedicated connection.
func (st *loopState) startListener() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	st.listenerDone, st.stopListener = done, cancel
	go st.m.listen(ctx, done)
}

// listen keeps one connection LISTENing on the notify channel and posts
// each notification's payload (a key hash) to run. After every
// (re)connect it posts a resync, since notifications sent while it was
// not listening are lost. A connection that fails, or fails its probe, is
// replaced, with backoff, until ctx ends; polling covers the gap.
func (m *Manager) listen(ctx context.Context, done chan struct{}) {
	defer close(done)
	bo := backoff.New(retry.Policy{Base: 100 * time.Millisecond, MaxDelay: 5 * time.Second}, backoff.Options{})
	for {
		if m.listenOnce(ctx, bo) {
			m.rec.ListenerPolling(errListenPooler.Error() + "; set manager.Config.ListenConnString to a direct connection")
			if m.sig != nil {
				m.sig.polling.signal(struct{}{})
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// listenSQL subscribes to channel and applies listenServerSettings, in one
// simple-protocol round trip.
func listenSQL(channel string) string {
	sql := "SELECT set_config(s.name, s.value, false) FROM (VALUES "
	for i, kv := range listenServerSettings {
		if i > 0 {
			sql += ", "
		}
		sql += "('" + kv[0] + "', '" + kv[1] + "')"
	}
	return sql + ") AS s(name, value) WHERE s.name IN (SELECT name FROM pg_settings);\nLISTEN " + pgx.Identifier{channel}.Sanitize()
}

// errListenPooler is why the listener stops for good behind a
// transaction-mode pooler.
var errListenPooler = errors.New("the listening connection goes through a transaction-mode pooler " +
	"(its server connection is handed to other clients between transactions), which does not keep a LISTEN")

// listenOnce connects, subscribes and posts notifications until the
// connection fails or ctx ends. It returns true when listening can never
// work on this connection config (a transaction-mode pooler): the
// listener then stops for good.
func (m *Manager) listenOnce(ctx context.Context, bo *backoff.Backoff) (stop bool) {
	// The pglease.listen span covers connecting and subscribing, not the
	// wait for notifications. Both are bounded: a silent server must not
	// hold the listener in a connect that never ends, and each host's
	// connect is bounded (m.listenCfg), so that a multi-host connection
	// string moves on from a host that stopped answering.
	cfg := m.listenCfg.Copy()
	if m.test.listenConfig != nil {
		m.test.listenConfig(cfg)
	}
	bound := m.cfg.StatementTimeout + time.Duration(connx.Hosts(&cfg.Config))*cfg.ConnectTimeout
	sctx, cancel := context.WithTimeoutCause(ctx, bound, pgerr.ErrStatementTimeout)
	defer cancel()
	lctx, db := m.rec.StartDB(sctx, obs.OpListen, 1, trace.SpanContext{})
	conn, err := pgx.ConnectConfig(lctx, cfg)
	if err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// Before any session setting: behind a transaction-mode pooler they
	// would stay on a server connection other clients get next.
	if shared, err := sharedListenBackend(lctx, cfg, conn); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	} else if shared {
		db.End(0, pgerr.New(pglease.CodeInvalidArgument, "manager.listen", "transaction-mode pooler", errListenPooler))
		return true
	}
	if !m.triggerChecked.Load() {
		// Before the LISTEN, so that the session's last statement stays
		// the LISTEN or the probe (what fault tests look for).
		m.checkReleaseTrigger(lctx, conn)
	}
	if _, err := conn.Exec(lctx, listenSQL(m.cfg.NotifyChannel)); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	// A new session holds no waiter locks: take them all before the
	// resync (which tries every waiting key).
	have := make(map[string]struct{})
	if _, err := m.registerWaiters(lctx, conn, have, false); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	db.End(1, nil)
	cancel()
	bo.Reset()
	if !m.post(ctx, notice{resync: true}) {
		return false
	}
	probeEvery, probeTimeout := listenProbeInterval, listenProbeTimeout
	if m.test.listenProbe > 0 {
		probeEvery, probeTimeout = m.test.listenProbe, m.test.listenProbe
	}
	soon := false // some waiter locks could not be taken: try again soon
	for {
		if soon || m.waiters.isDirty() {
			rctx, cancel := context.WithTimeout(ctx, probeTimeout)
			var err error
			soon, err = m.registerWaiters(rctx, conn, have, true)
			cancel()
			if err != nil {
				m.sigListenerProbeFailed()
				return false
			}
		}
		wait := probeEvery
		if soon {
			wait = min(wait, waiterRetryDelay)
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		// A registration asked for ends the wait (the connection stays
		// usable: pgconn ends a wait by deadline, as for the timeout).
		if !m.waiters.beginWait(cancel) {
			cancel()
			continue
		}
		n, err := conn.WaitForNotification(wctx)
		quiet := wctx.Err() != nil
		interrupted := m.waiters.endWait()
		cancel()
		if ctx.Err() != nil {
			return false
		}
		if err != nil && interrupted && !conn.PgConn().IsClosed() {
			continue
		}
		if err == nil {
			if !m.post(ctx, notice{hash: n.Payload}) {
				return false
			}
			continue
		}
		if !quiet || conn.PgConn().IsClosed() {
			return false // the connection failed: reconnect
		}
		// Quiet for probeEvery (pgconn leaves the connection usable after
		// such a timeout): prove that it is alive.
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		_, err = conn.Exec(pctx, "SELECT 1")
		cancel()
		if err != nil {
			m.sigListenerProbeFailed()
			return false
		}
	}
}

// checkReleaseTrigger asks, once per Manager, whether the lock table has
// the release trigger for the notify channel, on the listening
// connection (not the pool, whose statements callers count), and reports
// it as pglease.release_trigger.installed. When it has not, SyncGuard's
// releases wake waiters here only by polling: one Info log record says so
// (not a warning: a fleet without SyncGuard processes does not need the
// trigger). A failed check (privileges, a lost connection) is tried again
// at the next connect.
func (m *Manager) checkReleaseTrigger(ctx context.Context, conn *pgx.Conn) {
	st, err := store.New("pg.New", conn, store.Config(m.storeCfg))
	if err != nil {
		return
	}
	ok, err := st.ReleaseTriggerInstalled(ctx, m.cfg.NotifyChannel)
	if err != nil || m.triggerChecked.Swap(true) {
		return
	}
	m.rec.ReleaseTrigger(ok, m.cfg.NotifyChannel)
	if m.sig != nil {
		m.sig.triggerChecked.signal(ok)
	}
}

// sharedListenBackend reports whether conn reaches PostgreSQL through a
// pooler that hands its server connection to other clients between
// transactions. A connection whose start-up the backend answered itself
// (its cancel key names pg_backend_pid()) costs one round trip to check;
// only behind a pooler does the check open a second connection.
func sharedListenBackend(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn) (bool, error) {
	pid, err := connx.BackendPID(ctx, conn)
	if err != nil || !connx.Pooled(conn, pid) {
		return false, err
	}
	return connx.SharedBackend(ctx, cfg, conn, pid)
}

func (m *Manager) sigListenerProbeFailed() {
	if m.sig != nil {
		m.sig.listenerProbeFailed.signal(struct{}{})
	}
}

func (m *Manager) post(ctx context.Context, n notice) bool {
	select {
	case m.notifyCh <- n:
		return true
	case <-ctx.Done():
		return false
	}
}
