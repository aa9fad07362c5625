package manager

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
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
// listener probes its connection listenProbeInterval after its last
// statement, with a round trip bounded by listenProbeTimeout, and
// reconnects when the probe fails. Notifications sent meanwhile are lost:
// after reconnecting, every waiting key is tried once (resync).
//
// The probe is due by the clock, not by silence: a listener that keeps
// receiving notifications still sends a statement every
// listenProbeInterval. Receiving is not sending, and the server's
// idle_session_timeout (connx.DefaultLiveness, 25 s), which ends the
// session of a listener whose process stopped, counts only statements;
// a listener that probed only when quiet would be ended by that setting
// while busy, losing the notifications of the gap. The setting stays (a
// stopped process must not pin the server's notification queue); the
// schedule makes sure it never ends a live listener.
const (
	listenProbeInterval = time.Second
	listenProbeTimeout  = time.Second
	// waiterRetryDelay is how soon the listener tries again to take a
	// session lock it could not take (waiters.go).
	waiterRetryDelay = 20 * time.Millisecond
)

// listener is the actor that owns the listening connection: one
// goroutine (run), started by the loop, that LISTENs on the notify
// channel and posts each notification's payload to the loop (notifyCh),
// and holds on its session the locks the loop asks for (sessionLock: for
// now the waiter locks of the keys this process waits for, waiters.go).
// It shares no memory with the loop: the loop hands it the changes of the
// locks it wants through mail, and the listener posts back on notifyCh.
// Every field is owned by run.
type listener struct {
	m    *Manager
	mail <-chan listenerMail      // from the loop (listenerLink)
	want map[sessionLock]struct{} // the locks the loop wants held: every mail applied
	have map[sessionLock]struct{} // the locks the current session holds
	// triggerChecked: the release trigger check answered once
	// (checkReleaseTrigger); it is not asked again.
	triggerChecked bool
}

// startListener starts the listener goroutine (listener.run) and keeps the
// loop's end of its mailbox.
func (st *loopState) startListener() {
	ctx, cancel := context.WithCancel(context.Background())
	mail := make(chan listenerMail)
	done := make(chan struct{})
	st.lis = listenerLink{mail: mail, done: done, stop: cancel}
	l := &listener{m: st.m, mail: mail, want: make(map[sessionLock]struct{}), have: make(map[sessionLock]struct{})}
	go l.run(ctx, done)
}

// run keeps one connection LISTENing on the notify channel. After every
// (re)connect it posts a resync, since notifications sent while it was
// not listening are lost. A connection that fails, or fails its probe, is
// replaced, with backoff, until ctx ends; polling covers the gap.
func (l *listener) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	m := l.m
	bo := newBackOff(retry.Policy{Base: 100 * time.Millisecond, MaxDelay: 5 * time.Second})
	for {
		if l.session(ctx, bo) {
			m.rec.ListenerPolling(errListenPooler.Error() + "; set manager.Config.ListenConnString to a direct connection")
			if m.sig != nil {
				m.sig.polling.signal(struct{}{})
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		// Mail that comes meanwhile is applied: the next session takes
		// what the loop wants then.
		t := time.NewTimer(bo.NextBackOff())
	backoff:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case mail := <-l.mail:
				l.apply(mail)
			case <-t.C:
				break backoff
			}
		}
	}
}

// listenSQL applies the dedicated-connection settings (connx.Liveness:
// the server ends the session of a listener that vanished or stopped
// probing after about 25 s, so that a dead listener's backend, which
// pins PostgreSQL's notification queue, does not stay behind) and
// subscribes to channel, in one simple-protocol round trip.
func listenSQL(channel string, live connx.Liveness) string {
	q := connx.SQL(live.Settings()) + ";\nLISTEN " + pgx.Identifier{channel}.Sanitize()
	if channel != DefaultNotifyChannel {
		// Changes made without a channel (a pg.Store with none, such as
		// one on a caller's transaction) tell watchers on the default
		// channel (the SQL notify function): watch events only are taken
		// from it (watchOnly).
		q += ";\nLISTEN " + pgx.Identifier{DefaultNotifyChannel}.Sanitize()
	}
	return q
}

// watchOnly reports whether a notification on channel is taken only when
// it is a watch event: it came on the default channel, which a Manager
// with another channel listens to for watch events only (listenSQL).
func watchOnly(own, channel string) bool { return channel != own }

// errListenPooler is why the listener stops for good behind a
// transaction-mode pooler.
var errListenPooler = errors.New("the listening connection goes through a transaction-mode pooler " +
	"(its server connection is handed to other clients between transactions), which does not keep a LISTEN")

// session connects, subscribes and posts notifications until the
// connection fails or ctx ends. It returns true when listening can never
// work on this connection config (a transaction-mode pooler): the
// listener then stops for good.
func (l *listener) session(ctx context.Context, bo backoff.BackOff) (stop bool) {
	m := l.m
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
	conn, err := connx.Dial(lctx, cfg)
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
	if shared, err := transactionPooled(lctx, cfg, conn); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	} else if shared {
		db.End(0, pgerr.New(pglease.CodeInvalidArgument, "manager.listen", "transaction-mode pooler", errListenPooler))
		return true
	}
	if !l.triggerChecked {
		// Before the LISTEN, so that the session's last statement stays
		// the LISTEN or the probe (what fault tests look for).
		l.checkReleaseTrigger(lctx, conn)
	}
	live := connx.DefaultLiveness
	if m.test.listenIdleTimeout > 0 {
		live.IdleTimeout = m.test.listenIdleTimeout
	}
	if _, err := conn.Exec(lctx, listenSQL(m.cfg.NotifyChannel, live)); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	// A new session holds no locks: take every one the loop wants
	// before the resync (which tries every waiting key).
	clear(l.have)
	l.drainMail()
	if _, err := l.sync(lctx, conn, false); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	db.End(1, nil)
	m.rec.ListenerUp(true) // pglease.listener.up; 0 again when this session ends
	defer m.rec.ListenerUp(false)
	cancel()
	bo.Reset()
	if !l.post(ctx, notice{resync: true}) {
		return false
	}
	probeEvery, probeTimeout := listenProbeInterval, listenProbeTimeout
	if m.test.listenProbe > 0 {
		probeEvery, probeTimeout = m.test.listenProbe, m.test.listenProbe
	}
	changed := false // mail came: the session's locks may differ from want
	soon := false    // some locks could not be taken: try again soon
	// probeAt is when the next probe is due: probeEvery after the last
	// one, whatever came meanwhile (see listenProbeInterval).
	probeAt := time.Now().Add(probeEvery)
	for {
		if l.drainMail() {
			changed = true
		}
		if changed || soon {
			rctx, cancel := context.WithTimeout(ctx, probeTimeout)
			var err error
			soon, err = l.sync(rctx, conn, true)
			cancel()
			if err != nil {
				l.probeFailed()
				return false
			}
			changed = false
		}
		wait := time.Until(probeAt)
		if soon {
			wait = min(wait, waiterRetryDelay)
		}
		if wait <= 0 {
			// Due, though notifications kept the connection busy.
			if !l.probe(ctx, conn, probeTimeout) {
				return false
			}
			probeAt = time.Now().Add(probeEvery)
			continue
		}
		n, mail, quiet, err := l.wait(ctx, conn, wait)
		if mail != nil {
			l.apply(mail)
			changed = true
		}
		if ctx.Err() != nil {
			return false
		}
		if err != nil && mail != nil && !conn.PgConn().IsClosed() {
			continue // the mail ended the wait: take the locks it asks for
		}
		if err == nil {
			nt := parseNotice(n.Payload)
			if watchOnly(m.cfg.NotifyChannel, n.Channel) && nt.note.Kind != store.NotifyWatch {
				continue
			}
			if !l.post(ctx, nt) {
				return false
			}
			continue
		}
		if !quiet || conn.PgConn().IsClosed() {
			return false // the connection failed: reconnect
		}
		// The wait ended by its deadline (pgconn leaves the connection
		// usable after such a timeout): the probe is due, or the locks
		// are tried again at the top.
	}
}

// probe proves that conn is alive with one round trip bounded by
// timeout; false when it failed (the caller reconnects). Notifications
// that come during it are kept by pgx for the next wait.
//
// A probe that succeeds on a server that turned read-only (a primary
// demoted, or set default_transaction_read_only, without closing its
// connections; a standby) fails too: no write is made there, so no
// notification comes from it, and the reconnect (target_session_attrs,
// if the connection string sets it) finds the writer. The server reports
// both settings with every change (ParameterStatus, PostgreSQL 14+), so
// this costs no round trip.
func (l *listener) probe(ctx context.Context, conn *pgx.Conn, timeout time.Duration) bool {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	_, err := conn.Exec(pctx, "SELECT 1")
	cancel()
	if err != nil {
		l.probeFailed()
		return false
	}
	return !connx.ReadOnly(conn.PgConn())
}

// wait waits up to d for a notification on conn, and ends early when mail
// from the loop comes (returned: the caller applies it). quiet tells that
// the wait ended by its deadline or by the mail, after which pgconn
// leaves the connection usable; any other error means it failed.
func (l *listener) wait(ctx context.Context, conn *pgx.Conn, d time.Duration) (n *pgconn.Notification, mail listenerMail, quiet bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	got := make(chan listenerMail, 1)
	go func() {
		select {
		case mail := <-l.mail:
			got <- mail
			cancel()
		case <-wctx.Done():
			got <- nil
		}
	}()
	n, err = conn.WaitForNotification(wctx)
	quiet = wctx.Err() != nil
	cancel()
	return n, <-got, quiet, err
}

// apply records the loop's latest wishes.
func (l *listener) apply(mail listenerMail) {
	for k, on := range mail {
		if on {
			l.want[k] = struct{}{}
		} else {
			delete(l.want, k)
		}
	}
}

// drainMail applies the mail waiting, if any, and reports whether there
// was some.
func (l *listener) drainMail() bool {
	select {
	case mail := <-l.mail:
		l.apply(mail)
		return true
	default:
		return false
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
func (l *listener) checkReleaseTrigger(ctx context.Context, conn *pgx.Conn) {
	m := l.m
	st, err := store.New("pg.New", conn, store.Config(m.storeCfg))
	if err != nil {
		return
	}
	ok, err := st.ReleaseTriggerInstalled(ctx, m.cfg.NotifyChannel)
	if err != nil {
		return
	}
	l.triggerChecked = true
	m.rec.ReleaseTrigger(ok, m.cfg.NotifyChannel)
	if m.sig != nil {
		m.sig.triggerChecked.signal(ok)
	}
}

// transactionPooled reports whether conn reaches PostgreSQL through a
// pooler that hands its server connection to other clients between
// transactions: one round trip for its backend pid, then
// connx.TransactionPooled.
func transactionPooled(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn) (bool, error) {
	pid, err := connx.BackendPID(ctx, conn)
	if err != nil {
		return false, err
	}
	return connx.TransactionPooled(ctx, cfg, conn, pid)
}

func (l *listener) probeFailed() {
	if l.m.sig != nil {
		l.m.sig.listenerProbeFailed.signal(struct{}{})
	}
}

// parseNotice turns a payload into the loop's notice (off the loop). A
// payload that is not pglease's (another program on the channel) becomes
// an empty notice, which the loop ignores.
func parseNotice(payload string) notice {
	n, ok := store.ParseNotification(payload)
	switch {
	case !ok:
		return notice{}
	case n.Kind == store.NotifyWake:
		return notice{hash: n.KeyHash}
	}
	return notice{note: n}
}

// post hands n to the loop; false when ctx ended first.
func (l *listener) post(ctx context.Context, n notice) bool {
	select {
	case l.m.notifyCh <- n:
		return true
	case <-ctx.Done():
		return false
	}
}
