package obs

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
)

// NewKeyID returns the KeyID of a key whose hash is hash; raw is the raw
// key, kept only when the recorder was configured with Config.RawKeys
// (empty otherwise). For the recorder in package telemetry.
func NewKeyID(hash, raw string) KeyID { return KeyID{hash: hash, raw: raw} }

// Raw returns the raw key, empty unless the recorder was configured with
// Config.RawKeys. Only the recorder reads it (for the pglease.key
// attribute); never log or print it elsewhere.
func (k KeyID) Raw() string { return k.raw }

// The recorder behind the handles below is package telemetry's: it
// implements RecorderImpl, AcquisitionImpl and LoopImpl with unexported
// types and registers its constructor with Register in its init. The
// handles keep what callers rely on (nil and zero values record nothing)
// and hold no state of their own beyond the span a DBSpan, Heartbeat or
// Release carries, so a round trip costs no allocation more than the
// recorder's.

// RecorderImpl records one Manager's telemetry (package telemetry's
// recorder). Recorder forwards to it; its methods are never called on a
// nil Recorder.
type RecorderImpl interface {
	Key(key string) KeyID
	KeyHashed(key, hash string) KeyID
	StartAcquire(ctx context.Context, key KeyID, info AcquireInfo) (context.Context, *Acquisition)
	StartDB(ctx context.Context, op DBOperation, batch int, parent trace.SpanContext, served ...trace.SpanContext) (context.Context, DBSpan)
	EndDB(span trace.Span, op DBOperation, batch int, start time.Time, ok int, err error)
	StartHeartbeat(ctx context.Context, due int) (context.Context, Heartbeat)
	EndHeartbeat(span trace.Span, extended, lost int, err error)
	Loop() LoopImpl
	ListenerPolling(reason string)
	ConfigWarning(msg string)
	ReleaseTrigger(installed bool, channel string)
	ForeignHolder()
	ListenerUp(up bool)
	Overload(on bool, info OverloadInfo)
	Close()
}

// AcquisitionImpl follows one acquire and the life of its lock (package
// telemetry's acquisition); see Acquisition for each method.
type AcquisitionImpl interface {
	Key() KeyID
	SpanContext() trace.SpanContext
	Queued(q QueueInfo)
	Ticket(position int)
	Attempt(db trace.SpanContext, outcome AttemptOutcome, retryIn time.Duration)
	Waiting(reason WaitReason, holder string)
	Granted(fence pglease.Fence)
	NotAcquired()
	Failed(err error)
	// FailedSet is the package function FailedSet, called on the set's
	// first non-nil acquisition.
	FailedSet(acqs []*Acquisition, err error)
	Extended(lag time.Duration)
	ExtendFailed(err error)
	Lost(cause LossCause, by trace.SpanContext)
	StartRelease(ctx context.Context) (context.Context, Release)
	ReleaseServed(span trace.Span, db trace.SpanContext)
	EndRelease(span trace.Span, start time.Time, err error)
}

// LoopImpl measures the Manager loop (package telemetry's loop meter).
type LoopImpl interface {
	Busy()
	Idle()
	SetDepth(q Queue, n int)
}

// registered is the recorder's constructor, a func(C, Database)
// RecorderImpl for the configuration type C Register was called with.
var registered atomic.Pointer[any]

// Register installs the recorder's constructor; package telemetry calls it
// in its init, with C its Config. Every program that builds a Manager
// links package telemetry (manager.Config holds a telemetry.Config), so
// New finds it.
func Register[C any](newImpl func(c C, db Database) RecorderImpl) {
	f := any(newImpl)
	registered.Store(&f)
}

// New returns the Recorder configured by c (the user's
// manager.Config.Telemetry; the zero value means the defaults), for round
// trips to db. It never fails at run time; it panics when no recorder was
// registered for c's type, which is a build mistake (package telemetry not
// linked) that every test building a Manager would show at once, never a
// silent loss of spans.
func New[C any](c C, db Database) *Recorder {
	var f func(C, Database) RecorderImpl
	if p := registered.Load(); p != nil {
		f, _ = (*p).(func(C, Database) RecorderImpl)
	}
	if f == nil {
		panic(fmt.Sprintf("obs.New: no recorder registered for %T: import github.com/pglease/pglease/telemetry, whose init registers it", c))
	}
	r := &Recorder{impl: f(c, db)}
	if l := r.impl.Loop(); l != nil {
		r.loop = &Loop{impl: l}
	}
	return r
}

// Recorder turns Manager events into spans, metrics and log records. Build
// one per Manager with New; all methods are safe for concurrent use, never
// block on I/O, never fail, and never panic on bad input. A nil *Recorder
// is valid and records nothing, at the cost of a nil check.
type Recorder struct {
	impl RecorderImpl
	loop *Loop
}

// Impl returns the recorder behind r (nil for a nil r), for the
// recorder's own tests.
func (r *Recorder) Impl() RecorderImpl {
	if r == nil {
		return nil
	}
	return r.impl
}

// Close unregisters the Recorder's metric callbacks (loop busy ratio,
// queue depths, ages) and takes the Manager out of
// pglease.release_trigger.installed. Call it when the Manager has
// stopped. Other methods keep working after Close.
func (r *Recorder) Close() {
	if r != nil {
		r.impl.Close()
	}
}

// Key returns the KeyID of key. It normalises the key to NFC and hashes it
// (see KeyID.Hash): call it once per request, in the caller's goroutine.
// A nil Recorder returns the zero KeyID without hashing.
func (r *Recorder) Key(key string) KeyID {
	if r == nil {
		return KeyID{}
	}
	return r.impl.Key(key)
}

// KeyHashed is Key for a key whose pglease.HashKey the caller already
// computed (hash): without a KeySecret that is the KeyID's hash, so the
// key is not hashed twice and the KeyID shares the caller's string.
func (r *Recorder) KeyHashed(key, hash string) KeyID {
	if r == nil {
		return KeyID{}
	}
	return r.impl.KeyHashed(key, hash)
}

// StartAcquire starts the pglease.acquire span as a child of the span in
// ctx (the caller's trace) and returns ctx carrying it. Call it in the
// caller's goroutine, after validation, before enqueueing the request.
func (r *Recorder) StartAcquire(ctx context.Context, key KeyID, info AcquireInfo) (context.Context, *Acquisition) {
	if r == nil {
		return ctx, nil
	}
	return r.impl.StartAcquire(ctx, key, info)
}

// StartDB starts the client span of one round trip carrying batch items.
// Call it in the worker goroutine, right before the SQL, and pass the
// returned ctx to pgx. The parent is:
//   - parent, when valid: the span of the operation the round trip is
//     made for (the acquire span of the one key's head waiter, the one
//     release it carries), so a caller's round trips are in its trace;
//   - otherwise the span in ctx (e.g. a Heartbeat's), or none: a batch
//     carrying several keys or releases is a root span.
//
// served are the spans of the operations the round trip serves (every
// waiter of every key it carries, the releases, the held locks it
// extends): the span links to each valid one other than its parent, from
// its start, as the messaging conventions link a batch to the messages it
// processes. So every caller's trace reaches every round trip made for it,
// as a child or through a link; the operation spans also link to the
// round trip (Acquisition.Attempt, Release.Served). At most MaxLinks.
func (r *Recorder) StartDB(ctx context.Context, op DBOperation, batch int, parent trace.SpanContext, served ...trace.SpanContext) (context.Context, DBSpan) {
	if r == nil {
		return ctx, DBSpan{}
	}
	return r.impl.StartDB(ctx, op, batch, parent, served...)
}

// StartHeartbeat starts a pglease.heartbeat span for a round extending due
// locks, and returns ctx carrying it: pass that ctx to StartDB (with an
// invalid parent) so the extend round trip is its child. Loop or worker.
func (r *Recorder) StartHeartbeat(ctx context.Context, due int) (context.Context, Heartbeat) {
	if r == nil {
		return ctx, Heartbeat{}
	}
	return r.impl.StartHeartbeat(ctx, due)
}

// Loop returns the Recorder's loop meter (one per Recorder, so one
// Recorder per Manager). Nil for a nil Recorder.
func (r *Recorder) Loop() *Loop {
	if r == nil {
		return nil
	}
	return r.loop
}

// ListenerPolling records that the Manager polls instead of listening for
// release notifications (its listening connection goes through a
// transaction-mode pooler): pglease.listener.polling, and one Warn record
// saying why (reason).
func (r *Recorder) ListenerPolling(reason string) {
	if r != nil {
		r.impl.ListenerPolling(reason)
	}
}

// ConfigWarning logs msg at Warn: a configuration the Manager accepted
// but that will not work as the user expects.
func (r *Recorder) ConfigWarning(msg string) {
	if r != nil {
		r.impl.ConfigWarning(msg)
	}
}

// ReleaseTrigger records whether the lock table has the release trigger
// for the Manager's notify channel: pglease.release_trigger.installed, and
// an Info record naming the channel when it does not.
func (r *Recorder) ReleaseTrigger(installed bool, channel string) {
	if r != nil {
		r.impl.ReleaseTrigger(installed, channel)
	}
}

// ForeignHolder logs, once per Recorder, that a key was found held by a
// process that does not notify its releases.
func (r *Recorder) ForeignHolder() {
	if r != nil {
		r.impl.ForeignHolder()
	}
}

// ListenerUp records whether the Manager's listening session is connected
// (pglease.listener.up).
func (r *Recorder) ListenerUp(up bool) {
	if r != nil {
		r.impl.ListenerUp(up)
	}
}

// Overload records that the Manager started (on) or stopped shedding
// acquires because the database answered slowly: pglease.manager.overload
// is 1 while it sheds, and each change is one log record, Warn when it
// starts, Info when it stops. Safe from any goroutine; the Manager calls
// it on changes only.
func (r *Recorder) Overload(on bool, info OverloadInfo) {
	if r != nil {
		r.impl.Overload(on, info)
	}
}

// Acquisition follows one acquire from the caller's call to its outcome
// and, when granted, the lock's life until it is released or lost. It
// owns the pglease.acquire span. Its methods are safe for concurrent use
// and each end state is reached once: later calls are no-ops. A nil
// *Acquisition is valid and records nothing.
//
// Order the Manager keeps: StartAcquire (caller) → Queued, Attempt (loop,
// any number) → exactly one of Granted (loop, before it sends the reply),
// Failed or NotAcquired (loop or caller) → for a granted lock, any number
// of Extended / ExtendFailed (loop) → one of StartRelease … Release.End or
// Lost. Granted must happen before any Extended, Lost or StartRelease of
// the same lock; calling Granted from the loop guarantees that.
type Acquisition struct {
	impl AcquisitionImpl
}

// NewAcquisition returns the handle of impl. The recorder keeps it inside
// its own acquisition and hands out its address, so that an acquire costs
// one allocation, not two.
func NewAcquisition(impl AcquisitionImpl) Acquisition { return Acquisition{impl: impl} }

// Impl returns the acquisition behind a (nil for a nil a), for the
// recorder.
func (a *Acquisition) Impl() AcquisitionImpl {
	if a == nil {
		return nil
	}
	return a.impl
}

// Key returns the acquisition's KeyID.
func (a *Acquisition) Key() KeyID {
	if a == nil {
		return KeyID{}
	}
	return a.impl.Key()
}

// SpanContext returns the pglease.acquire span's context: the parent of
// the round trips made for this acquire, and a link of the others.
func (a *Acquisition) SpanContext() trace.SpanContext {
	if a == nil {
		return trace.SpanContext{}
	}
	return a.impl.SpanContext()
}

// Queued records how the acquire entered its key's local FIFO: the
// pglease.queued event, and the coalesced and contended flags. Loop.
func (a *Acquisition) Queued(q QueueInfo) {
	if a != nil {
		a.impl.Queued(q)
	}
}

// Ticket records the acquire's position in the fair queue of its key (the
// pglease.ticket event).
func (a *Acquisition) Ticket(position int) {
	if a != nil {
		a.impl.Ticket(position)
	}
}

// Attempt records one database attempt made for this acquire: the
// pglease.attempt event, linked to the round trip's span db; retryIn is
// the backoff before the next attempt (0: none). Loop.
func (a *Acquisition) Attempt(db trace.SpanContext, outcome AttemptOutcome, retryIn time.Duration) {
	if a != nil {
		a.impl.Attempt(db, outcome, retryIn)
	}
}

// Waiting records why the acquire waits after a refusal (reason) and who
// holds the key (holder, may be empty): a pglease.wait event when either
// changed, and the reason of pglease.acquire.wait.duration and
// pglease.acquire.wait.longest. WaitNone records nothing.
func (a *Acquisition) Waiting(reason WaitReason, holder string) {
	if a != nil {
		a.impl.Waiting(reason, holder)
	}
}

// Granted ends the acquire as granted with fence and counts the lock in
// pglease.lock.held. Call it in the loop before replying to the caller.
func (a *Acquisition) Granted(fence pglease.Fence) {
	if a != nil {
		a.impl.Granted(fence)
	}
}

// NotAcquired ends a TryAcquire that found the key held (outcome locked).
// A no-op once the acquire ended.
func (a *Acquisition) NotAcquired() {
	if a != nil {
		a.impl.NotAcquired()
	}
}

// Failed ends the acquire with err (timeout, aborted, closed or error by
// its Code). A no-op once the acquire ended, so the caller may call it
// whatever the loop did.
func (a *Acquisition) Failed(err error) {
	if a != nil {
		a.impl.Failed(err)
	}
}

// FailedSet is Failed for every acquisition of one all-or-nothing set
// (AcquireAll): each span ends failed, but a failure that logs (an error,
// not a timeout) logs one record for the set, the first key's, with
// set.size, instead of one per key.
func FailedSet(acqs []*Acquisition, err error) {
	for _, a := range acqs {
		if a != nil {
			a.impl.FailedSet(acqs, err)
			return
		}
	}
}

// Extended records an automatic extend of the held lock, lag after it was
// due (pglease.lock.extends ok, pglease.lock.extend.lag).
func (a *Acquisition) Extended(lag time.Duration) {
	if a != nil {
		a.impl.Extended(lag)
	}
}

// ExtendFailed records an extend of the held lock that failed with err,
// the lock still held (pglease.lock.extends error).
func (a *Acquisition) ExtendFailed(err error) {
	if a != nil {
		a.impl.ExtendFailed(err)
	}
}

// Lost records that the held lock was lost for cause: a pglease.lost
// span linked to the acquire and to by (the round trip or heartbeat that
// found it), pglease.lock.lost, and the lock no longer counted as held.
func (a *Acquisition) Lost(cause LossCause, by trace.SpanContext) {
	if a != nil {
		a.impl.Lost(cause, by)
	}
}

// StartRelease starts the pglease.release span as a child of ctx (the
// releasing caller's trace, or the Manager's drain context on Close),
// linked to the lock's pglease.acquire span.
func (a *Acquisition) StartRelease(ctx context.Context) (context.Context, Release) {
	if a == nil {
		return ctx, Release{}
	}
	return a.impl.StartRelease(ctx)
}

// DBSpan follows one database round trip (one transaction or statement,
// however many keys it carries): a SpanKindClient span named after the
// DBOperation. The zero DBSpan is valid and records nothing. It is a small
// value: pass it by value.
type DBSpan struct {
	r     RecorderImpl
	span  trace.Span
	op    DBOperation
	batch int
	start time.Time
}

// NewDBSpan returns the handle of a round trip's span, for the recorder.
func NewDBSpan(r RecorderImpl, span trace.Span, op DBOperation, batch int, start time.Time) DBSpan {
	return DBSpan{r: r, span: span, op: op, batch: batch, start: start}
}

// SpanContext returns the span's context, for Acquisition.Attempt,
// Release.Served and Acquisition.Lost links.
func (d DBSpan) SpanContext() trace.SpanContext {
	if d.span == nil {
		return trace.SpanContext{}
	}
	return d.span.SpanContext()
}

// End ends the round trip: ok is how many items succeeded (granted,
// extended, released; for a contended acquire batch, fewer than the batch
// size), err the round trip's error (nil when it completed, whatever the
// per-item answers). Records db.client.operation.duration and
// pglease.db.batch.size.
func (d DBSpan) End(ok int, err error) {
	if d.r != nil {
		d.r.EndDB(d.span, d.op, d.batch, d.start, ok, err)
	}
}

// Heartbeat follows one heartbeat round: all extends due in one tick,
// sent as one round trip. The zero Heartbeat is valid and records nothing.
type Heartbeat struct {
	r    RecorderImpl
	span trace.Span
}

// NewHeartbeat returns the handle of a heartbeat's span, for the recorder.
func NewHeartbeat(r RecorderImpl, span trace.Span) Heartbeat {
	return Heartbeat{r: r, span: span}
}

// SpanContext returns the heartbeat span's context (e.g. for Lost's by).
func (h Heartbeat) SpanContext() trace.SpanContext {
	if h.span == nil {
		return trace.SpanContext{}
	}
	return h.span.SpanContext()
}

// End ends the round: extended and lost locks, err the round trip's error.
func (h Heartbeat) End(extended, lost int, err error) {
	if h.r != nil {
		h.r.EndHeartbeat(h.span, extended, lost, err)
	}
}

// Release follows one release of a held lock: the pglease.release span.
// The zero Release is valid and records nothing.
type Release struct {
	a     AcquisitionImpl
	span  trace.Span
	start time.Time
}

// NewRelease returns the handle of a release's span, for the recorder.
func NewRelease(a AcquisitionImpl, span trace.Span, start time.Time) Release {
	return Release{a: a, span: span, start: start}
}

// Served links the release span to the DB span that carried it.
func (rl Release) Served(db trace.SpanContext) {
	if rl.a != nil {
		rl.a.ReleaseServed(rl.span, db)
	}
}

// End ends the release: err nil (released), an error with Code LockLost
// (the lock was no longer this holder's: outcome "not_held"), or another
// error. Whatever the outcome, this process no longer counts the lock as
// held (pglease.lock.held goes down once per lock, by End or Lost).
func (rl Release) End(err error) {
	if rl.a != nil {
		rl.a.EndRelease(rl.span, rl.start, err)
	}
}

// Loop measures the Manager loop: how busy it is and the depth of its
// queues. Busy and Idle are for the loop goroutine only; SetDepth may be
// called from any goroutine. Each costs a clock read or an atomic store,
// and nothing else: the numbers are read by the MeterProvider's
// collection, through callbacks. A nil *Loop is valid and records
// nothing.
type Loop struct {
	impl LoopImpl
}

// Impl returns the loop meter behind l (nil for a nil l), for the
// recorder's own tests.
func (l *Loop) Impl() LoopImpl {
	if l == nil {
		return nil
	}
	return l.impl
}

// Busy marks the start of a busy period (the loop got an event).
func (l *Loop) Busy() {
	if l != nil {
		l.impl.Busy()
	}
}

// Idle marks its end (the loop is about to wait in select).
func (l *Loop) Idle() {
	if l != nil {
		l.impl.Idle()
	}
}

// SetDepth records the depth of queue q.
func (l *Loop) SetDepth(q Queue, n int) {
	if l != nil {
		l.impl.SetDepth(q, n)
	}
}
