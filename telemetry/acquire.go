package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/obs"
)

// Span start options, built once: an option and a variadic slice passed
// to an interface method are each an allocation.
var (
	startInternal = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	startClient   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// acquisition states.
const (
	stAcquiring uint32 = iota
	stHeld
	stFailed
	stReleased
	stLost
)

const (
	flagCoalesced uint32 = 1 << iota
	flagContended
)

// acquisition follows one acquire from the caller's call to its outcome
// and, when granted, the lock's life until it is released or lost. It
// owns the pglease.acquire span. Its methods are safe for concurrent use
// and each end state is reached once: later calls are no-ops. Callers hold
// its handle, pub (an *obs.Acquisition, nil when nothing is recorded).
//
// Order the Manager keeps: StartAcquire (caller) → Queued, Attempt (loop,
// any number) → exactly one of Granted (loop, before it sends the reply),
// Failed or NotAcquired (loop or caller) → for a granted lock, any number
// of Extended / ExtendFailed (loop) → one of StartRelease … EndRelease or
// Lost. Granted must happen before any Extended, Lost or StartRelease of
// the same lock; calling Granted from the loop guarantees that.
type acquisition struct {
	pub   obs.Acquisition // the handle callers hold: &a.pub
	r     *recorder
	span  trace.Span
	sc    trace.SpanContext
	key   obs.KeyID
	kind  obs.LockKind
	try   bool
	start time.Time

	attempts atomic.Int64
	flags    atomic.Uint32
	state    atomic.Uint32
	granted  atomic.Int64 // 1 + nanoseconds from start to the grant (monotonic); 0 = not granted

	// The last refusal's reason (an obs.WaitReason) and holder (Waiting).
	waitReason atomic.Uint32
	waitHolder atomic.Pointer[string]
}

// noopSpan is the Span of a context without one: a no-op that allocates
// nothing.
var noopSpan = trace.SpanFromContext(context.Background())

// StartAcquire starts the pglease.acquire span as a child of the span in
// ctx (the caller's trace) and returns ctx carrying it. Call it in the
// caller's goroutine, after validation, before enqueueing the request.
func (r *recorder) StartAcquire(ctx context.Context, key obs.KeyID, info obs.AcquireInfo) (context.Context, *obs.Acquisition) {
	if ctx == nil {
		ctx = context.Background()
	}
	kind := info.Kind.Norm()
	a := &acquisition{r: r, key: key, kind: kind, try: info.Try, start: time.Now()}
	a.pub = obs.NewAcquisition(a)
	ctx, a.span = r.tracer.Start(ctx, spanAcquire, startInternal...)
	a.sc = a.span.SpanContext()
	if !a.span.IsRecording() {
		// Nothing to record (no SDK, or not sampled): keep no reference to
		// the span, which the acquisition would hold for as long as the lock
		// is held (≈ 100 bytes of heap per held lock; End is a no-op on it).
		a.span = noopSpan
	} else {
		attrs := make([]attribute.KeyValue, 0, 5)
		attrs = r.keyAttrs(attrs, key)
		attrs = append(attrs, attrLockKind.String(kind.String()), attrTry.Bool(info.Try))
		if info.TTL > 0 {
			attrs = append(attrs, attrTTL.Float64(info.TTL.Seconds()))
		}
		a.span.SetAttributes(attrs...)
	}
	return ctx, &a.pub
}

// Key returns the acquisition's obs.KeyID.
func (a *acquisition) Key() obs.KeyID {
	if a == nil {
		return obs.KeyID{}
	}
	return a.key
}

// SpanContext returns the pglease.acquire span's context, e.g. to parent
// the DB span of a round trip that serves only this acquire (StartDB).
func (a *acquisition) SpanContext() trace.SpanContext {
	if a == nil {
		return trace.SpanContext{}
	}
	return a.sc
}

// Queued records that the acquire entered its key's local FIFO (loop).
func (a *acquisition) Queued(q obs.QueueInfo) {
	if a == nil {
		return
	}
	var f uint32
	if q.Coalesced {
		f |= flagCoalesced
	}
	if q.HeldLocally {
		f |= flagContended
	}
	if f != 0 {
		a.flags.Or(f)
	}
	if q.HeldLocally && a.waitReason.CompareAndSwap(uint32(obs.WaitNone), uint32(obs.WaitHeldLocally)) {
		a.r.live.add(a)
		if a.state.Load() != stAcquiring {
			a.r.live.remove(a)
		}
	}
	if a.span.IsRecording() {
		a.span.AddEvent(eventQueued, trace.WithAttributes(
			attrCoalesced.Bool(q.Coalesced),
			attrContended.Bool(q.HeldLocally),
			attrQueuePosition.Int(q.Position)))
	}
}

// Ticket records the caller's place in its key's fair queue in the
// database (1: the head), when an attempt or a refresh of its ticket
// found it waiting there and the place changed (loop).
func (a *acquisition) Ticket(position int) {
	if a == nil || !a.span.IsRecording() {
		return
	}
	a.span.AddEvent(eventTicket, trace.WithAttributes(attrTicketPos.Int(position)))
}

// Attempt records one database attempt made on this acquire's behalf
// (loop, when the attempt's result arrives): its outcome, the DB span
// that carried it (linked from the acquire span; pass obs.DBSpan.SpanContext),
// and the backoff before the next attempt (0 if none is scheduled). With
// coalescing, call it for every waiter the attempt served: attempts are
// counted per caller.
func (a *acquisition) Attempt(db trace.SpanContext, outcome obs.AttemptOutcome, retryIn time.Duration) {
	if a == nil {
		return
	}
	n := a.attempts.Add(1)
	if outcome == obs.AttemptContended {
		a.flags.Or(flagContended)
	}
	if !a.span.IsRecording() {
		return
	}
	if db.IsValid() {
		a.span.AddLink(trace.Link{SpanContext: db})
	}
	attrs := []attribute.KeyValue{attrAttempt.Int64(n), attrOutcome.String(outcome.String())}
	if retryIn > 0 {
		attrs = append(attrs, attrRetryIn.Float64(retryIn.Seconds()))
	}
	a.span.AddEvent(eventAttempt, trace.WithAttributes(attrs...))
}

// Granted ends the acquire as granted with the given fence (0 when the
// lock kind has none, e.g. advisory locks) and starts the held state: pglease.lock.held goes up
// by one. Call it from the loop when it grants, before replying.
func (a *acquisition) Granted(fence pglease.Fence) {
	if a == nil || !a.state.CompareAndSwap(stAcquiring, stHeld) {
		return
	}
	now := time.Now()
	a.granted.Store(int64(now.Sub(a.start)) + 1)
	r := a.r
	r.live.add(a) // for pglease.lock.oldest.age (a waiter added itself in Waiting)
	r.held.Add(context.Background(), 1, r.kindOpt[a.kind].add...)
	a.finish(aoGranted, nil, int64(fence), now)
}

// NotAcquired ends a TryAcquire that found the key held: outcome "locked",
// status unset (it is an answer, not an error).
func (a *acquisition) NotAcquired() {
	if a == nil || !a.state.CompareAndSwap(stAcquiring, stFailed) {
		return
	}
	a.flags.Or(flagContended)
	a.finish(aoLocked, nil, 0, time.Now())
}

// Failed ends the acquire with err: an AcquisitionTimeout, the caller's
// context ending (Aborted), the Manager closing, or a database error. The
// span status is Error with error.type = the pglease Code name; err's text
// is never recorded (it may quote caller data).
func (a *acquisition) Failed(err error) {
	if a == nil || !a.state.CompareAndSwap(stAcquiring, stFailed) {
		return
	}
	if err == nil {
		err = pglease.ErrInternal
	}
	a.finish(acquireOutcomeOf(err), err, 0, time.Now())
}

// FailedSet is Failed for every acquisition of one all-or-nothing set
// (AcquireAll): each span ends failed, but a failure that logs (an error,
// not a timeout) logs one record for the set, the first key's, with
// set.size, instead of one per key.
func (*acquisition) FailedSet(acqs []*obs.Acquisition, err error) {
	first := true
	for _, pub := range acqs {
		a, _ := pub.Impl().(*acquisition)
		if a == nil || !a.state.CompareAndSwap(stAcquiring, stFailed) {
			continue
		}
		if err == nil {
			err = pglease.ErrInternal
		}
		size := 0
		if first {
			size, first = len(acqs), false
		} else {
			size = -1 // logged with the first
		}
		a.finishAll(acquireOutcomeOf(err), err, 0, size, time.Now())
	}
}

func (a *acquisition) finish(o acquireOutcome, err error, fence int64, now time.Time) {
	a.finishAll(o, err, fence, 0, now)
}

// finishAll ends the acquire; setSize > 0 adds set.size to its log
// record, < 0 leaves the record out (FailedSet logs it with the first).
func (a *acquisition) finishAll(o acquireOutcome, err error, fence int64, setSize int, now time.Time) {
	r := a.r
	wait := now.Sub(a.start)
	n := a.attempts.Load()
	f := a.flags.Load()
	ctx := context.Background()
	opt := r.acqOpt[a.kind][o]
	r.acqDuration.Record(ctx, wait.Seconds(), opt.rec...)
	r.acqAttempts.Record(ctx, n, opt.rec...)
	if f&flagContended != 0 {
		r.acqContended.Add(ctx, 1, r.kindOpt[a.kind].add...)
	}
	if f&flagCoalesced != 0 {
		r.acqCoalesced.Add(ctx, 1, r.kindOpt[a.kind].add...)
	}
	if o != aoGranted {
		r.live.remove(a)
	}
	w := a.lastWait()
	if f&flagContended != 0 && !a.try {
		r.waitDuration.Record(ctx, wait.Seconds(), r.waitOpt[a.kind][w.reason].rec...)
	}
	if a.span.IsRecording() {
		attrs := []attribute.KeyValue{
			attrOutcome.String(acquireOutcomeNames[o]),
			attrAttempts.Int64(n),
			attrWait.Float64(wait.Seconds()),
			attrCoalesced.Bool(f&flagCoalesced != 0),
			attrContended.Bool(f&flagContended != 0),
		}
		if o == aoGranted && fence != 0 {
			attrs = append(attrs, attrFence.Int64(fence))
		}
		if w.reason != obs.WaitNone {
			attrs = append(attrs, attrWaitReason.String(w.reason.String()))
		}
		if w.holder != "" {
			attrs = append(attrs, attrHolder.String(w.holder))
		}
		if err != nil {
			et := errorType(err)
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
			a.span.SetStatus(codes.Error, et)
		}
		a.span.SetAttributes(attrs...)
	}
	a.span.End()

	level := slog.LevelDebug
	if o == aoError {
		level = r.errorLevel(err, now)
	}
	if setSize >= 0 && r.logEnabled(ctx, level) {
		lctx := trace.ContextWithSpanContext(ctx, a.sc)
		attrs := []slog.Attr{
			slog.String("outcome", acquireOutcomeNames[o]),
			slog.Int64("attempts", n),
			slog.Float64("wait", wait.Seconds()),
		}
		if err != nil {
			attrs = append(attrs, slog.String("error.type", errorType(err)))
		}
		if o == aoGranted && fence != 0 {
			attrs = append(attrs, slog.Int64("fence", fence))
		}
		if w.reason != obs.WaitNone {
			attrs = append(attrs, slog.String("wait.reason", w.reason.String()))
		}
		if w.holder != "" {
			attrs = append(attrs, slog.String("holder", w.holder))
		}
		if setSize > 0 {
			attrs = append(attrs, slog.Int("set.size", setSize))
		}
		r.logKey(lctx, level, "pglease: acquire", a.key, a.kind, attrs...)
	}
}

func (a *acquisition) heldFor(now time.Time) time.Duration {
	g := a.granted.Load()
	if g == 0 {
		return 0
	}
	return now.Sub(a.start) - time.Duration(g-1)
}

// Extended records a successful automatic extend of this held lock, lag
// being how late it started after it was due (≥ 0). Loop, after the
// extend's result arrives. The round trip itself is the heartbeat's DB
// span.
func (a *acquisition) Extended(lag time.Duration) {
	if a == nil {
		return
	}
	r := a.r
	ctx := context.Background()
	r.extends.Add(ctx, 1, r.extendOpt[a.kind][0].add...)
	if lag < 0 {
		lag = 0
	}
	r.extendLag.Record(ctx, lag.Seconds(), r.kindOpt[a.kind].rec...)
}

// ExtendFailed records an extend whose round trip failed (the lock is not
// lost yet: the trust window decides that, and Lost reports it).
func (a *acquisition) ExtendFailed(err error) {
	if a == nil {
		return
	}
	r := a.r
	ctx := context.Background()
	r.extends.Add(ctx, 1, r.extendOpt[a.kind][1].add...)
	if r.logEnabled(ctx, slog.LevelWarn) {
		r.logKey(trace.ContextWithSpanContext(ctx, a.sc), slog.LevelWarn, "pglease: extend failed",
			a.key, a.kind, slog.String("error.type", errorType(err)))
	}
}

// Lost records that the held lock was lost, with its cause and the span
// that found out (the heartbeat or DB span; may be invalid). It emits a
// pglease.lost span in the acquirer's trace (child of the pglease.acquire
// span) with status Error "LockLost" ("Revoked" for obs.LossRevoked), counts
// pglease.lock.lost{cause},
// lowers pglease.lock.held, and logs a warning. Loop.
func (a *acquisition) Lost(cause obs.LossCause, by trace.SpanContext) {
	if a == nil || !a.state.CompareAndSwap(stHeld, stLost) {
		return
	}
	r := a.r
	cause = cause.Norm()
	now := time.Now()
	held := a.heldFor(now)
	ctx := context.Background()
	r.held.Add(ctx, -1, r.kindOpt[a.kind].add...)
	r.lost.Add(ctx, 1, r.lostOpt[a.kind][cause].add...)
	r.live.remove(a)
	r.holdDone(a, held)

	pctx := trace.ContextWithSpanContext(ctx, a.sc)
	_, span := r.tracer.Start(pctx, spanLost, startInternal...)
	if span.IsRecording() {
		if by.IsValid() {
			span.AddLink(trace.Link{SpanContext: by})
		}
		code := pglease.CodeLockLost
		if cause == obs.LossRevoked {
			code = pglease.CodeRevoked
		}
		attrs := make([]attribute.KeyValue, 0, 6)
		attrs = r.keyAttrs(attrs, a.key)
		attrs = append(attrs,
			attrLockKind.String(a.kind.String()),
			attrLossCause.String(cause.String()),
			attrHeldFor.Float64(held.Seconds()),
			semconv.ErrorTypeKey.String(code.String()))
		span.SetAttributes(attrs...)
		span.SetStatus(codes.Error, code.String())
	}
	span.End()

	if r.logEnabled(ctx, slog.LevelWarn) {
		r.logKey(pctx, slog.LevelWarn, "pglease: lock lost", a.key, a.kind,
			slog.String("cause", cause.String()), slog.Float64("held_for", held.Seconds()))
	}
}

// StartRelease starts the pglease.release span as a child of ctx (the
// releasing caller's trace, or the Manager's drain context on Close),
// linked to the lock's pglease.acquire span.
func (a *acquisition) StartRelease(ctx context.Context) (context.Context, obs.Release) {
	if ctx == nil {
		ctx = context.Background()
	}
	r := a.r
	ctx, span := r.tracer.Start(ctx, spanRelease, startInternal...)
	if span.IsRecording() {
		if a.sc.IsValid() {
			span.AddLink(trace.Link{SpanContext: a.sc})
		}
		attrs := make([]attribute.KeyValue, 0, 3)
		attrs = r.keyAttrs(attrs, a.key)
		attrs = append(attrs, attrLockKind.String(a.kind.String()))
		span.SetAttributes(attrs...)
	}
	return ctx, obs.NewRelease(a, span, time.Now())
}

// Served links the release span to the DB span that carried it.
func (a *acquisition) ReleaseServed(span trace.Span, db trace.SpanContext) {
	if span == nil || !db.IsValid() || !span.IsRecording() {
		return
	}
	span.AddLink(trace.Link{SpanContext: db})
}

// End ends the release: err nil (released), an error with Code LockLost
// (the lock was no longer this holder's: outcome "not_held"), or another
// error. Whatever the outcome, this process no longer counts the lock as
// held (pglease.lock.held goes down once per lock, by End or Lost).
func (a *acquisition) EndRelease(span trace.Span, start time.Time, err error) {
	release{a: a, span: span, start: start}.end(err)
}

// release is one release of a held lock, its pglease.release span begun
// at start (the fields of an obs.Release).
type release struct {
	a     *acquisition
	span  trace.Span
	start time.Time
}

func (rl release) end(err error) {
	a := rl.a
	if a == nil {
		return
	}
	r := a.r
	now := time.Now()
	ctx := context.Background()
	held := a.heldFor(now)
	if a.state.CompareAndSwap(stHeld, stReleased) {
		r.held.Add(ctx, -1, r.kindOpt[a.kind].add...)
		r.live.remove(a)
		r.holdDone(a, held)
	}
	oi, outcome := 0, outcomeOK
	if err != nil {
		if pglease.CodeOf(err) == pglease.CodeLockLost {
			oi, outcome = 1, outcomeNotHeld
		} else {
			oi, outcome = 2, outcomeError
		}
	}
	r.releases.Add(ctx, 1, r.releaseOpt[a.kind][oi].add...)
	if rl.span.IsRecording() {
		attrs := []attribute.KeyValue{attrOutcome.String(outcome)}
		if held > 0 {
			attrs = append(attrs, attrHeldFor.Float64(held.Seconds()))
		}
		if err != nil {
			et := errorType(err)
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
			rl.span.SetStatus(codes.Error, et)
		}
		rl.span.SetAttributes(attrs...)
	}
	rl.span.End()
	if err != nil && r.logEnabled(ctx, slog.LevelWarn) {
		r.logKey(trace.ContextWithSpanContext(ctx, rl.span.SpanContext()), slog.LevelWarn, "pglease: release failed",
			a.key, a.kind, slog.String("outcome", outcome), slog.String("error.type", errorType(err)))
	}
}

// privLogEvery is how often a failed acquire for want of a privilege
// (AuthFailed) logs at Warn: a role without its grants fails every key,
// and one AcquireAll of a hundred keys would otherwise log a hundred
// times. The others log at Debug; every one is in the metrics and spans.
const privLogEvery = time.Minute

// errorLevel returns the level of a failed acquire's log record: Warn,
// except for AuthFailed within privLogEvery of the last one logged at
// Warn.
func (r *recorder) errorLevel(err error, now time.Time) slog.Level {
	if pglease.CodeOf(err) != pglease.CodeAuthFailed {
		return slog.LevelWarn
	}
	last := r.privWarned.Load()
	if last != 0 && now.UnixNano()-last < int64(privLogEvery) || !r.privWarned.CompareAndSwap(last, now.UnixNano()) {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
