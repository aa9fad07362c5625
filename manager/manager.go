package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

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
const DefaultNotifyChannel = kernel.DefaultNotifyChannel

// Config configures a Manager. The zero value means "all defaults"; each
// field documents its default. Invalid values make New fail with
// CodeInvalidArgument, before any I/O.
type Config struct {
	// Config names the lease tables and this process's identity, as for a
	// pg.Store: LockTable and FenceTable (default "syncguard_locks" and
	// "syncguard_fence_counters"), Holder ("" means "program[pid]@host"),
	// OnFenceWarning (called from the Manager's database goroutines: it
	// must not block), and NotifyChannel, the LISTEN/NOTIFY channel on
	// which releases wake waiters in other processes (on its 256 wake
	// channels, NotifyChannel + "." + two hex digits; so at most 60
	// bytes). Unlike a Store's, a
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
	// and TryAcquireAll never queue, and never go ahead of the queue: a
	// try is answered "held" while a live ticket of any process waits for
	// the key, even when the key is free (a set's turn). A dead process's
	// tickets stop blocking its keys 3 s after its last refresh.
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
	// lease, and wait until that deadline instead when none of their
	// leases could be retried after the timeout before its own.
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

func (c Config) withDefaults() Config { return Config(kernel.Config(c).WithDefaults()) }

func (c Config) validate(op string) error {
	switch {
	case c.AcquireTimeout < 0:
		return kernel.Invalid(op, "AcquireTimeout must not be negative (zero: no cap, the context bounds the wait)")
	case c.LossMargin < 0:
		return kernel.Invalid(op, "LossMargin must not be negative")
	case c.StatementTimeout < 0:
		return kernel.Invalid(op, "StatementTimeout must not be negative")
	case c.CloseTimeout < 0:
		return kernel.Invalid(op, "CloseTimeout must not be negative")
	case c.MaxBatch < 0 || c.MaxBatch > store.MaxBatch:
		return kernel.Invalid(op, "MaxBatch must be between 0 and "+strconv.Itoa(store.MaxBatch))
	case c.MaxInFlight < 0:
		return kernel.Invalid(op, "MaxInFlight must not be negative")
	case c.ListenConnString != "" && c.DisableNotify:
		return kernel.Invalid(op, "ListenConnString is set but DisableNotify turns listening off")
	}
	if c.ListenConnString != "" {
		if _, err := pgx.ParseConfig(c.ListenConnString); err != nil {
			return kernel.Invalid(op, "bad ListenConnString") // the parse error may quote a password
		}
	}
	if c.TTL != 0 {
		if err := checkTTL(op, c.TTL, c.LossMargin, true); err != nil {
			return err
		}
	}
	if _, err := c.Retry.NewBackOff(); err != nil {
		return kernel.Reop(op, err)
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
		return kernel.Reop(op, err)
	}
	if auto && ttl < heartbeat.MinAutoExtendTTL {
		return kernel.Invalid(op, "ttl below the auto-extend floor of 300ms (use WithoutAutoExtend for shorter single-shot leases)")
	}
	if margin > 0 && !kernel.ValidMargin(ttl, margin) && auto {
		return kernel.Invalid(op, "LossMargin leaves no trust window after the first extend (must be below 2/3 of the ttl)")
	}
	if margin > 0 && margin >= ttl {
		return kernel.Invalid(op, "LossMargin must be below the ttl")
	}
	if !auto {
		// The grant must come back within ttl − margin of its attempt's
		// start, or it is refused as late (an 11 ms lease would leave a
		// 1 ms window and could never be granted).
		m := margin
		if m <= 0 {
			m = kernel.DefaultMargin(ttl)
		}
		if ttl-m < minTrustWindow {
			return kernel.Invalid(op, fmt.Sprintf("ttl %v leaves a trust window of %v after the loss margin of %v: a grant's round trip must fit in it; use a ttl of at least %v",
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
	// The lock state is the kernel's (its loop's LoopState, owned by
	// run: "Who owns what" in the package documentation); the advisory
	// locks are guarded by their own mutex.
	k   *kernel.Kernel
	cfg Config        // immutable after New (defaults filled)
	adv advisoryState // advisory session locks (advisory.go: the Manager's advisory.Client): callers and Close, guarded by its own mutex
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
		return nil, kernel.Invalid(op, "nil pool")
	}
	if err := cfg.validate(op); err != nil {
		return nil, err
	}
	k, err := kernel.Make(op, pool, owns, kernel.Config(cfg))
	if err != nil {
		return nil, err
	}
	m := &Manager{k: k, cfg: cfg.withDefaults()}
	k.AdvClose, k.AdvWait = m.adv.beginClose, m.adv.wait
	for _, o := range opts {
		o(m)
	}
	k.Start()
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
	if m.k.IsClosing() {
		return kernel.ClosedErr(op)
	}
	mg, err := migrate.New(m.k.Pool, m.k.StoreCfg)
	if err != nil {
		return err
	}
	if err := mg.Up(ctx); err != nil {
		return err
	}
	// The schema serves this pglease: the first acquire need not check.
	m.k.Store.MarkChecked()
	return nil
}

// Done is closed when the Manager has fully stopped (after Close).
func (m *Manager) Done() <-chan struct{} { return m.k.Done }

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
			return kernel.Invalid("manager.WithHoldLimit", "hold limit must be positive")
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
			return kernel.Invalid("manager.WithLockDelay", "lock delay must not be negative")
		case d%time.Millisecond != 0:
			return kernel.Invalid("manager.WithLockDelay", "lock delay must be a whole number of milliseconds")
		case d > maxLockDelay:
			return kernel.Invalid("manager.WithLockDelay", "lock delay too large: at most "+maxLockDelay.String())
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
			return kernel.Invalid("manager.WithAcquireTimeout", "acquire timeout must be positive (without the option the context alone bounds the wait)")
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

// Shared makes the acquire a reader of the key's reader-writer lease:
// any number of readers, of any process, hold the key at once, never
// together with an exclusive holder (a plain Acquire: the writer), nor
// with permits (WithLimit). A waiting writer goes first: from its first
// refused attempt, whatever refused it (readers, permits, another
// writer, a delay), no new reader or permit is granted until it has had
// the key (writer preference: a steady stream of readers cannot starve
// it, and when the writer it waits behind releases, the readers waiting
// with it do not get in first). Each refused exclusive attempt marks the
// key for 2 s and a waiting writer tries again at least once a second,
// which keeps the mark (a key no reader or permit has contended for is
// marked a round trip after the first of them is refused on it, which
// wakes the waiting writers); a writer that dies or gives up waiting (a
// refused TryAcquire included) stops blocking readers 2 s after its last
// attempt.
// So, as with sync.RWMutex, a reader must not take the key again while
// it holds it: the second read would wait for a waiting writer, which
// waits for the first.
//
// A reader's Fence is the fence of the state it reads under: the key's
// fence counter at its grant, not incremented (the fence of the last
// exclusive grant or permit of the key; 0 if there was none), so readers
// may share a fence, and a writer's fence is above every reader's before
// it. Present it where a reader must show which writer's state it read.
//
// Shared locks are Locks like any: Release, Extend, heartbeat, loss
// signal, Context, WithTTL, WithHoldLimit, WithoutAutoExtend, and they
// work with Acquire, TryAcquire and Do. Guard refuses them (the database
// guard accepts exclusive leases only). SyncGuard processes sharing the
// tables do not see shared holds: they take the key as if nobody held it.
func Shared() AcquireOption {
	return func(o *acquireOpts) error {
		o.shared = true
		return nil
	}
}

// WithLimit makes the acquire a permit of a counting semaphore of n on
// the key: at most n permits, of any process, are held at once, never
// together with an exclusive holder or readers (Shared: a permit waits
// for readers to go, a reader for permits); n must be at least 1. A
// waiting exclusive acquire keeps new permits away as it keeps readers
// (see Shared). It implies Shared.
//
// Holders may disagree on n, so a limit can be changed in a live fleet
// by deploying the new n process by process: a permit is granted only
// while the live permits are fewer than the smallest n among them and
// the caller's, so the key never has more permits than the smallest n of
// a live permit. A raise takes effect once the permits taken with the old
// n are gone, a lowering as soon as the live permits are fewer than the
// new n (its callers wait until then). A caller whose n disagrees waits
// as for a full semaphore (TryAcquire answers "not acquired"), never an
// error: the disagreement lives in the database, between processes, and
// the same call succeeds later.
//
// Each permit's Fence is a fresh increment of the key's fence counter:
// fences strictly increase across the key's permits and exclusive grants,
// so a resource can refuse a write older than the last one it accepted.
// Permits are Locks like any (see Shared).
func WithLimit(n int) AcquireOption {
	return func(o *acquireOpts) error {
		if n < 1 || n > math.MaxInt32 {
			return kernel.Invalid("manager.WithLimit", "limit must be at least 1 (and fit in 32 bits)")
		}
		o.shared, o.limit = true, int32(n)
		return nil
	}
}

// newAcquireReq validates everything before any I/O.
func (m *Manager) newAcquireReq(op string, ctx context.Context, key string, try bool, opts []AcquireOption) (*kernel.AcquireReq, time.Duration, error) {
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, 0, err
	}
	nk, err := keys.NormalizeKey(key)
	if err != nil {
		var e *pglease.Error
		if errors.As(err, &e) {
			return nil, 0, pgerr.New(e.Code, op, e.Msg, nil)
		}
		return nil, 0, kernel.Reop(op, err)
	}
	o, err := m.parseOpts(op, opts)
	if err != nil {
		return nil, 0, err
	}
	if err := checkTTL(op, o.ttl, m.cfg.LossMargin, !o.manual); err != nil {
		return nil, 0, err
	}
	if m.k.IsClosing() {
		return nil, 0, kernel.ClosedErr(op)
	}
	return &kernel.AcquireReq{
		Key:       nk,
		Hash:      pglease.HashKey(nk),
		TTL:       o.ttl,
		Manual:    o.manual,
		Try:       try,
		HoldLimit: o.holdLimit,
		Delay:     o.delay,
		Shared:    o.shared,
		Limit:     o.limit,
		Reply:     make(chan kernel.AcquireReply, 1),
		Final:     make(chan kernel.AcquireReply, 1),
	}, o.timeout, nil
}

// parseOpts applies opts over the Manager's defaults.
func (m *Manager) parseOpts(op string, opts []AcquireOption) (acquireOpts, error) {
	o := acquireOpts{ttl: m.cfg.TTL, timeout: m.cfg.AcquireTimeout}
	for _, f := range opts {
		if f == nil {
			return o, kernel.Invalid(op, "nil option")
		}
		if err := f(&o); err != nil {
			var e *pglease.Error
			if errors.As(err, &e) {
				return o, pgerr.New(e.Code, op, e.Msg, nil)
			}
			return o, kernel.Reop(op, err)
		}
	}
	if o.shared && o.delay != 0 {
		return o, kernel.Invalid(op, "a lock delay applies to exclusive leases, not to shared holds (Shared, WithLimit)")
	}
	return o, nil
}

// errWaitTimeout is the cause of the wait context when the acquire
// timeout (not the caller's context) ends the wait.
var errWaitTimeout = errors.New("acquire timeout")

// heldHereMsg ends the message of a wait that ended while the key was
// held by a caller of this Manager.
const heldHereMsg = "the key was held by this process (another caller of this Manager; locks are not re-entrant)"

// waitErr maps a wait that ended without the lock (the rule is Acquire's):
// a cancelled context is Aborted; a wait bound (acquire timeout or
// deadline) is AcquisitionTimeout when the key was held (here: the
// message says so; or elsewhere: the message names the holder identity
// the key's last "locked" answer gave, r.heldBy, when there was one), and
// the code of the failure when the database could not be reached
// (r.LastErr, see the kernel's KeyState.lastErr and Unreachable). That failure is the
// cause when there is one.
func waitErr(op string, ctx, wctx context.Context, r kernel.AcquireReply) error {
	cause := context.Cause(wctx)
	if cause == nil {
		cause = ctx.Err()
	}
	timedOut := errors.Is(cause, errWaitTimeout) || errors.Is(cause, context.DeadlineExceeded)
	wrapped := ctx.Err()
	if wrapped == nil {
		wrapped = context.DeadlineExceeded
	}
	if r.LastErr != nil && !r.HeldHere {
		wrapped = userErr(op, r.LastErr)
	}
	switch {
	case !timedOut && r.HeldHere:
		return pgerr.New(pglease.CodeAborted, op, "context ended while waiting for the lock: "+heldHereMsg, wrapped)
	case !timedOut:
		return pgerr.New(pglease.CodeAborted, op, "context ended while waiting for the lock", wrapped)
	case r.HeldHere:
		return pgerr.New(pglease.CodeAcquisitionTimeout, op, "lock not acquired before the wait ended: "+heldHereMsg, wrapped)
	case r.LastErr != nil && kernel.Unreachable(wrapped) && r.Shed:
		return pgerr.New(pglease.CodeOf(wrapped), op,
			"the database did not answer before the wait ended; no lock was granted"+kernel.ShedNote, wrapped)
	case r.LastErr != nil && kernel.Unreachable(wrapped):
		return pgerr.New(pglease.CodeOf(wrapped), op,
			"the database could not be reached before the wait ended (the key's last attempt, or a release it waited for, failed and no attempt since reached it); no lock was granted", wrapped)
	}
	msg := "lock not acquired before the wait ended"
	if r.HeldBy != "" {
		msg += " (held by " + r.HeldBy + " when last checked)"
	}
	if r.Shed {
		msg += kernel.ShedNote
	}
	return pgerr.New(pglease.CodeAcquisitionTimeout, op, msg, wrapped)
}

// waitContext is the context an acquire waits under: ctx, ended after
// timeout (WithAcquireTimeout; 0: none) with errWaitTimeout as its cause.
func waitContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeoutCause(ctx, timeout, errWaitTimeout)
	}
	return context.WithCancel(ctx)
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
	wctx, cancel := waitContext(ctx, timeout)
	defer cancel()
	r := m.k.Submit(op, wctx, req)
	switch {
	case r.Lock != nil:
		return &Lock{r.Lock}, nil // the loop recorded the grant before replying
	case r.Err != nil:
		err = userErr(op, r.Err)
	default: // abandoned (locked is impossible for Acquire)
		err = waitErr(op, ctx, wctx, r)
	}
	req.Acq.Failed(err) // a no-op if the loop granted first (a grant it took back)
	return nil, err
}

// startAcquire starts req's pglease.acquire span, a child of the span in
// ctx, and returns ctx carrying it (for the wait).
func (m *Manager) startAcquire(ctx context.Context, req *kernel.AcquireReq) context.Context {
	ctx, req.Acq = m.k.Rec.StartAcquire(ctx, m.k.Rec.KeyHashed(req.Key, req.Hash), obs.AcquireInfo{
		Kind: req.LockKind(), TTL: req.TTL, Try: req.Try,
	})
	return ctx
}

// TryAcquire makes one attempt to take key, without waiting for a
// holder: ok is false (and err nil) when the key is held, by another
// process or by this Manager (callers of one Manager exclude each other:
// locks are not re-entrant), or when callers of this Manager are already
// waiting for it (they come first; when they are waiting out an outage,
// by the rule of Acquire, TryAcquire answers that failure instead). With
// Config.FairQueue, callers of any process waiting in the key's queue come
// first too: a key free but with a live ticket is "held".
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
	r := m.k.Submit(op, ctx, req)
	switch {
	case r.Lock != nil:
		return &Lock{r.Lock}, true, nil
	case r.Locked:
		req.Acq.NotAcquired()
		return nil, false, nil
	case r.Err != nil:
		err = userErr(op, r.Err)
	default:
		err = waitErr(op, ctx, ctx, r)
	}
	req.Acq.Failed(err)
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
		return kernel.Invalid(op, "nil function")
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
	return pgerr.New(kernel.AttemptCode(e), op, msg, err)
}
