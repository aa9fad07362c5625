package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pglease/pglease/internal/obs"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// recorder turns Manager events into spans, metrics and log records: the
// obs.RecorderImpl behind an *obs.Recorder, one per Manager, built by
// obs.New. All methods are safe for concurrent use, never block on I/O,
// never fail, and never panic on bad input. The handle answers for a nil
// Recorder; the nil checks left here are belt and braces.
type recorder struct {
	tracer  trace.Tracer
	log     *slog.Logger
	keys    *keyHasher
	rawKeys bool
	dbAttrs []attribute.KeyValue // server.address, server.port, db.namespace (obs.Database)

	acqDuration  metric.Float64Histogram
	acqAttempts  metric.Int64Histogram
	acqContended metric.Int64Counter
	acqCoalesced metric.Int64Counter
	held         metric.Int64UpDownCounter
	extends      metric.Int64Counter
	extendLag    metric.Float64Histogram
	lost         metric.Int64Counter
	releases     metric.Int64Counter
	batchSize    metric.Int64Histogram
	dbDuration   metric.Float64Histogram
	// listenPolling counts Managers that gave up LISTEN (ListenerPolling).
	listenPolling metric.Int64Counter
	// triggerInstalled is 1 per Manager whose lock table has the release
	// trigger, 0 for one without (ReleaseTrigger); trigger says whether
	// this recorder added its 1, which Close takes back.
	triggerInstalled metric.Int64UpDownCounter
	trigger          atomic.Int32
	// privWarned is when (Unix ns) a failed acquire last logged an
	// AuthFailed at Warn (errorLevel).
	privWarned atomic.Int64
	// missingTrigger is the notify channel when ReleaseTrigger found no
	// trigger for it; foreignLogged: ForeignHolder logged its record.
	missingTrigger atomic.Pointer[string]
	foreignLogged  atomic.Bool
	// listenUp: 0 unknown (never listened), 1 down, 2 up (ListenerUp).
	listenUp atomic.Int64

	// Precomputed attribute sets, so recording allocates nothing.
	kindOpt    [obs.NumKinds]mopts
	acqOpt     [obs.NumKinds][numAcquireOutcs]mopts
	extendOpt  [obs.NumKinds][2]mopts // ok, error
	lostOpt    [obs.NumKinds][obs.NumLossCauses]mopts
	releaseOpt [obs.NumKinds][3]mopts     // ok, not_held, error
	dbOpt      map[obs.DBOperation]dbOpts // read-only after New

	// holdDuration and waitDuration: how long locks were held (by kind)
	// and contended acquires waited (by kind and wait reason); live: the
	// acquisitions waiting or holding, for the age gauges (agesReg).
	holdDuration metric.Float64Histogram
	waitDuration metric.Float64Histogram
	waitOpt      [obs.NumKinds][obs.NumWaitReasons]mopts
	live         live
	agesReg      metric.Registration

	loop *loop
	reg  metric.Registration
}

// mopts is one precomputed attribute set, as the option slices the
// instruments take: passing a prebuilt slice to a variadic interface
// method allocates nothing.
type mopts struct {
	rec []metric.RecordOption
	add []metric.AddOption
}

func mset(kv ...attribute.KeyValue) mopts {
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return mopts{rec: []metric.RecordOption{o}, add: []metric.AddOption{o}}
}

type dbOpts struct {
	op      attribute.KeyValue
	batch   mopts
	success mopts
}

// scopeVersion is the instrumentation version of pglease's tracer and
// meter (named telemetry.ScopeName): the pglease release that records the
// data, so a dashboard can tell which release's names and units apply.
const scopeVersion = "0.1.0"

// init registers the recorder as the one obs.New builds: every program
// that builds a Manager links this package (manager.Config holds a
// Config), so obs.New never runs without it.
func init() { obs.Register(newRecorderImpl) }

func newRecorderImpl(c Config, db obs.Database) obs.RecorderImpl { return newRecorder(c, db) }

// newRecorder returns a recorder configured by c (the user's
// manager.Config.Telemetry; the zero value means the defaults), for round
// trips to db. It never fails: an instrument that cannot be created is
// reported to otel.Handle and replaced by a no-op one.
func newRecorder(c Config, db obs.Database) *recorder {
	tp, mp, logger := c.TracerProvider, c.MeterProvider, c.Logger
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &recorder{
		tracer: tp.Tracer(ScopeName,
			trace.WithInstrumentationVersion(scopeVersion),
			trace.WithSchemaURL(semconv.SchemaURL)),
		log:     logger,
		keys:    newKeyHasher(append([]byte(nil), c.KeySecret...)),
		rawKeys: c.RawKeys,
		dbAttrs: dbAttributes(db),
	}
	meter := mp.Meter(ScopeName,
		metric.WithInstrumentationVersion(scopeVersion),
		metric.WithSchemaURL(semconv.SchemaURL))
	r.initInstruments(meter)
	r.loop = newLoop(r, time.Now)
	r.loop.register(r, meter)
	r.registerAges(meter)
	return r
}

func dbAttributes(d obs.Database) []attribute.KeyValue {
	var kv []attribute.KeyValue
	if d.Address != "" {
		kv = append(kv, semconv.ServerAddress(d.Address))
	}
	if d.Port > 0 {
		kv = append(kv, semconv.ServerPort(d.Port))
	}
	if d.Namespace != "" {
		kv = append(kv, semconv.DBNamespace(d.Namespace))
	}
	return kv
}

// Close unregisters the recorder's metric callbacks (loop busy ratio and
// queue depths) and takes the Manager out of
// pglease.release_trigger.installed. Call it when the Manager has
// stopped. Other methods keep working after Close.
func (r *recorder) Close() {
	if r == nil {
		return
	}
	if r.trigger.Swap(triggerClosed) == triggerCounted {
		r.triggerInstalled.Add(context.Background(), -1)
	}
	if r.agesReg != nil {
		if err := r.agesReg.Unregister(); err != nil {
			otel.Handle(err)
		}
	}
	if r.reg == nil {
		return
	}
	if err := r.reg.Unregister(); err != nil {
		otel.Handle(err)
	}
}

// Key returns the obs.KeyID of key. It normalises the key to NFC and hashes it
// (see obs.KeyID.Hash): call it once per request, in the caller's goroutine.
func (r *recorder) Key(key string) obs.KeyID {
	if r == nil {
		return obs.KeyID{}
	}
	return obs.NewKeyID(r.keys.hash(key), r.raw(key))
}

// KeyHashed is Key for a key whose pglease.HashKey the caller already
// computed (hash): without a KeySecret that is the obs.KeyID's hash, so the
// key is not hashed twice and the obs.KeyID shares the caller's string.
func (r *recorder) KeyHashed(key, hash string) obs.KeyID {
	if r == nil || r.keys.secret != nil {
		return r.Key(key)
	}
	return obs.NewKeyID(hash, r.raw(key))
}

// raw is the raw key a KeyID keeps: key with Config.RawKeys, else none.
func (r *recorder) raw(key string) string {
	if r.rawKeys {
		return key
	}
	return ""
}

// keyAttrs appends the key's attributes: the hash, and the raw key only
// when opted in.
func (r *recorder) keyAttrs(dst []attribute.KeyValue, k obs.KeyID) []attribute.KeyValue {
	dst = append(dst, attrKeyHash.String(k.Hash()))
	if r.rawKeys && k.Raw() != "" {
		dst = append(dst, attrKey.String(k.Raw()))
	}
	return dst
}

// logKey logs msg with the key's fields when the logger is enabled at
// level. Callers check r.log.Enabled first when building attrs costs.
func (r *recorder) logKey(ctx context.Context, level slog.Level, msg string, k obs.KeyID, kind obs.LockKind, attrs ...slog.Attr) {
	all := make([]slog.Attr, 0, len(attrs)+3)
	all = append(all, slog.String("key.hash", k.Hash()))
	if r.rawKeys && k.Raw() != "" {
		all = append(all, slog.String("key", k.Raw()))
	}
	all = append(all, slog.String("lock.kind", kind.String()))
	all = append(all, attrs...)
	r.log.LogAttrs(ctx, level, msg, all...)
}

func (r *recorder) logEnabled(ctx context.Context, level slog.Level) bool {
	return r.log.Enabled(ctx, level)
}

// handle reports an instrument-creation error and returns whether the
// instrument is usable.
func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}

func (r *recorder) initInstruments(m metric.Meter) {
	nm := noop.Meter{}
	var err error

	r.acqDuration, err = m.Float64Histogram(metricAcquireDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Time from an acquire call to its outcome, including all waiting and retries."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	if err != nil || r.acqDuration == nil {
		handle(err)
		r.acqDuration, _ = nm.Float64Histogram("")
	}
	r.acqAttempts, err = m.Int64Histogram(metricAcquireAttempts,
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Database attempts an acquire saw before its outcome."),
		metric.WithExplicitBucketBoundaries(0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 100))
	if err != nil || r.acqAttempts == nil {
		handle(err)
		r.acqAttempts, _ = nm.Int64Histogram("")
	}
	r.acqContended, err = m.Int64Counter(metricAcquireContended,
		metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquires that found their key held at least once."))
	if err != nil || r.acqContended == nil {
		handle(err)
		r.acqContended, _ = nm.Int64Counter("")
	}
	r.acqCoalesced, err = m.Int64Counter(metricAcquireCoalesced,
		metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquires that queued behind another caller of this process for the same key."))
	if err != nil || r.acqCoalesced == nil {
		handle(err)
		r.acqCoalesced, _ = nm.Int64Counter("")
	}
	r.held, err = m.Int64UpDownCounter(metricLockHeld,
		metric.WithUnit("{lock}"),
		metric.WithDescription("Locks currently held by this process."))
	if err != nil || r.held == nil {
		handle(err)
		r.held, _ = nm.Int64UpDownCounter("")
	}
	r.extends, err = m.Int64Counter(metricLockExtends,
		metric.WithUnit("{extend}"),
		metric.WithDescription("Automatic extends of held locks, by outcome."))
	if err != nil || r.extends == nil {
		handle(err)
		r.extends, _ = nm.Int64Counter("")
	}
	r.extendLag, err = m.Float64Histogram(metricLockExtendLag,
		metric.WithUnit("s"),
		metric.WithDescription("How late an extend started after it was due."),
		metric.WithExplicitBucketBoundaries(0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil || r.extendLag == nil {
		handle(err)
		r.extendLag, _ = nm.Float64Histogram("")
	}
	r.lost, err = m.Int64Counter(metricLockLost,
		metric.WithUnit("{lock}"),
		metric.WithDescription("Held locks lost, by cause."))
	if err != nil || r.lost == nil {
		handle(err)
		r.lost, _ = nm.Int64Counter("")
	}
	r.releases, err = m.Int64Counter(metricLockReleases,
		metric.WithUnit("{release}"),
		metric.WithDescription("Releases of locks, by outcome."))
	if err != nil || r.releases == nil {
		handle(err)
		r.releases, _ = nm.Int64Counter("")
	}
	r.batchSize, err = m.Int64Histogram(metricDBBatchSize,
		metric.WithUnit("{item}"),
		metric.WithDescription("Items (keys, locks) carried by one database round trip."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
	if err != nil || r.batchSize == nil {
		handle(err)
		r.batchSize, _ = nm.Int64Histogram("")
	}
	r.dbDuration, err = m.Float64Histogram(metricDBClientDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Duration of database client operations."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10))
	if err != nil || r.dbDuration == nil {
		handle(err)
		r.dbDuration, _ = nm.Float64Histogram("")
	}
	r.listenPolling, err = m.Int64Counter(metricListenerPolling,
		metric.WithUnit("{manager}"),
		metric.WithDescription("Managers that do not listen for release notifications (their listening connection goes through a transaction-mode pooler) and poll instead."))
	if err != nil || r.listenPolling == nil {
		handle(err)
		r.listenPolling, _ = nm.Int64Counter("")
	}

	r.triggerInstalled, err = m.Int64UpDownCounter(metricReleaseTriggerInstalled,
		metric.WithUnit("{manager}"),
		metric.WithDescription("Whether the lock table has the release trigger for the Manager's notify channel (1 = installed, 0 = not): "+
			"without it, releases by SyncGuard processes sharing the tables wake waiters only by polling."))
	if err != nil || r.triggerInstalled == nil {
		handle(err)
		r.triggerInstalled, _ = nm.Int64UpDownCounter("")
	}

	r.holdDuration, err = m.Float64Histogram(metricLockHoldDuration,
		metric.WithUnit("s"),
		metric.WithDescription("How long a lock was held, from its grant to its release or loss."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400))
	if err != nil || r.holdDuration == nil {
		handle(err)
		r.holdDuration, _ = nm.Float64Histogram("")
	}
	r.waitDuration, err = m.Float64Histogram(metricAcquireWaitDuration,
		metric.WithUnit("s"),
		metric.WithDescription("How long an acquire that found its key held waited, from the call to its outcome, by the last refusal's reason."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	if err != nil || r.waitDuration == nil {
		handle(err)
		r.waitDuration, _ = nm.Float64Histogram("")
	}

	set := mset
	for k := range obs.NumKinds {
		kk := attrLockKind.String(k.String())
		r.kindOpt[k] = set(kk)
		for w := range obs.NumWaitReasons {
			r.waitOpt[k][w] = set(kk, attrWaitReason.String(w.String()))
		}
		for o := range acquireOutcome(numAcquireOutcs) {
			r.acqOpt[k][o] = set(kk, attrOutcome.String(acquireOutcomeNames[o]))
		}
		r.extendOpt[k][0] = set(kk, attrOutcome.String(outcomeOK))
		r.extendOpt[k][1] = set(kk, attrOutcome.String(outcomeError))
		for c := range obs.NumLossCauses {
			r.lostOpt[k][c] = set(kk, attrLossCause.String(c.String()))
		}
		r.releaseOpt[k][0] = set(kk, attrOutcome.String(outcomeOK))
		r.releaseOpt[k][1] = set(kk, attrOutcome.String(outcomeNotHeld))
		r.releaseOpt[k][2] = set(kk, attrOutcome.String(outcomeError))
	}
	r.dbOpt = make(map[obs.DBOperation]dbOpts)
	for _, op := range []obs.DBOperation{obs.OpAcquireMany, obs.OpReleaseMany, obs.OpExtendMany, obs.OpHandOff, obs.OpAcquireShared, obs.OpAcquireSets,
		obs.OpAdvisoryLock, obs.OpAdvisoryTryLock, obs.OpAdvisoryUnlock, obs.OpListen, obs.OpRevoke, obs.OpRequestRelease, obs.OpSnapshot} {
		r.dbOpt[op] = r.newDBOpts(op)
	}
}

func (r *recorder) newDBOpts(op obs.DBOperation) dbOpts {
	kv := semconv.DBOperationName(string(op))
	return dbOpts{
		op:      kv,
		batch:   mset(kv),
		success: mset(append([]attribute.KeyValue{semconv.DBSystemNamePostgreSQL, kv}, r.dbAttrs...)...),
	}
}

func (r *recorder) dbOpts(op obs.DBOperation) dbOpts {
	if o, ok := r.dbOpt[op]; ok {
		return o
	}
	return r.newDBOpts(op)
}
