package kernel

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/retry"
	"github.com/pglease/pglease/telemetry"
)

// Kernel is the Manager's lock machinery: the loop goroutine that owns
// the lock state, its DB workers, the listener's subscriptions. The
// public Manager validates a call, builds a request, hands it to the
// kernel and wraps its answer.
type Kernel struct {
	// Its fields are immutable after New, channels, or (the advisory
	// locks) guarded by a mutex: the lock state is the loop's LoopState,
	// owned by run ("Who owns what" in the package documentation).

	cfg      Config        // immutable after New (defaults filled)
	Pool     *pgxpool.Pool // immutable; closed by run at the end of Close only if ownsPool
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
	// StoreCfg is the Store's config (store.New on the listening connection
	// checks the release trigger there); immutable.
	StoreCfg pg.Config
	Store    Store // immutable; safe for concurrent use (DB workers, SetupSchema); *store.Store in production
	// Rec records spans, metrics and logs (internal/obs); immutable,
	// never nil. Its methods never block and are safe from any goroutine.
	Rec  *obs.Recorder
	Sig  *Signals  // immutable; nil in production
	Test TestHooks // immutable; zero in production

	ExtBatch                     int // immutable: items of one extend statement
	AcqLimit, relLimit, extLimit int // immutable: batches in flight per kind (not counting stuck ones, lane.go)
	maxConns                     int // immutable: the pool's MaxConns

	work chan func() // written by run (spawn), read by idle DB workers

	AcquireCh     chan *AcquireReq // written by Acquire/TryAcquire, read only by run
	releaseCh     chan *ReleaseReq // written by Lock.Release, read only by run
	extendCh      chan *ExtendReq  // written by Lock.Extend, read only by run
	AbandonCh     chan *AcquireReq // written by callers whose ctx ended, read only by run
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
	Closing   chan struct{} // closed by Close (once); read by run and callers
	Done      chan struct{} // closed by run when it has fully stopped
	closeErr  error         // written by run before done is closed; read by Close after done

	// AdvClose and advWait close the Manager's advisory locks (its
	// advisory.Client) and wait for that, called by run during Close:
	// after workCtx is cancelled, and before an owned pool is closed.
	// Immutable; nil when there is nothing to close.
	AdvClose func(timeout time.Duration)
	AdvWait  func()
}

// Config is the Manager's Config as the kernel sees it (the same
// fields, defaults filled: the Manager converts its Config).
type Config struct {
	pg.Config
	DisableNotify    bool
	FairQueue        bool
	ListenConnString string
	TTL              time.Duration
	AcquireTimeout   time.Duration
	Retry            retry.Policy
	LossMargin       time.Duration
	StatementTimeout time.Duration
	CloseTimeout     time.Duration
	MaxBatch         int
	MaxInFlight      int
	Telemetry        telemetry.Config
}

// Make makes the kernel of a Manager on pool (owned: closed at the end
// of Close) with cfg, the Manager's validated Config (Make fills its
// defaults), and the kernel's store on pool; Start starts it. op names
// the call in errors.
func Make(op string, pool *pgxpool.Pool, owns bool, cfg Config) (*Kernel, error) {
	extBatch := cmp.Or(cfg.MaxBatch, store.MaxExtendBatch)
	cfg = cfg.WithDefaults()
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
		return nil, Reop(op, err)
	}
	k := New(cfg, pool, owns, ls, pcfg, obs.New(cfg.Telemetry, dbTelemetry(pool)))
	k.ExtBatch = extBatch
	if cfg.FairQueue {
		k.qch = store.QueueChannel()
	}
	if !cfg.DisableNotify {
		lc := pool.Config().ConnConfig
		if cfg.ListenConnString != "" {
			lc, _ = pgx.ParseConfig(cfg.ListenConnString) // validated
		}
		k.listenCfg = connx.Bounded(lc, min(connx.DefaultConnectTimeout, cfg.StatementTimeout))
		// The listening session holds the waiter and watch locks `pglease
		// status` lists: name it by the Manager's holder identity.
		connx.AppName(&k.listenCfg.Config, ls.Holder())
	}
	if connx.UnboundedMultiHost(&pool.Config().ConnConfig.Config) {
		k.Rec.ConfigWarning("the pool's connection string lists several hosts but sets no connect_timeout: " +
			"its connects wait on a host that stopped answering and never try the next one; add connect_timeout=2 (see docs/failover.md)")
	}
	return k, nil
}

// dbTelemetry names the pool's server and database for the
// semantic-convention attributes of database spans (server.address,
// server.port, db.namespace).
func dbTelemetry(pool *pgxpool.Pool) obs.Database {
	cc := pool.Config().ConnConfig
	return obs.Database{Address: cc.Host, Port: int(cc.Port), Namespace: cc.Database}
}

// New makes a kernel on pool (owned: closed at the end of Close) with
// cfg (defaults filled) and the store ls; Make is New for a Manager.
func New(cfg Config, pool *pgxpool.Pool, owns bool, ls Store, storeCfg pg.Config, rec *obs.Recorder) *Kernel {
	return &Kernel{
		cfg:           cfg,
		Pool:          pool,
		ownsPool:      owns,
		Store:         ls,
		StoreCfg:      storeCfg,
		Rec:           rec,
		AcquireCh:     make(chan *AcquireReq),
		releaseCh:     make(chan *ReleaseReq),
		extendCh:      make(chan *ExtendReq),
		AbandonCh:     make(chan *AcquireReq),
		acquireDoneCh: make(chan acquireDone),
		releaseDoneCh: make(chan releaseDone),
		extendDoneCh:  make(chan extendDone),
		notifyCh:      make(chan notice),
		watchCh:       make(chan *watchReq),
		watchDoneCh:   make(chan watchDone),
		lossCh:        make(chan struct{}, 1),
		Closing:       make(chan struct{}),
		Done:          make(chan struct{}),
		work:          make(chan func()),
		refreshDoneCh: make(chan refreshDone, 1),
	}
}

// Start sets the caps from the pool's size and starts the loop (and,
// unless DisableNotify, the listener).
func (m *Kernel) Start() {
	m.maxConns = int(m.Pool.Config().MaxConns)
	perKind := max(1, (m.maxConns-1)/2)
	m.AcqLimit = min(m.cfg.MaxInFlight, perKind)
	m.relLimit = min(m.cfg.MaxInFlight, perKind)
	m.extLimit = m.cfg.MaxInFlight
	m.workCtx, m.cancelWork = context.WithCancel(context.Background())
	st := newLoopState(m)
	st.startListener() // subscribes the loop's parts; starts the listener unless DisableNotify
	go m.run(st)
}

// IsClosing reports whether Close has begun.
func (m *Kernel) IsClosing() bool {
	select {
	case <-m.Closing:
		return true
	default:
		return false
	}
}

// Submit sends req to run and waits for the answer, leaving cleanly
// (through abandonCh) when wctx ends. run is the only arbiter of a grant
// that races the caller's departure: after an abandon, run takes back a
// grant the caller never received and sends one final answer.
func (m *Kernel) Submit(op string, wctx context.Context, req *AcquireReq) AcquireReply {
	select {
	case m.AcquireCh <- req:
	case <-wctx.Done():
		return AcquireReply{Abandoned: true}
	case <-m.Closing:
		return AcquireReply{Err: ClosedErr(op)}
	}
	select {
	case r := <-req.Reply:
		return r
	case <-wctx.Done():
	}
	select {
	case m.AbandonCh <- req:
	case <-m.Done:
		return AcquireReply{Err: ClosedErr(op)}
	}
	select {
	case r := <-req.Final:
		return r
	case <-m.Done:
		// run answers every abandon it received before it stopped.
		select {
		case r := <-req.Final:
			return r
		default:
			return AcquireReply{Err: ClosedErr(op)}
		}
	}
}

// Defaults of Config's zero fields (each field's documentation says its
// default in words).
const (
	DefaultTTL              = 30 * time.Second
	DefaultStatementTimeout = 5 * time.Second
	DefaultCloseTimeout     = 5 * time.Second
	defaultMaxInFlight      = 1
)

// DefaultNotifyChannel is the Manager's DefaultNotifyChannel.
const DefaultNotifyChannel = "pglease_release"

// WithDefaults fills c's zero fields with their defaults (Config's
// fields document them).
func (c Config) WithDefaults() Config {
	c.TTL = cmp.Or(c.TTL, DefaultTTL)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, DefaultStatementTimeout)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, DefaultCloseTimeout)
	c.MaxBatch = cmp.Or(c.MaxBatch, store.MaxBatch)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, defaultMaxInFlight)
	c.NotifyChannel = cmp.Or(c.NotifyChannel, DefaultNotifyChannel)
	return c
}

func Invalid(op, msg string) error {
	return pgerr.New(pglease.CodeInvalidArgument, op, msg, nil)
}

func ClosedErr(op string) error {
	return pgerr.New(pglease.CodeClosed, op, "manager closed", nil)
}

// Reop gives a *pglease.Error (from package advisory, pg or pglease) the
// Manager's op; any other error, which none of them returns, becomes
// CodeInternal: every error of the Manager is a *pglease.Error.
func Reop(op string, err error) error {
	var e *pglease.Error
	if errors.As(err, &e) {
		return pgerr.New(e.Code, op, e.Msg, e.Err)
	}
	return pgerr.New(pglease.CodeInternal, op, "unexpected error", err)
}

// SubmitRelease hands a Lock.Release to run and waits for its answer
// (see Lock.Release): even a caller whose ctx has ended hands it over, so
// that the lock is released in the background; Close answers for a lock
// it released.
func (m *Kernel) SubmitRelease(op string, ctx context.Context, req *ReleaseReq) error {
	if err := ctx.Err(); err != nil {
		// Still stop the heartbeat and release in the background: a lock
		// left auto-extended because a deferred Release got an ended
		// context would otherwise be held until Close.
		select {
		case m.releaseCh <- req: // the loop takes it at once; its reply is dropped
		case <-m.Done:
		}
		return pgerr.New(pglease.CodeAborted, op, "context ended; the lock is being released in the background", err)
	}
	select {
	case m.releaseCh <- req:
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the release was sent", ctx.Err())
	case <-m.Done:
		return releasedAnswer(req.Lock) // Close released it
	}
	select {
	case err := <-req.Reply:
		return err
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the release was confirmed", ctx.Err())
	}
}

// SubmitExtend hands a Lock.Extend to run and waits for its answer (see
// Lock.Extend).
func (m *Kernel) SubmitExtend(op string, ctx context.Context, req *ExtendReq) error {
	select {
	case m.extendCh <- req:
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the extend was sent", ctx.Err())
	case <-m.Done:
		return EndedExtend(req.Lock.Err())
	}
	select {
	case err := <-req.Reply:
		return err
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the extend was answered; it goes on", ctx.Err())
	}
}
