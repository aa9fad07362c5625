package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/heartbeat"
	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
	"github.com/pglease/pglease/retry"
	"github.com/pglease/pglease/telemetry"
)

// DefaultNotifyChannel is the LISTEN/NOTIFY channel of a Manager whose
// Config.NotifyChannel is empty: name it where something outside the
// Managers must use their channel, such as the release trigger that lets
// SyncGuard processes sharing the tables wake this fleet's waiters.
const DefaultNotifyChannel = "pglease_release"

// Defaults of Config's zero fields (each field's documentation says its
// default in words).
const (
	defaultTTL              = 30 * time.Second
	defaultStatementTimeout = 5 * time.Second
	defaultCloseTimeout     = 5 * time.Second
	defaultMaxInFlight      = 1
)

// Config configures a Manager. The zero value means "all defaults"; each
// field documents its default. Invalid values make New fail with
// CodeInvalidArgument, before any I/O.
type Config struct {
	// Config names the lease tables and this process's identity, as for a
	// pg.Store: LockTable and FenceTable (default "syncguard_locks" and
	// "syncguard_fence_counters"), Holder ("" means "program[pid]@host"),
	// OnFenceWarning (called from the Manager's database goroutines: it
	// must not block), and NotifyChannel, the LISTEN/NOTIFY channel on
	// which releases wake waiters in other processes. Unlike a Store's, a
	// Manager's empty NotifyChannel means DefaultNotifyChannel
	// ("pglease_release"); DisableNotify turns notifications off. Every
	// Manager that should wake the others must use the same channel. (A
	// Manager on another channel also listens to DefaultNotifyChannel,
	// for watch events only: changes made without a channel tell watchers
	// there.)
	pg.Config

	// DisableNotify turns notifications off: releases wake no one here or
	// elsewhere (a key watched elsewhere is still told to its watchers,
	// on DefaultNotifyChannel), and no listening connection is opened. Waiters then learn of releases in
	// other processes by polling alone.
	DisableNotify bool
	// FairQueue serves the waiters of a key in arrival order across
	// processes (docs/fairness.md): a waiting Acquire (exclusive, Shared
	// or WithLimit) keeps a ticket in the key's queue table (schema
	// version 4), a waiting AcquireAll one per key, queued together; a
	// release with tickets queued grants the key to the head in its own
	// transaction (readers in a row together, a writer ahead of readers
	// first: writer preference inside the order) and notifies only the
	// head's process; a set at the head is told its turn and takes all its
	// keys or none; a caller that gives up leaves its tickets. TryAcquire
	// and TryAcquireAll never queue. A dead process's tickets stop blocking
	// its keys 3 s after its last refresh.
	//
	// Off by default: the kernel's simulator does not model the queue yet,
	// and the queue changes what AcquireAll promises (a set at the head of
	// a key's line holds up that key's later callers until it gets all its
	// keys) and replaces local handoffs between callers of one process with
	// a release and a notice. Turn it on where several processes contend
	// for the same keys.
	FairQueue bool
	// ListenConnString, if set, is the connection string (pgx.ParseConfig
	// syntax) of the one connection the Manager LISTENs on, instead of
	// the pool's connection config. Set it to a direct connection to
	// PostgreSQL (or through a session-mode pooler), same database, when
	// the pool goes through a transaction-mode pooler (PgBouncer
	// pool_mode=transaction, managed poolers in that mode): such a pooler
	// hands the server connection that ran LISTEN to other clients, so
	// notifications never reach the listener. The Manager tells: when its
	// listening connection turns out to share its server connection with
	// other clients, it stops listening for good, logs one Warn record
	// that names this field, counts it in pglease.listener.polling, and
	// waiters learn of other processes' releases by polling (Retry).
	// Releases still send notifications either way.
	ListenConnString string

	// TTL is the lease TTL of an acquire without WithTTL. Default 30 s.
	// It must be a whole number of milliseconds and, as locks are
	// auto-extended by default, at least 300 ms: below that the part of
	// the TTL left for retries of a failing extend is too short for a
	// real network (WithoutAutoExtend allows shorter leases).
	TTL time.Duration
	// AcquireTimeout caps the wait of Acquire and Do without
	// WithAcquireTimeout. Zero (the default) is no cap: they wait as long
	// as the caller's context allows, like etcd's Mutex.Lock(ctx),
	// semaphore.Acquire(ctx) or pgxpool's Acquire(ctx), so that a worker
	// can wait out a crashed holder (up to a TTL) without tuning. Put the
	// deadline in the context, or set a cap here. Negative is
	// InvalidArgument.
	AcquireTimeout time.Duration
	// Retry is the backoff between two attempts of a contended key. The
	// zero value is SyncGuard's (100 ms base, ×2, equal jitter), capped at
	// 2 s. A release in this process, or a release notification from
	// another, starts the next attempt at once.
	Retry retry.Policy
	// LossMargin is subtracted from the trust window of every lease:
	// a lease is declared lost at attemptStart + TTL − LossMargin, before
	// the server can give it to anyone else (the timely loss signal).
	// Zero means TTL/10, at least 10 ms and at most 5 s. A margin that
	// leaves no room after the first extend (≥ 2/3 TTL) makes the acquire
	// fail with InvalidArgument.
	LossMargin time.Duration

	// StatementTimeout bounds each batched round trip. Default 5 s.
	// Extends are also bounded by the trust deadline of their earliest
	// lease.
	StatementTimeout time.Duration
	// CloseTimeout bounds the release of all held locks in Close. Default
	// 5 s. The caller's context of Close bounds only how long Close waits.
	CloseTimeout time.Duration
	// MaxBatch caps the items of one batched statement, at most 10,000.
	// Default 10,000 for acquires and releases and 100,000 for extends, so
	// a heartbeat tick of up to 100,000 locks is one statement; a value
	// set here caps extends too.
	MaxBatch int
	// MaxInFlight caps the batches of one kind (acquire, release, extend)
	// in flight at once (not counting stuck ones: a batch unanswered for
	// a second no longer holds the others back). Default 1: the requests
	// that arrive while a batch is in flight go together in the next,
	// and fewer, larger statements outrun more, smaller ones (bench, 2
	// cores: +38 % cycles/s at 8 callers, +25 % at 64 over a cap of 2;
	// raise it for a server with many cores and a slow network). When 64
	// or more requests of a kind wait, one more batch may go out. Acquire and release batches are also
	// capped at (pool MaxConns − 1)/2 each, at least 1, so one connection
	// stays free for heartbeats when only the Manager uses the pool.
	MaxInFlight int

	// Telemetry configures the Manager's OpenTelemetry spans and metrics
	// and its log records (package telemetry names them all): providers,
	// logger, key secret. The zero value (the default) means the otel
	// global providers, which record nothing unless the program installs
	// SDK ones, no logging, and keys identified by SyncGuard's unkeyed
	// hashKey, which is not secret: set KeySecret to make key hashes
	// keyed.
	Telemetry telemetry.Config
}

func (c Config) withDefaults() Config {
	c.TTL = cmp.Or(c.TTL, defaultTTL)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, defaultStatementTimeout)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, defaultCloseTimeout)
	c.MaxBatch = cmp.Or(c.MaxBatch, store.MaxBatch)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, defaultMaxInFlight)
	c.NotifyChannel = cmp.Or(c.NotifyChannel, DefaultNotifyChannel)
	return c
}

func invalid(op, msg string) error {
	return pgerr.New(pglease.CodeInvalidArgument, op, msg, nil)
}

func (c Config) validate(op string) error {
	switch {
	case c.AcquireTimeout < 0:
		return invalid(op, "AcquireTimeout must not be negative (zero: no cap, the context bounds the wait)")
	case c.LossMargin < 0:
		return invalid(op, "LossMargin must not be negative")
	case c.StatementTimeout < 0:
		return invalid(op, "StatementTimeout must not be negative")
	case c.CloseTimeout < 0:
		return invalid(op, "CloseTimeout must not be negative")
	case c.MaxBatch < 0 || c.MaxBatch > store.MaxBatch:
		return invalid(op, "MaxBatch must be between 0 and "+strconv.Itoa(store.MaxBatch))
	case c.MaxInFlight < 0:
		return invalid(op, "MaxInFlight must not be negative")
	case c.ListenConnString != "" && c.DisableNotify:
		return invalid(op, "ListenConnString is set but DisableNotify turns listening off")
	}
	if c.ListenConnString != "" {
		if _, err := pgx.ParseConfig(c.ListenConnString); err != nil {
			return invalid(op, "bad ListenConnString") // the parse error may quote a password
		}
	}
	if c.TTL != 0 {
		if err := checkTTL(op, c.TTL, c.LossMargin, true); err != nil {
			return err
		}
	}
	if _, err := c.Retry.NewBackOff(); err != nil {
		return reop(op, err)
	}
	return nil
}

// checkTTL validates a lease TTL (whole ms, not too large) and, for an
// auto-extended lease, the floor and the margin.
func checkTTL(op string, ttl, margin time.Duration, auto bool) error {
	if err := keys.ValidateTTL(ttl); err != nil {
		var e *pglease.Error
		if errors.As(err, &e) {
			return pgerr.New(e.Code, op, e.Msg, nil)
		}
		return reop(op, err)
	}
	if auto && ttl < heartbeat.MinAutoExtendTTL {
		return invalid(op, "ttl below the auto-extend floor of 300ms (use WithoutAutoExtend for shorter single-shot leases)")
	}
	if margin > 0 && !validMargin(ttl, margin) && auto {
		return invalid(op, "LossMargin leaves no trust window after the first extend (must be below 2/3 of the ttl)")
	}
	if margin > 0 && margin >= ttl {
		return invalid(op, "LossMargin must be below the ttl")
	}
	if !auto {
		// The grant must come back within ttl − margin of its attempt's
		// start, or it is refused as late (an 11 ms lease would leave a
		// 1 ms window and could never be granted).
		m := margin
		if m <= 0 {
			m = defaultMargin(ttl)
		}
		if ttl-m < minTrustWindow {
			return invalid(op, fmt.Sprintf("ttl %v leaves a trust window of %v after the loss margin of %v: a grant's round trip must fit in it; use a ttl of at least %v",
				ttl, ttl-m, m, m+minTrustWindow))
		}
	}
	return nil
}

// minTrustWindow is the shortest trust window (ttl − margin) a
// WithoutAutoExtend lease may have: the acquire's round trip must fit.
const minTrustWindow = 10 * time.Millisecond

// Manager hands out lease locks on one PostgreSQL database to the
// goroutines of this process. See the package documentation. A Manager
// is safe for concurrent use; Close it when done.
type Manager struct {
	// Its fields are immutable after New, channels, or (the advisory
	// locks) guarded by a mutex: the lock state is the loop's loopState,
	// owned by run ("Who owns what" in the package documentation).

	cfg      Config        // immutable after New (defaults filled)
	pool     *pgxpool.Pool // immutable; closed by run at the end of Close only if ownsPool
	ownsPool bool          // immutable
	// listenCfg is the listening connection's config (ListenConnString or
	// the pool's), its connect bounded per host; immutable, nil with
	// DisableNotify.
	listenCfg *pgx.ConnConfig
	// qch is this process's fair-queue channel (Config.FairQueue;
	// immutable, "" without), refreshDoneCh where the tickets' refresh
	// posts its answer (fair.go; buffered: one refresh at a time).
	qch           string
	refreshDoneCh chan refreshDone
	// storeCfg is the Store's config (store.New on the listening connection
	// checks the release trigger there); immutable.
	storeCfg pg.Config
	store    kernelStore // immutable; safe for concurrent use (DB workers, SetupSchema); *store.Store in production
	// rec records spans, metrics and logs (internal/obs); immutable,
	// never nil. Its methods never block and are safe from any goroutine.
	rec  *obs.Recorder
	sig  *signals  // immutable; nil in production
	test testHooks // immutable; zero in production

	extBatch                     int // immutable: items of one extend statement
	acqLimit, relLimit, extLimit int // immutable: batches in flight per kind (not counting stuck ones, lane.go)
	maxConns                     int // immutable: the pool's MaxConns

	work chan func() // written by run (spawn), read by idle DB workers

	acquireCh     chan *acquireReq // written by Acquire/TryAcquire, read only by run
	releaseCh     chan *releaseReq // written by Lock.Release, read only by run
	extendCh      chan *extendReq  // written by Lock.Extend, read only by run
	abandonCh     chan *acquireReq // written by callers whose ctx ended, read only by run
	acquireDoneCh chan acquireDone // written by DB workers (acquire and handoff batches), read only by run
	releaseDoneCh chan releaseDone // written by DB workers (release and handoff batches), read only by run
	extendDoneCh  chan extendDone  // written by DB workers (extend batches), read only by run
	notifyCh      chan notice      // written by the listener goroutine (and Revoke), read only by run
	watchCh       chan *watchReq   // written by Watch and its context's end, read only by run
	watchDoneCh   chan watchDone   // written by DB workers (watch reads), read only by run
	// lossCh nudges run (cap 1, non-blocking sends merge): written by the
	// loss timer, the hold-limit timers and Lock.checkTrust (any
	// goroutine), after each has ended a lock's Context itself; read only
	// by run.
	lossCh chan struct{}

	workCtx    context.Context    // immutable; extends and advisory work run under it; cancelled by run when draining
	cancelWork context.CancelFunc // immutable; called by run

	closeOnce sync.Once     // Close's
	closing   chan struct{} // closed by Close (once); read by run and callers
	done      chan struct{} // closed by run when it has fully stopped
	closeErr  error         // written by run before done is closed; read by Close after done

	adv advisoryState // advisory session locks (advisory.go: the Manager's advisory.Client): callers and run (Close), guarded by its own mutex
}

type option func(*Manager)

// New returns a Manager that takes its connections from pool and starts
// its loop goroutine (and, unless DisableNotify, a listener goroutine on
// one dedicated connection opened with the pool's connection config, or
// ListenConnString's; its connect to each host is bounded by 2 s unless
// the connection string sets connect_timeout). A pool whose connection
// string lists several hosts without connect_timeout gets one Warn log
// record: it would never move off a host that stopped answering. It
// validates cfg and does no I/O. The Manager does not close pool: the
// caller closes it after Close. Make pool with pg.NewPool, or configure
// its pgxpool.Config with pg.ConfigurePool, as Open does for its own
// (bounded connects, broken connections' sockets closed at once): with
// pgxpool's defaults, after a network fault a connection pgx found broken
// keeps its pool slot for up to 15 s and a connect begun during the fault
// for up to 2 min, and with every pooled connection broken nothing of the
// Manager runs for that long. The schema must be at the version this
// pglease needs (see SetupSchema and package pg/migrate): the first
// acquire checks it and fails with an error that says how to migrate (a
// *migrate.SchemaError cause) when it is not.
func New(pool *pgxpool.Pool, cfg Config) (*Manager, error) {
	return newManager("manager.New", pool, false, cfg)
}

// Open is New on a pool it opens from connString (pgxpool.ParseConfig
// syntax). The Manager owns that pool and closes it at the end of Close.
// Unless connString sets connect_timeout, the pool's connect to each host
// is bounded by 2 s, so that with several hosts (host=a,b …
// target_session_attrs=read-write) it moves on from a host that stopped
// answering without closing connections.
func Open(ctx context.Context, connString string, cfg Config) (*Manager, error) {
	return openManager("manager.Open", ctx, connString, cfg)
}

func openManager(op string, ctx context.Context, connString string, cfg Config, opts ...option) (*Manager, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "bad connection string", nil)
	}
	if err := cfg.validate(op); err != nil {
		return nil, err
	}
	// Its connections carry the Manager's holder identity as
	// application_name, unless connString or PGAPPNAME names them.
	connx.AppName(&pcfg.ConnConfig.Config, cmp.Or(cfg.Holder, store.DefaultHolder()))
	// A pool of its own moves off a host that stopped answering (several
	// hosts, target_session_attrs=read-write) and frees a broken
	// connection's slot at once (see pg.ConfigurePool).
	if err := pg.ConfigurePool(pcfg); err != nil {
		return nil, err
	}
	idlePool(pcfg, connString)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "cannot create pool", err)
	}
	m, err := newManager(op, pool, true, cfg, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return m, nil
}

// A Manager's own pool (Open) closes the connections idle for more than
// ownIdleTime, looked for every ownHealthCheck, unless the connection
// string sets pool_max_conn_idle_time or pool_health_check_period
// (pgxpool's defaults: 30 min, 1 min). A fleet's idle processes then keep
// their listening connection and the one pool connection their heartbeat
// reuses, not the pool's full size for half an hour: the server's
// connections are what a fleet runs out of first (docs/scaling.md).
const (
	ownIdleTime    = 30 * time.Second
	ownHealthCheck = 10 * time.Second
)

func idlePool(pcfg *pgxpool.Config, connString string) {
	if !strings.Contains(connString, "pool_max_conn_idle_time") {
		pcfg.MaxConnIdleTime = ownIdleTime
	}
	if !strings.Contains(connString, "pool_health_check_period") {
		pcfg.HealthCheckPeriod = ownHealthCheck
	}
}

func newManager(op string, pool *pgxpool.Pool, owns bool, cfg Config, opts ...option) (*Manager, error) {
	if pool == nil {
		return nil, invalid(op, "nil pool")
	}
	if err := cfg.validate(op); err != nil {
		return nil, err
	}
	extBatch := cmp.Or(cfg.MaxBatch, store.MaxExtendBatch)
	cfg = cfg.withDefaults()
	pcfg := cfg.Config
	if cfg.DisableNotify {
		pcfg.NotifyChannel = ""
	}
	ls, err := store.New("pg.New", pool, store.Config(pcfg))
	if err != nil {
		var e *pglease.Error
		if errors.As(err, &e) {
			return nil, pgerr.New(e.Code, op, e.Msg, e.Err)
		}
		return nil, reop(op, err)
	}
	m := &Manager{
		cfg:           cfg,
		pool:          pool,
		ownsPool:      owns,
		store:         ls,
		storeCfg:      pcfg,
		rec:           obs.New(cfg.Telemetry, dbTelemetry(pool)),
		acquireCh:     make(chan *acquireReq),
		releaseCh:     make(chan *releaseReq),
		extendCh:      make(chan *extendReq),
		abandonCh:     make(chan *acquireReq),
		acquireDoneCh: make(chan acquireDone),
		releaseDoneCh: make(chan releaseDone),
		extendDoneCh:  make(chan extendDone),
		notifyCh:      make(chan notice),
		watchCh:       make(chan *watchReq),
		watchDoneCh:   make(chan watchDone),
		lossCh:        make(chan struct{}, 1),
		closing:       make(chan struct{}),
		done:          make(chan struct{}),
		work:          make(chan func()),
		refreshDoneCh: make(chan refreshDone, 1),
	}
	if cfg.FairQueue {
		m.qch = store.QueueChannel()
	}
	if !cfg.DisableNotify {
		lc := pool.Config().ConnConfig
		if cfg.ListenConnString != "" {
			lc, _ = pgx.ParseConfig(cfg.ListenConnString) // validated
		}
		m.listenCfg = connx.Bounded(lc, min(connx.DefaultConnectTimeout, cfg.StatementTimeout))
		// The listening session holds the waiter and watch locks `pglease
		// status` lists: name it by the Manager's holder identity.
		connx.AppName(&m.listenCfg.Config, ls.Holder())
	}
	if connx.UnboundedMultiHost(&pool.Config().ConnConfig.Config) {
		m.rec.ConfigWarning("the pool's connection string lists several hosts but sets no connect_timeout: " +
			"its connects wait on a host that stopped answering and never try the next one; add connect_timeout=2 (see docs/failover.md)")
	}
	for _, o := range opts {
		o(m)
	}
	m.maxConns = int(pool.Config().MaxConns)
	perKind := max(1, (m.maxConns-1)/2)
	m.acqLimit = min(cfg.MaxInFlight, perKind)
	m.relLimit = min(cfg.MaxInFlight, perKind)
	m.extLimit = cfg.MaxInFlight
	m.extBatch = extBatch
	m.workCtx, m.cancelWork = context.WithCancel(context.Background())
	st := newLoopState(m)
	st.startListener() // subscribes the loop's parts; starts the listener unless DisableNotify
	go m.run(st)
	return m, nil
}

// SetupSchema brings the lease schema to the version this pglease needs
// (migrate.Migrator.Up on the Manager's pool and tables: creates the
// tables and functions if missing, applies missing migrations).
// Production deployments usually apply the migrations with their own tool
// instead (package pg/migrate).
func (m *Manager) SetupSchema(ctx context.Context) error {
	const op = "manager.SetupSchema"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if m.isClosing() {
		return closedErr(op)
	}
	mg, err := migrate.New(m.pool, m.storeCfg)
	if err != nil {
		return err
	}
	if err := mg.Up(ctx); err != nil {
		return err
	}
	// The schema serves this pglease: the first acquire need not check.
	m.store.MarkChecked()
	return nil
}

// Done is closed when the Manager has fully stopped (after Close).
func (m *Manager) Done() <-chan struct{} { return m.done }

func (m *Manager) isClosing() bool {
	select {
	case <-m.closing:
		return true
	default:
		return false
	}
}

// AcquireOption tunes one Acquire, TryAcquire or Do. Options validate
// their argument; a bad one makes the call fail with InvalidArgument
// before any I/O.
type AcquireOption func(*acquireOpts) error

type acquireOpts struct {
	ttl       time.Duration
	timeout   time.Duration
	manual    bool
	holdLimit time.Duration // 0: none
	delay     time.Duration // WithLockDelay; 0: none
	shared    bool          // Shared or WithLimit
	limit     int32         // WithLimit's n; 0: a reader
}

// WithHoldLimit caps how long the lock is held: d after the grant, the
// lock's Context ends with a cause matching pglease.ErrHoldLimitExceeded
// (not ErrLockLost), telling the holder to stop, so that a stuck holder
// cannot keep the lock forever. The lock is not released early: a lease
// is no longer extended and stays until the holder calls Release or it
// expires (TTL after its last extend); an advisory lock stays until
// Release (or its session ends). Lock.Extend is refused after the limit.
// d must be positive. It applies to Acquire, TryAcquire, Do,
// LockAdvisory and TryLockAdvisory.
func WithHoldLimit(d time.Duration) AcquireOption {
	return func(o *acquireOpts) error {
		if d <= 0 {
			return invalid("manager.WithHoldLimit", "hold limit must be positive")
		}
		o.holdLimit = d
		return nil
	}
}

// maxLockDelay is the longest lock delay (2^31−1 ms, about 24.8 days).
const maxLockDelay = math.MaxInt32 * time.Millisecond

// WithLockDelay keeps the key from every other holder for d after this
// lease ends without a release: after it expired (nobody takes the key
// before its expiry + max(1 s, d) on the server's clock, instead of
// expiry + 1 s) or after it was revoked (Revoke: nobody takes it before
// the revoke + d). A Release lets the key go at once, as usual. It gives
// a holder that lost its lease without noticing (paused, partitioned)
// time to stop before the next holder starts, for resources that cannot
// check a fence. The delay is stored with the grant, on the server, so it
// holds whichever process acquires next; waiters of this pglease learn
// when the key frees from the server's answer and try again then.
// SyncGuard processes sharing the tables do not honour it. d must be a
// whole number of milliseconds, not negative, at most about 24 days
// (2^31−1 ms); 0 (the default) is no delay. It applies to Acquire, TryAcquire, Do, AcquireAll and
// TryAcquireAll (each key of the set); not to shared holds.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(o *acquireOpts) error {
		switch {
		case d < 0:
			return invalid("manager.WithLockDelay", "lock delay must not be negative")
		case d%time.Millisecond != 0:
			return invalid("manager.WithLockDelay", "lock delay must be a whole number of milliseconds")
		case d > maxLockDelay:
			return invalid("manager.WithLockDelay", "lock delay too large: at most "+maxLockDelay.String())
		}
		o.delay = d
		return nil
	}
}

// WithTTL sets the lease TTL (default Config.TTL). It must be a whole
// number of milliseconds, and at least 300 ms unless WithoutAutoExtend is
// given too: the heartbeat extends a lease a third of the way into its
// TTL and keeps the rest for retries, which a shorter TTL leaves too
// little time for. The trust window of the lease is the TTL less the loss
// margin (Config.LossMargin; by default TTL/10, at least 10 ms and at most
// 5 s).
func WithTTL(ttl time.Duration) AcquireOption {
	return func(o *acquireOpts) error {
		if err := keys.ValidateTTL(ttl); err != nil {
			return err
		}
		o.ttl = ttl
		return nil
	}
}

// WithAcquireTimeout caps how long Acquire or Do waits for the lock
// (default Config.AcquireTimeout, which is no cap: the context alone
// bounds the wait); d must be positive. The context bounds the wait too;
// whichever ends first wins, and the cap ends the wait as the context's
// deadline would (see Acquire for the error). TryAcquire ignores it: it
// never waits.
func WithAcquireTimeout(d time.Duration) AcquireOption {
	return func(o *acquireOpts) error {
		if d <= 0 {
			return invalid("manager.WithAcquireTimeout", "acquire timeout must be positive (without the option the context alone bounds the wait)")
		}
		o.timeout = d
		return nil
	}
}

// WithoutAutoExtend opts the lock out of the heartbeat: it is never
// extended, and is declared lost (its Context cancelled with
// ErrLockLost) at attemptStart + TTL − margin. Use it for work known to
// finish within the TTL; TTLs below the auto-extend floor are allowed.
func WithoutAutoExtend() AcquireOption {
	return func(o *acquireOpts) error {
		o.manual = true
		return nil
	}
}

// newAcquireReq validates everything before any I/O.
func (m *Manager) newAcquireReq(op string, ctx context.Context, key string, try bool, opts []AcquireOption) (*acquireReq, time.Duration, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, 0, err
	}
	nk, err := keys.NormalizeKey(key)
	if err != nil {
		var e *pglease.Error
		if errors.As(err, &e) {
			return nil, 0, pgerr.New(e.Code, op, e.Msg, nil)
		}
		return nil, 0, reop(op, err)
	}
	o, err := m.parseOpts(op, opts)
	if err != nil {
		return nil, 0, err
	}
	if err := checkTTL(op, o.ttl, m.cfg.LossMargin, !o.manual); err != nil {
		return nil, 0, err
	}
	if m.isClosing() {
		return nil, 0, closedErr(op)
	}
	return &acquireReq{
		key:       nk,
		hash:      pglease.HashKey(nk),
		ttl:       o.ttl,
		manual:    o.manual,
		try:       try,
		holdLimit: o.holdLimit,
		delay:     o.delay,
		shared:    o.shared,
		limit:     o.limit,
		reply:     make(chan acquireReply, 1),
		final:     make(chan acquireReply, 1),
	}, o.timeout, nil
}

// parseOpts applies opts over the Manager's defaults.
func (m *Manager) parseOpts(op string, opts []AcquireOption) (acquireOpts, error) {
	o := acquireOpts{ttl: m.cfg.TTL, timeout: m.cfg.AcquireTimeout}
	for _, f := range opts {
		if f == nil {
			return o, invalid(op, "nil option")
		}
		if err := f(&o); err != nil {
			var e *pglease.Error
			if errors.As(err, &e) {
				return o, pgerr.New(e.Code, op, e.Msg, nil)
			}
			return o, reop(op, err)
		}
	}
	if o.shared && o.delay != 0 {
		return o, invalid(op, "a lock delay applies to exclusive leases, not to shared holds (Shared, WithLimit)")
	}
	return o, nil
}

// errWaitTimeout is the cause of the wait context when the acquire
// timeout (not the caller's context) ends the wait.
var errWaitTimeout = errors.New("acquire timeout")

// submit sends req to run and waits for the answer, leaving cleanly
// (through abandonCh) when wctx ends. run is the only arbiter of a grant
// that races the caller's departure: after an abandon, run takes back a
// grant the caller never received and sends one final answer.
func (m *Manager) submit(op string, wctx context.Context, req *acquireReq) acquireReply {
	select {
	case m.acquireCh <- req:
	case <-wctx.Done():
		return acquireReply{abandoned: true}
	case <-m.closing:
		return acquireReply{err: closedErr(op)}
	}
	select {
	case r := <-req.reply:
		return r
	case <-wctx.Done():
	}
	select {
	case m.abandonCh <- req:
	case <-m.done:
		return acquireReply{err: closedErr(op)}
	}
	select {
	case r := <-req.final:
		return r
	case <-m.done:
		// run answers every abandon it received before it stopped.
		select {
		case r := <-req.final:
			return r
		default:
			return acquireReply{err: closedErr(op)}
		}
	}
}

// heldHereMsg ends the message of a wait that ended while the key was
// held by a caller of this Manager.
const heldHereMsg = "the key was held by this process (another caller of this Manager; locks are not re-entrant)"

// waitErr maps a wait that ended without the lock (the rule is Acquire's):
// a cancelled context is Aborted; a wait bound (acquire timeout or
// deadline) is AcquisitionTimeout when the key was held (here: the
// message says so; or elsewhere: the message names the holder identity
// the key's last "locked" answer gave, r.heldBy, when there was one), and
// the code of the failure when the database could not be reached
// (r.lastErr, see keyState.lastErr and unreachable). That failure is the
// cause when there is one.
func waitErr(op string, ctx, wctx context.Context, r acquireReply) error {
	cause := context.Cause(wctx)
	if cause == nil {
		cause = ctx.Err()
	}
	timedOut := errors.Is(cause, errWaitTimeout) || errors.Is(cause, context.DeadlineExceeded)
	wrapped := ctx.Err()
	if wrapped == nil {
		wrapped = context.DeadlineExceeded
	}
	if r.lastErr != nil && !r.heldHere {
		wrapped = userErr(op, r.lastErr)
	}
	switch {
	case !timedOut && r.heldHere:
		return pgerr.New(pglease.CodeAborted, op, "context ended while waiting for the lock: "+heldHereMsg, wrapped)
	case !timedOut:
		return pgerr.New(pglease.CodeAborted, op, "context ended while waiting for the lock", wrapped)
	case r.heldHere:
		return pgerr.New(pglease.CodeAcquisitionTimeout, op, "lock not acquired before the wait ended: "+heldHereMsg, wrapped)
	case r.lastErr != nil && unreachable(wrapped) && r.shed:
		return pgerr.New(pglease.CodeOf(wrapped), op,
			"the database did not answer before the wait ended; no lock was granted"+shedNote, wrapped)
	case r.lastErr != nil && unreachable(wrapped):
		return pgerr.New(pglease.CodeOf(wrapped), op,
			"the database could not be reached before the wait ended (the key's last attempt, or a release it waited for, failed and no attempt since reached it); no lock was granted", wrapped)
	}
	msg := "lock not acquired before the wait ended"
	if r.heldBy != "" {
		msg += " (held by " + r.heldBy + " when last checked)"
	}
	if r.shed {
		msg += shedNote
	}
	return pgerr.New(pglease.CodeAcquisitionTimeout, op, msg, wrapped)
}

// Acquire waits for the lock on key and returns it. All callers of this
// Manager waiting for the same key share one database attempt loop and
// are served in FIFO order; contended keys are retried with jittered
// exponential backoff, and releases (local, or notified from other
// processes) start the next attempt at once.
//
// The wait lasts as long as ctx allows, like etcd's Mutex.Lock(ctx) or
// sync.Mutex: put a deadline in ctx, or cap it with WithAcquireTimeout
// (or Config.AcquireTimeout). When it ends without the lock, no lock is
// leaked and the error says why:
//   - ctx cancelled: CodeAborted.
//   - The deadline or the cap passed while the database could not be
//     reached: the key's last attempt, or a later round trip its next
//     attempt waits for (the release of an earlier lockId of the key),
//     had failed to reach the database (connection refused or lost, no
//     answer within its statement timeout or within a second, too many
//     connections), and no attempt had reached it since. That is an
//     outage, not contention: the error has that failure's code
//     (CodeServiceUnavailable, CodeNetworkTimeout or
//     CodeResourceExhausted; pglease.Retryable) with the failure as its
//     cause, and does not match pglease.ErrAcquisitionTimeout.
//   - Otherwise CodeAcquisitionTimeout: the key was held (the last
//     attempt found it taken), or no attempt had been answered yet. When
//     the key was held by this process, the message says so.
//
// Errors no retry can fix (a missing table or database, failed
// authentication, a role that does not exist) end the wait at once with
// their own code (CodeInvalidArgument, CodeAuthFailed).
//
// Locks are not re-entrant: callers of one Manager exclude each other
// like any two holders. Acquire of a key this Manager already holds
// waits behind the holder (FIFO) like any other caller; a wait that ends
// that way says the key was held by this process.
//
// The returned Lock is extended automatically until Release (see
// WithoutAutoExtend); its Context is cancelled if it is lost.
func (m *Manager) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	const op = "manager.Acquire"
	req, timeout, err := m.newAcquireReq(op, ctx, key, false, opts)
	if err != nil {
		return nil, err
	}
	ctx = m.startAcquire(ctx, req)
	var wctx context.Context
	var cancel context.CancelFunc
	if timeout > 0 {
		wctx, cancel = context.WithTimeoutCause(ctx, timeout, errWaitTimeout)
	} else {
		wctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	r := m.submit(op, wctx, req)
	switch {
	case r.lock != nil:
		return r.lock, nil // the loop recorded the grant before replying
	case r.err != nil:
		err = userErr(op, r.err)
	default: // abandoned (locked is impossible for Acquire)
		err = waitErr(op, ctx, wctx, r)
	}
	req.acq.Failed(err) // a no-op if the loop granted first (a grant it took back)
	return nil, err
}

// startAcquire starts req's pglease.acquire span, a child of the span in
// ctx, and returns ctx carrying it (for the wait).
func (m *Manager) startAcquire(ctx context.Context, req *acquireReq) context.Context {
	ctx, req.acq = m.rec.StartAcquire(ctx, m.rec.KeyHashed(req.key, req.hash), obs.AcquireInfo{
		Kind: req.kind(), TTL: req.ttl, Try: req.try,
	})
	return ctx
}

// kind is req's lock kind for telemetry: lease (exclusive), shared (a
// reader) or permit.
func (req *acquireReq) kind() obs.LockKind {
	switch {
	case !req.shared:
		return obs.KindLease
	case req.limit == 0:
		return obs.KindShared
	}
	return obs.KindPermit
}

// TryAcquire makes one attempt to take key, without waiting for a
// holder: ok is false (and err nil) when the key is held, by another
// process or by this Manager (callers of one Manager exclude each other:
// locks are not re-entrant), or when callers of this Manager are already
// waiting for it (they come first; when they are waiting out an outage,
// by the rule of Acquire, TryAcquire answers that failure instead).
//
// Otherwise its attempt goes out at once, whatever else this Manager is
// doing for the key (an attempt of callers who left, or the release of a
// lockId whose grant is uncertain, retried during an outage): the server
// decides, and answers "held" while such a lockId may still hold the key.
// So TryAcquire waits only for a slot in the Manager's acquire batches
// (behind at most a batch in flight, which stops counting after a second
// without an answer) and for its attempt's round trip, bounded by ctx and
// Config.StatementTimeout. A failed attempt is its error; it is not
// retried.
func (m *Manager) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (lock *Lock, ok bool, err error) {
	const op = "manager.TryAcquire"
	req, _, err := m.newAcquireReq(op, ctx, key, true, opts)
	if err != nil {
		return nil, false, err
	}
	ctx = m.startAcquire(ctx, req)
	r := m.submit(op, ctx, req)
	switch {
	case r.lock != nil:
		return r.lock, true, nil
	case r.locked:
		req.acq.NotAcquired()
		return nil, false, nil
	case r.err != nil:
		err = userErr(op, r.err)
	default:
		err = waitErr(op, ctx, ctx, r)
	}
	req.acq.Failed(err)
	return nil, false, err
}

// Do acquires key (as Acquire, with the same options), runs fn with the
// lock, and releases it. fn gets the lock, so it can fence its writes
// with lk.Fence(), and a context that is cancelled when ctx ends or when
// the lock ends under it (then context.Cause is its cause: an
// ErrLockLost error when it was lost, an ErrRevoked error when it was
// revoked). Do returns fn's error; if fn succeeded but the lock was lost
// or revoked before it was released, Do returns that end (CodeLockLost,
// or CodeRevoked: someone took the lock away on purpose), because the
// work may not have been protected. Other release errors are not
// returned: the lock then expires by itself at the end of its TTL.
//
// If fn panics (or calls runtime.Goexit, as t.FailNow does), Do releases
// the lock first and then lets the panic go on, with its original stack.
func (m *Manager) Do(ctx context.Context, key string, fn func(ctx context.Context, lk *Lock) error, opts ...AcquireOption) (err error) {
	const op = "manager.Do"
	if fn == nil {
		return invalid(op, "nil function")
	}
	lk, err := m.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.Context(), func() { cancel(context.Cause(lk.Context())) })
	returned := false
	defer func() {
		// Runs on return and while panicking: the lock never outlives fn.
		stop()
		cancel(nil)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StatementTimeout)
		rerr := lk.Release(rctx)
		rcancel()
		if returned && err == nil && endedUnder(rerr) {
			err = rerr
		}
	}()
	err = fn(fctx, lk)
	returned = true
	return err
}

// endedUnder reports whether a release's error says the lock had ended
// before it, not by its holder's hand: lost or revoked (Do returns it).
func endedUnder(rerr error) bool {
	return errors.Is(rerr, pglease.ErrLockLost) || errors.Is(rerr, pglease.ErrRevoked)
}

// userErr labels the error of a database attempt made for a caller with
// the call the caller made (op), keeping the attempt's error as the cause.
// An ambiguous attempt is not ambiguous to the caller: the lock was not
// granted to it, and the Manager releases the lockId it had sent (ambiguity is never success), so
// the caller gets the code of what went wrong (a timeout, a lost
// connection), which says whether trying again can work.
func userErr(op string, err error) error {
	var e *pglease.Error
	if !errors.As(err, &e) {
		return pgerr.New(pglease.CodeInternal, op, "unexpected error", err)
	}
	if e.Op == op {
		return err
	}
	msg := e.Msg
	if e.Code == pglease.CodeAmbiguous {
		msg = "attempt failed with its outcome unknown; its lockId is being released"
	}
	return pgerr.New(attemptCode(e), op, msg, err)
}

func closedErr(op string) error {
	return pgerr.New(pglease.CodeClosed, op, "manager closed", nil)
}

// dbTelemetry names the pool's server and database for the
// semantic-convention attributes of database spans (server.address,
// server.port, db.namespace).
func dbTelemetry(pool *pgxpool.Pool) obs.Database {
	cc := pool.Config().ConnConfig
	return obs.Database{Address: cc.Host, Port: int(cc.Port), Namespace: cc.Database}
}
