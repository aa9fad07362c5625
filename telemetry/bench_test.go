package telemetry

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/obs"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// acquireCycle is everything the Manager records for one uncontended
// acquire and its release: key hash, acquire span, queue event, DB span,
// attempt, grant, release span, release DB span.
func acquireCycle(r *obs.Recorder, ctx context.Context, key string) {
	_, a := r.StartAcquire(ctx, r.Key(key), obs.AcquireInfo{Kind: obs.KindLease, TTL: 30 * time.Second})
	a.Queued(obs.QueueInfo{})
	_, db := r.StartDB(ctx, obs.OpAcquireMany, 1, a.SpanContext())
	db.End(1, nil)
	a.Attempt(db.SpanContext(), obs.AttemptGranted, 0)
	a.Granted(1)
	_, rel := a.StartRelease(ctx)
	_, rdb := r.StartDB(ctx, obs.OpReleaseMany, 1, trace.SpanContext{})
	rdb.End(1, nil)
	rel.Served(rdb.SpanContext())
	rel.End(nil)
}

// BenchmarkAcquireCycle: cost per acquire+release recorded, by provider.
// "global-noop" is New(Config{}, Database{}) with no options and no global provider
// installed: what a user who never configures OpenTelemetry pays.
func BenchmarkAcquireCycle(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, r *obs.Recorder) {
		b.ReportAllocs()
		for b.Loop() {
			acquireCycle(r, ctx, "payment:123")
		}
	}
	b.Run("nil", func(b *testing.B) { run(b, nil) })
	b.Run("global-noop", func(b *testing.B) { run(b, obs.New(Config{}, obs.Database{})) })
	b.Run("explicit-noop", func(b *testing.B) {
		run(b, obs.New(Config{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()}, obs.Database{}))
	})
	b.Run("sdk-recording", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider() // samples everything, exports nowhere
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) })
		run(b, obs.New(Config{TracerProvider: tp, MeterProvider: mp}, obs.Database{}))
	})
}

func BenchmarkKey(b *testing.B) {
	b.Run("hashKey", func(b *testing.B) {
		r := obs.New(Config{}, obs.Database{})
		b.ReportAllocs()
		for b.Loop() {
			r.Key("payment:1234567890")
		}
	})
	b.Run("hmac", func(b *testing.B) {
		r := obs.New(Config{KeySecret: []byte("0123456789abcdef0123456789abcdef")}, obs.Database{})
		b.ReportAllocs()
		for b.Loop() {
			r.Key("payment:1234567890")
		}
	})
}

func BenchmarkLoopTurn(b *testing.B) {
	l := obs.New(Config{}, obs.Database{}).Loop()
	b.ReportAllocs()
	for b.Loop() {
		l.Busy()
		l.SetDepth(obs.QueueWaiters, 3)
		l.Idle()
	}
}
