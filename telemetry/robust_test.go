package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/obs"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
)

// driveAll calls every method once, in the Manager's order.
func driveAll(r *obs.Recorder) {
	ctx := context.Background()
	k := r.Key("k1")
	actx, a := r.StartAcquire(ctx, k, obs.AcquireInfo{Kind: obs.KindLease, TTL: time.Second})
	_ = actx
	a.Queued(obs.QueueInfo{Coalesced: true})
	a.Waiting(obs.WaitHolder, "other[1]@host")
	a.Waiting(obs.WaitReason(200), "")
	r.ForeignHolder()
	r.ListenerUp(true)
	r.ListenerUp(false)
	obs.FailedSet([]*obs.Acquisition{nil}, nil)
	r.Overload(true, obs.OverloadInfo{RoundTrip: time.Second, Op: obs.OpAcquireMany, Gap: time.Second})
	r.Overload(false, obs.OverloadInfo{RoundTrip: time.Second, Op: obs.OpAcquireMany, Gap: time.Second, Lasted: time.Second})
	_, db := r.StartDB(ctx, obs.OpAcquireMany, 1, a.SpanContext())
	db.End(1, nil)
	a.Attempt(db.SpanContext(), obs.AttemptGranted, 0)
	a.Granted(1)
	_ = a.Key()
	hctx, hb := r.StartHeartbeat(ctx, 1)
	_, edb := r.StartDB(hctx, obs.OpExtendMany, 1, trace.SpanContext{}, a.SpanContext(), trace.SpanContext{})
	edb.End(0, errors.New("x"))
	a.Extended(time.Millisecond)
	a.ExtendFailed(errors.New("x"))
	hb.End(1, 0, nil)
	_ = hb.SpanContext()
	_, rel := a.StartRelease(ctx)
	rel.Served(edb.SpanContext())
	rel.End(nil)
	a.Lost(obs.LossExpired, trace.SpanContext{})
	_, b := r.StartAcquire(ctx, k, obs.AcquireInfo{Try: true})
	b.NotAcquired()
	_, c := r.StartAcquire(ctx, k, obs.AcquireInfo{})
	c.Failed(nil)
	r.ListenerPolling("behind a transaction-mode pooler")
	r.ReleaseTrigger(false, "pglease_release")
	r.ReleaseTrigger(true, "pglease_release")
	r.ConfigWarning("a setting")
	l := r.Loop()
	l.Busy()
	l.SetDepth(obs.QueueMailbox, 3)
	l.Idle()
	r.Close()
}

func TestNilRecorderIsNoop(t *testing.T) {
	t.Parallel()
	var r *obs.Recorder
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, 1)
	if k := r.Key("secret"); k != (obs.KeyID{}) {
		t.Errorf("nil obs.Recorder Key = %#v, want zero", k)
	}
	if got, a := r.StartAcquire(ctx, obs.KeyID{}, obs.AcquireInfo{}); got != ctx || a != nil {
		t.Errorf("nil obs.Recorder StartAcquire changed ctx or returned an obs.Acquisition")
	}
	if got, d := r.StartDB(ctx, obs.OpAcquireMany, 1, trace.SpanContext{}); got != ctx || d != (obs.DBSpan{}) {
		t.Errorf("nil obs.Recorder StartDB changed ctx or returned a span")
	}
	if got, h := r.StartHeartbeat(ctx, 1); got != ctx || h != (obs.Heartbeat{}) {
		t.Errorf("nil obs.Recorder StartHeartbeat changed ctx or returned a span")
	}
	if r.Loop() != nil {
		t.Errorf("nil obs.Recorder Loop is not nil")
	}
	var a *obs.Acquisition
	if got, rel := a.StartRelease(ctx); got != ctx || rel != (obs.Release{}) {
		t.Errorf("nil obs.Acquisition StartRelease changed ctx or returned a span")
	}
	if a.SpanContext().IsValid() || a.Key() != (obs.KeyID{}) {
		t.Errorf("nil obs.Acquisition has a span context or key")
	}
	driveAll(r) // must not panic
	// Zero values of the value types are no-ops too.
	obs.DBSpan{}.End(1, errors.New("x"))
	obs.Heartbeat{}.End(1, 1, nil)
	obs.Release{}.Served(trace.SpanContext{})
	obs.Release{}.End(nil)
	// A nil ctx is tolerated by a live Recorder.
	rec := obs.New(Config{}, obs.Database{})
	//lint:ignore SA1012 a nil ctx is what this checks
	if got, _ := rec.StartAcquire(nil, rec.Key("k"), obs.AcquireInfo{}); got == nil {
		t.Errorf("StartAcquire(nil ctx) returned a nil ctx")
	}
	driveAll(obs.New(Config{TracerProvider: nil, MeterProvider: nil, Logger: nil}, obs.Database{}))
}

var errInstrument = errors.New("instrument creation refused")

type failingMeter struct {
	noop.Meter
	failInstruments bool
}

func (m failingMeter) Int64Counter(n string, o ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	if m.failInstruments {
		return nil, errInstrument
	}
	return m.Meter.Int64Counter(n, o...)
}

func (m failingMeter) Int64UpDownCounter(n string, o ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	if m.failInstruments {
		return nil, errInstrument
	}
	return m.Meter.Int64UpDownCounter(n, o...)
}

func (m failingMeter) Int64Histogram(n string, o ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	if m.failInstruments {
		return nil, errInstrument
	}
	return m.Meter.Int64Histogram(n, o...)
}

func (m failingMeter) Float64Histogram(n string, o ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	if m.failInstruments {
		return nil, errInstrument
	}
	return m.Meter.Float64Histogram(n, o...)
}

func (m failingMeter) Float64ObservableGauge(n string, o ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	if m.failInstruments {
		return nil, errInstrument
	}
	return m.Meter.Float64ObservableGauge(n, o...)
}

func (m failingMeter) Int64ObservableGauge(n string, o ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	if m.failInstruments {
		return nil, errInstrument
	}
	return m.Meter.Int64ObservableGauge(n, o...)
}

func (m failingMeter) RegisterCallback(metric.Callback, ...metric.Observable) (metric.Registration, error) {
	return nil, errInstrument
}

type failingProvider struct {
	noop.MeterProvider
	m failingMeter
}

func (p failingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return p.m }

type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) Handle(err error) {
	if errors.Is(err, errInstrument) {
		h.n.Add(1)
	}
}

// Not parallel: it installs a global otel error handler. Parallel tests
// start only after the sequential ones have finished.
func TestInstrumentErrorsDoNotFail(t *testing.T) {
	prev := otel.GetErrorHandler()
	h := &countingHandler{}
	otel.SetErrorHandler(h)
	t.Cleanup(func() { otel.SetErrorHandler(prev) })

	r := obs.New(Config{MeterProvider: failingProvider{m: failingMeter{failInstruments: true}}}, obs.Database{})
	if r == nil {
		t.Fatal("obs.New returned nil")
	}
	driveAll(r)
	// 15 synchronous instruments + 6 observable gauges; no callback is
	// registered when every gauge failed.
	if got := h.n.Load(); got != 21 {
		t.Errorf("otel.Handle got %d instrument errors, want 21", got)
	}

	h.n.Store(0)
	driveAll(obs.New(Config{MeterProvider: failingProvider{m: failingMeter{}}}, obs.Database{}))
	if got := h.n.Load(); got != 2 { // the loop gauges' callback and the age gauges'
		t.Errorf("otel.Handle got %d errors for refused callbacks, want 2", got)
	}
}

// TestConcurrentEndStates races the loop's Granted against the caller's
// Failed (the late-grant race), and Lost against Release.End, on many
// acquisitions at once: each reaches exactly one end state and
// pglease.lock.held returns to 0.
func TestConcurrentEndStates(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	const n = 200
	var granted, failed atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, a := r.StartAcquire(context.Background(), r.Key("hot"), obs.AcquireInfo{})
			var inner sync.WaitGroup
			inner.Go(func() { a.Attempt(trace.SpanContext{}, obs.AttemptContended, time.Millisecond) })
			inner.Go(func() { a.Granted(pglease.Fence(i)) })
			inner.Go(func() { a.Failed(context.Canceled) })
			inner.Go(func() { r.Loop().Busy(); r.Loop().SetDepth(obs.QueueWaiters, i); r.Loop().Idle() })
			inner.Wait()
			if acqOf(a).state.Load() != stHeld {
				failed.Add(1)
			} else {
				granted.Add(1)
			}
			// Whoever ends it, the lock stops counting once.
			_, rel := a.StartRelease(context.Background())
			inner.Go(func() { rel.End(nil) })
			inner.Go(func() { a.Lost(obs.LossExpired, trace.SpanContext{}) })
			inner.Wait()
		})
	}
	var collectors sync.WaitGroup
	stop := make(chan struct{})
	collectors.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				h.collect()
			}
		}
	})
	wg.Wait()
	close(stop)
	collectors.Wait()

	if granted.Load()+failed.Load() != n {
		t.Fatalf("granted %d + failed %d != %d", granted.Load(), failed.Load(), n)
	}
	rm := h.collect()
	if p := h.point(rm, "pglease.lock.held"); p.value != 0 {
		t.Errorf("lock.held = %v after all released or lost, want 0", p.value)
	}
	if p := h.point(rm, "pglease.acquire.duration"); p.count != n {
		t.Errorf("acquire.duration count = %d, want %d (one outcome each)", p.count, n)
	}
	if p := h.point(rm, "pglease.acquire.duration", attrOutcome.String("granted")); p.count != uint64(granted.Load()) {
		t.Errorf("granted outcomes %d, want %d", p.count, granted.Load())
	}
	if len(h.spansNamed(spanAcquire)) != n {
		t.Errorf("%d acquire spans, want %d", len(h.spansNamed(spanAcquire)), n)
	}
}
