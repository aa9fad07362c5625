package notifier

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

// The service's liveness settings. A connection can die without a word:
// half-open (the server side is gone, a NAT or proxy dropped its state,
// the client side stays open and silent) or blackholed. WaitForNotification
// then blocks forever and the Manager silently loses its wake-ups, so the
// service probes its connection ProbeInterval after its last probe, with
// a round trip bounded by ProbeTimeout, and reconnects when the probe
// fails. Notifications sent meanwhile are lost: after reconnecting, the
// service posts a resync (every waiting key is tried once, every watched
// key read again).
//
// The probe is due by the clock, not by silence: a service that keeps
// receiving notifications still sends a statement every ProbeInterval.
// Receiving is not sending, and the server's idle_session_timeout
// (connx.DefaultLiveness, 25 s), which ends the session of a listener
// whose process stopped, counts only statements; a listener that probed
// only when quiet would be ended by that setting while busy, losing the
// notifications of the gap. The setting stays (a stopped process must not
// pin the server's notification queue); the schedule makes sure it never
// ends a live listener.
//
// A Manager that waits for nothing (no caller waiting, no ticket, no
// watch: no Active subscription) probes every IdleProbeInterval instead:
// a dead listener then delays only what nobody waits for (a revoke
// notice, which the holder's next extend also brings; a release
// request), and the probe, a round trip, is half of what an idle Manager
// holding leases costs its process. IdleProbeInterval stays well under
// idle_session_timeout (the Manager's Liveness.IdleTimeout / 3 at most).
const (
	ProbeInterval     = time.Second
	IdleProbeInterval = 5 * time.Second
	ProbeTimeout      = time.Second
	// retryDelay is how soon the service tries again to take a
	// subscription's session lock it could not take.
	retryDelay = 20 * time.Millisecond
)

// Config is what the service needs from its Manager. Immutable.
type Config struct {
	// Conn is the listening connection's config (copied per session).
	Conn *pgx.ConnConfig
	// Channel is the Manager's notify channel; DefaultChannel the one the
	// SQL functions notify on when given none (watch events only are
	// taken from it when Channel differs).
	Channel, DefaultChannel string
	// QueueChannel, if set, is the process's own fair-queue channel
	// (store.QueueChannel): LISTENed on too; its payloads are Turn
	// notices.
	QueueChannel string
	// StatementTimeout bounds connecting (with each host's connect
	// timeout) and subscribing.
	StatementTimeout time.Duration
	// Store is the Store config of the release trigger check.
	Store store.Config
	// Rec records the pglease.listen span and the listener's gauges.
	Rec *obs.Recorder
	// Liveness is the session's server-side liveness
	// (connx.DefaultLiveness unless a test says otherwise).
	Liveness connx.Liveness
	// ProbeEvery and ProbeTimeout: ProbeInterval and ProbeTimeout unless
	// a test says otherwise. IdleProbeEvery (at least ProbeEvery) is the
	// probe interval while the loop wants no Active subscription.
	ProbeEvery, ProbeTimeout, IdleProbeEvery time.Duration

	// Hooks, each optional: a test's connection config change (before
	// each connect), and the Manager's test signals.
	ConfigureConn  func(*pgx.ConnConfig)
	Polling        func() // stopped for good (a transaction-mode pooler)
	TriggerChecked func(installed bool)
	ProbeFailed    func() // a probe failed: the service reconnects
	Probed         func() // a probe was sent (tests count them)
}

// errPooler is why the service stops for good behind a transaction-mode
// pooler.
var errPooler = errors.New("the listening connection goes through a transaction-mode pooler " +
	"(its server connection is handed to other clients between transactions), which does not keep a LISTEN")

// service is the goroutine that owns the listening connection (run). It
// shares no memory with the loop: the loop hands it the changes of the
// subscriptions it wants through mail (Link), and it posts back on out.
// Every field is owned by run.
type service struct {
	cfg  Config
	out  chan<- Notice
	mail <-chan Mail
	want map[Sub]struct{} // the subscriptions the loop wants held: every mail applied
	have map[Sub]struct{} // the subscriptions the current session holds
	// listening is the wake channels the current session LISTENs to (at
	// most 256), and wakeRefs how many held Wake subscriptions each has.
	listening map[string]struct{}
	wakeRefs  map[string]int
	// triggerChecked: the release trigger check answered once
	// (checkReleaseTrigger); it is not asked again.
	triggerChecked bool
}

// run keeps one connection LISTENing on the notify channel. After every
// (re)connect it posts a resync, since notifications sent while it was
// not listening are lost. A connection that fails, or fails its probe, is
// replaced, with backoff, until ctx ends; polling covers the gap.
func (s *service) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	bo, err := retry.Policy{Base: 100 * time.Millisecond, MaxDelay: 5 * time.Second}.NewBackOff()
	if err != nil {
		panic(err) // a constant policy
	}
	for {
		if s.session(ctx, bo) {
			s.cfg.Rec.ListenerPolling(errPooler.Error() + "; set manager.Config.ListenConnString to a direct connection")
			if s.cfg.Polling != nil {
				s.cfg.Polling()
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
			case mail := <-s.mail:
				s.apply(mail)
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
// subscribes to the channel, in one simple-protocol round trip.
func (c *Config) listenSQL() string {
	q := connx.SQL(c.Liveness.Settings()) + ";\nLISTEN " + pgx.Identifier{c.Channel}.Sanitize()
	if c.Channel != c.DefaultChannel {
		// Changes made without a channel (a pg.Store with none, such as
		// one on a caller's transaction) tell watchers on the default
		// channel (the SQL notify function): watch events only are taken
		// from it (watchOnly).
		q += ";\nLISTEN " + pgx.Identifier{c.DefaultChannel}.Sanitize()
	}
	if c.QueueChannel != "" {
		q += ";\nLISTEN " + pgx.Identifier{c.QueueChannel}.Sanitize()
	}
	return q
}

// watchOnly reports whether a notification on channel is taken only when
// it is a watch event: it came on the default channel, which a Manager
// with another channel listens to for watch events only (listenSQL).
// Wake-ups come on the Manager's wake channels (store.WakeChannel), and
// on its channel itself from functions of an older schema and release
// triggers installed before wake channels.
func (c *Config) watchOnly(channel string) bool {
	return channel == c.DefaultChannel && c.Channel != c.DefaultChannel
}

// session connects, subscribes and posts notifications until the
// connection fails or ctx ends. It returns true when listening can never
// work on this connection config (a transaction-mode pooler): the
// service then stops for good.
func (s *service) session(ctx context.Context, bo backoff.BackOff) (stop bool) {
	c := &s.cfg
	// The pglease.listen span covers connecting and subscribing, not the
	// wait for notifications. Both are bounded: a silent server must not
	// hold the service in a connect that never ends, and each host's
	// connect is bounded (Config.Conn), so that a multi-host connection
	// string moves on from a host that stopped answering.
	cfg := c.Conn.Copy()
	if c.ConfigureConn != nil {
		c.ConfigureConn(cfg)
	}
	bound := c.StatementTimeout + time.Duration(connx.Hosts(&cfg.Config))*cfg.ConnectTimeout
	sctx, cancel := context.WithTimeoutCause(ctx, bound, pgerr.ErrStatementTimeout)
	defer cancel()
	lctx, db := c.Rec.StartDB(sctx, obs.OpListen, 1, trace.SpanContext{})
	conn, err := connx.Dial(lctx, cfg)
	if err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
		endSession(conn.PgConn())
	}()
	// Before any session setting: behind a transaction-mode pooler they
	// would stay on a server connection other clients get next.
	if shared, err := transactionPooled(lctx, cfg, conn); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	} else if shared {
		db.End(0, pgerr.New(pglease.CodeInvalidArgument, "manager.listen", "transaction-mode pooler", errPooler))
		return true
	}
	if !s.triggerChecked {
		// Before the LISTEN, so that the session's last statement stays
		// the LISTEN or the probe (what fault tests look for).
		s.checkReleaseTrigger(lctx, conn)
	}
	if _, err := conn.Exec(lctx, c.listenSQL()); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	// A new session holds no locks: take every one the loop wants
	// before the resync (which tries every waiting key).
	clear(s.have)
	s.listening, s.wakeRefs = nil, nil
	s.drainMail()
	if _, err := s.sync(lctx, conn, false); err != nil {
		db.End(0, pgerr.Map(sctx, "manager.listen", err))
		return false
	}
	db.End(1, nil)
	c.Rec.ListenerUp(true) // pglease.listener.up; 0 again when this session ends
	defer c.Rec.ListenerUp(false)
	cancel()
	bo.Reset()
	if !s.post(ctx, Notice{Resync: true}) {
		return false
	}
	probeTimeout := c.ProbeTimeout
	changed := false // mail came: the session's locks may differ from want
	soon := false    // some locks could not be taken: try again soon
	// The next probe is due s.probeEvery() after the last one, whatever
	// came meanwhile (see ProbeInterval); an Active subscription that
	// comes makes it due sooner.
	probed := time.Now()
	for {
		if s.drainMail() {
			changed = true
		}
		if changed || soon {
			rctx, cancel := context.WithTimeout(ctx, probeTimeout)
			var err error
			soon, err = s.sync(rctx, conn, true)
			cancel()
			if err != nil {
				s.probeFailed()
				return false
			}
			changed = false
		}
		wait := time.Until(probed.Add(s.probeEvery()))
		if soon {
			wait = min(wait, retryDelay)
		}
		if wait <= 0 {
			// Due, though notifications kept the connection busy.
			if !s.probe(ctx, conn, probeTimeout) {
				return false
			}
			probed = time.Now()
			continue
		}
		n, mail, quiet, err := s.wait(ctx, conn, wait)
		if mail != nil {
			s.apply(mail)
			changed = true
		}
		if ctx.Err() != nil {
			return false
		}
		if err != nil && mail != nil && !conn.PgConn().IsClosed() {
			continue // the mail ended the wait: take the locks it asks for
		}
		if err == nil {
			var nt Notice
			var ok bool
			if c.QueueChannel != "" && n.Channel == c.QueueChannel {
				nt, ok = ParseTurn(n.Payload)
			} else {
				nt, ok = Parse(n.Payload)
			}
			if !ok || (nt.Topic != Turn && c.watchOnly(n.Channel) && nt.Topic != Watch) {
				continue // not pglease's, or not a watch event on the default channel
			}
			if !s.post(ctx, nt) {
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
func (s *service) probe(ctx context.Context, conn *pgx.Conn, timeout time.Duration) bool {
	if s.cfg.Probed != nil {
		s.cfg.Probed()
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	_, err := conn.Exec(pctx, "SELECT 1")
	cancel()
	if err != nil {
		s.probeFailed()
		return false
	}
	return !connx.ReadOnly(conn.PgConn())
}

// wait waits up to d for a notification on conn, and ends early when mail
// from the loop comes (returned: the caller applies it). quiet tells that
// the wait ended by its deadline or by the mail, after which pgconn
// leaves the connection usable; any other error means it failed.
func (s *service) wait(ctx context.Context, conn *pgx.Conn, d time.Duration) (n *pgconn.Notification, mail Mail, quiet bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	got := make(chan Mail, 1)
	go func() {
		select {
		case mail := <-s.mail:
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

// probeEvery is the probe interval the loop's wishes call for.
func (s *service) probeEvery() time.Duration {
	if _, ok := s.want[Sub{Topic: Active}]; ok || s.cfg.IdleProbeEvery < s.cfg.ProbeEvery {
		return s.cfg.ProbeEvery
	}
	return s.cfg.IdleProbeEvery
}

// apply records the loop's latest wishes.
func (s *service) apply(mail Mail) {
	for k, on := range mail {
		if on {
			s.want[k] = struct{}{}
		} else {
			delete(s.want, k)
		}
	}
}

// drainMail applies the mail waiting, if any, and reports whether there
// was some.
func (s *service) drainMail() bool {
	select {
	case mail := <-s.mail:
		s.apply(mail)
		return true
	default:
		return false
	}
}

// sessionLocks take and drop the session locks of each keyed topic's
// subscriptions, on the listening connection, one round trip each. take
// reports per key whether the lock was taken (false: held exclusively at
// that instant, to be tried again soon).
// Wake subscriptions also LISTEN to their keys' wake channels
// (store.WakeChannel) in the same round trips: channels is the LISTENs
// for take, the UNLISTENs for drop.
var sessionLocks = [...]struct {
	take func(ctx context.Context, conn *pgx.Conn, keys []string, channels ...string) ([]bool, error)
	drop func(ctx context.Context, conn *pgx.Conn, keys []string, channels ...string) error
}{
	Wake: {take: store.RegisterWaiters, drop: store.UnregisterWaiters},
	Watch: {
		take: func(ctx context.Context, conn *pgx.Conn, keys []string, _ ...string) ([]bool, error) {
			return store.RegisterWatchers(ctx, conn, keys)
		},
		drop: func(ctx context.Context, conn *pgx.Conn, keys []string, _ ...string) error {
			return store.UnregisterWatchers(ctx, conn, keys)
		},
	},
}

// wakeChannels returns what a sync that drops the held Wake keys drop
// and tries add changes in the wake channels LISTENed to: those to LISTEN
// to (add's that are not), and those to UNLISTEN (no held key left on
// them, and none being tried). A channel whose key's take failed stays
// LISTENed to while the loop wants the key (it is tried again). Its cost
// is in the keys that change and the (at most 256) channels, not in the
// keys held.
func (s *service) wakeChannels(drop, add []string) (listen, unlisten []string) {
	if s.wakeRefs == nil {
		s.listening, s.wakeRefs = make(map[string]struct{}), make(map[string]int)
	}
	for _, k := range drop {
		ch := s.wakeChannel(k)
		if s.wakeRefs[ch]--; s.wakeRefs[ch] <= 0 {
			delete(s.wakeRefs, ch)
		}
	}
	adding := make(map[string]struct{}, len(add))
	for _, k := range add {
		ch := s.wakeChannel(k)
		if _, ok := s.listening[ch]; !ok {
			if _, dup := adding[ch]; !dup {
				listen = append(listen, ch)
			}
		}
		adding[ch] = struct{}{}
	}
	for ch := range s.listening {
		if _, held := s.wakeRefs[ch]; !held {
			if _, trying := adding[ch]; !trying {
				unlisten = append(unlisten, ch)
			}
		}
	}
	return listen, unlisten
}

// wakeChannel is the wake channel of the NFC key.
func (s *service) wakeChannel(key string) string {
	return store.WakeChannel(s.cfg.Channel, pglease.HashKey(key))
}

// sync brings the session's locks (have) to what the loop wants, and,
// with post, posts the subscriptions it took to the loop. Locks held
// exclusively at that instant are left for the next round (retrySoon:
// the service comes back after retryDelay). An error means the
// connection failed.
func (s *service) sync(ctx context.Context, conn *pgx.Conn, post bool) (retrySoon bool, err error) {
	var add, drop [len(sessionLocks)][]string
	for k := range s.want {
		if _, ok := s.have[k]; !ok && k.Topic.keyed() {
			add[k.Topic] = append(add[k.Topic], k.Key)
		}
	}
	for k := range s.have {
		if _, ok := s.want[k]; !ok {
			drop[k.Topic] = append(drop[k.Topic], k.Key)
		}
	}
	// A wake channel is listened to while a Wake subscription of one of
	// its keys is held or being tried (a take that failed keeps it until
	// the loop no longer wants the key).
	listen, unlisten := s.wakeChannels(drop[Wake], add[Wake])
	var got []Sub
	for c, fns := range sessionLocks {
		t := Topic(c)
		var on, off []string
		if t == Wake {
			on, off = listen, unlisten
		}
		if len(drop[c]) > 0 || len(off) > 0 {
			if err := fns.drop(ctx, conn, drop[c], off...); err != nil {
				return false, err
			}
			for _, k := range drop[c] {
				delete(s.have, Sub{t, k})
			}
		}
		for _, ch := range off {
			delete(s.listening, ch)
		}
		if len(add[c]) == 0 {
			continue
		}
		ok, err := fns.take(ctx, conn, add[c], on...)
		if err != nil {
			return false, err
		}
		if t == Wake {
			for _, ch := range on {
				s.listening[ch] = struct{}{}
			}
		}
		for i, k := range add[c] {
			if ok[i] {
				s.have[Sub{t, k}] = struct{}{}
				got = append(got, Sub{t, k})
				if t == Wake {
					s.wakeRefs[s.wakeChannel(k)]++
				}
			} else {
				retrySoon = true
			}
		}
	}
	if post && len(got) > 0 && !s.post(ctx, Notice{Registered: got}) {
		return retrySoon, ctx.Err()
	}
	return retrySoon, nil
}

// checkReleaseTrigger asks, once per service, whether the lock table has
// the release trigger for the notify channel, on the listening
// connection (not the pool, whose statements callers count), and reports
// it as pglease.release_trigger.installed. When it has not, SyncGuard's
// releases wake waiters here only by polling: one Info log record says so
// (not a warning: a fleet without SyncGuard processes does not need the
// trigger). A failed check (privileges, a lost connection) is tried again
// at the next connect.
func (s *service) checkReleaseTrigger(ctx context.Context, conn *pgx.Conn) {
	st, err := store.New("pg.New", conn, s.cfg.Store)
	if err != nil {
		return
	}
	ok, err := st.ReleaseTriggerInstalled(ctx, s.cfg.Channel)
	if err != nil {
		return
	}
	s.triggerChecked = true
	s.cfg.Rec.ReleaseTrigger(ok, s.cfg.Channel)
	if s.cfg.TriggerChecked != nil {
		s.cfg.TriggerChecked(ok)
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

// cleanupWait bounds how long endSession waits for pgx's clean-up of a
// broken connection: its cancel request's dial and acknowledgement,
// bounded by connx.BoundCleanup (connx.Dial applies it).
const cleanupWait = connx.DefaultConnectTimeout + 2*connx.CleanupAckBound

// endSession makes sure the session ends with the service's use of its
// connection. A connection that broke under a statement (a probe or a
// lock statement with no answer in time, or one cut short by Stop) is
// closed by pgx in a goroutine of its own: a cancel request on a new
// connection, then Terminate and a drain, and only then the socket,
// which conn.Close does not wait for. Until then the server keeps the
// session and the subscriptions' locks it holds, after the service, and
// so Manager.Close, has returned (or beside the next session). Closing
// the socket here ends the session at once; the wait for pgx's goroutine
// keeps it from outliving the service.
func endSession(pc *pgconn.PgConn) {
	_ = pc.Conn().Close() // already closed unless pgx is still cleaning up
	t := time.NewTimer(cleanupWait)
	defer t.Stop()
	select {
	case <-pc.CleanupDone():
	case <-t.C:
	}
}

func (s *service) probeFailed() {
	if s.cfg.ProbeFailed != nil {
		s.cfg.ProbeFailed()
	}
}

// post hands n to the loop; false when ctx ended first.
func (s *service) post(ctx context.Context, n Notice) bool {
	select {
	case s.out <- n:
		return true
	case <-ctx.Done():
		return false
	}
}
