package telemetry

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/pglease/pglease/internal/obs"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// harness is a Recorder wired to in-memory SDK exporters and a JSON log
// buffer.
type harness struct {
	t      testing.TB
	rec    *obs.Recorder
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarness(t testing.TB, opts ...func(*Config)) *harness {
	t.Helper()
	return newHarnessDB(t, obs.Database{}, opts...)
}

// newHarnessDB is newHarness with the database the round trips go to.
func newHarnessDB(t testing.TB, db obs.Database, opts ...func(*Config)) *harness {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := Config{TracerProvider: tp, MeterProvider: mp, Logger: logger}
	for _, o := range opts {
		o(&cfg)
	}
	h := &harness{t: t, rec: obs.New(cfg, db), spans: sr, reader: reader, logs: logs}
	t.Cleanup(func() {
		h.rec.Close()
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return h
}

func (h *harness) ended() []sdktrace.ReadOnlySpan { return h.spans.Ended() }

func (h *harness) spansNamed(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range h.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func (h *harness) oneSpan(name string) sdktrace.ReadOnlySpan {
	h.t.Helper()
	s := h.spansNamed(name)
	if len(s) != 1 {
		h.t.Fatalf("want 1 span %q, got %d", name, len(s))
	}
	return s[0]
}

func (h *harness) collect() metricdata.ResourceMetrics {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatalf("collect: %v", err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// point sums, over the data points of metric name whose attributes
// include want: the value (counters, gauges) or, for histograms, the
// count and the sum. found is false when no point matched.
type point struct {
	value float64
	count uint64
	sum   float64
	found bool
}

func (h *harness) point(rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) point {
	h.t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		return point{}
	}
	var p point
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, want) {
				p.value += float64(dp.Value)
				p.found = true
			}
		}
	case metricdata.Sum[float64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, want) {
				p.value += dp.Value
				p.found = true
			}
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, want) {
				p.value += float64(dp.Value)
				p.found = true
			}
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, want) {
				p.value += dp.Value
				p.found = true
			}
		}
	case metricdata.Histogram[int64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, want) {
				p.count += dp.Count
				p.sum += float64(dp.Sum)
				p.found = true
			}
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, want) {
				p.count += dp.Count
				p.sum += dp.Sum
				p.found = true
			}
		}
	default:
		h.t.Fatalf("metric %s: unexpected data %T", name, m.Data)
	}
	return p
}

func attrOf(attrs []attribute.KeyValue, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range attrs {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func wantAttr(t testing.TB, what string, attrs []attribute.KeyValue, want attribute.KeyValue) {
	t.Helper()
	v, ok := attrOf(attrs, want.Key)
	if !ok {
		t.Errorf("%s: attribute %s missing", what, want.Key)
		return
	}
	if v != want.Value {
		t.Errorf("%s: %s = %v, want %v", what, want.Key, v.String(), want.Value.String())
	}
}

func hasLink(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.Equal(sc) {
			return true
		}
	}
	return false
}

// recOf, acqOf and loopOf return the recorder's own types behind the
// handles obs.New and its methods return.
func recOf(r *obs.Recorder) *recorder       { return r.Impl().(*recorder) }
func acqOf(a *obs.Acquisition) *acquisition { return a.Impl().(*acquisition) }
func loopOf(l *obs.Loop) *loop              { return l.Impl().(*loop) }

// attrSets returns the attribute sets of m's data points; false for a
// kind of data the recorder does not make.
func attrSets(m metricdata.Metrics) ([]attribute.Set, bool) {
	var sets []attribute.Set
	add := func(a attribute.Set) { sets = append(sets, a) }
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	default:
		return nil, false
	}
	return sets, true
}
