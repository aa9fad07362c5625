// Command trace is what `make trace` runs: one contended key's story,
// traced with OpenTelemetry. Another process ("billing-b") holds
// "payment:123"; two workers of this process ask for it, one after the
// other; billing-b releases, the lock passes to worker 1 and then, when
// worker 1 releases, to worker 2.
//
// The Manager of this process is built with an SDK tracer provider and an
// SDK meter provider (read by the Prometheus exporter), both with the
// resource service.name=billing-a. The program prints:
//
//  1. the story as it happens, in words;
//  2. a compact trace summary: every trace as a span tree with durations,
//     the attributes pglease sets, the events of the acquire spans, and
//     the links from operation spans to the round trips that served them;
//  3. the metrics in Prometheus text exposition format.
//
// With -spans FILE it also writes the raw spans, as the stdouttrace
// exporter exports them (one JSON object each), to FILE.
//
// Keys appear only as pglease.key.hash (SyncGuard's hashKey here, since no
// key secret is set); lockIds never appear.
//
//	make trace                                  # throwaway PostgreSQL
//	make trace TRACEFLAGS="-spans spans.json"
//	DATABASE_URL=postgres://… go run ./trace [-spans FILE]
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/exampledb"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/retry"
	"github.com/pglease/pglease/telemetry"
)

// Key is the contended key of the story.
const Key = "payment:123"

func main() {
	spansFile := flag.String("spans", "", "also write the raw spans (stdouttrace JSON) to this file")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A schema of its own, dropped at the end: nothing is left in your database.
	err := exampledb.Run(ctx, os.Getenv("DATABASE_URL"), "pglease_trace", func(url string) error {
		return run(ctx, os.Stdout, url, *spansFile)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "trace:", err)
		os.Exit(1)
	}
}

// run tells the story against the database at url and writes the story,
// the trace summary and the metrics to w; the raw spans go to spansFile
// unless it is "".
func run(ctx context.Context, w io.Writer, url, spansFile string) (err error) {
	if url == "" {
		return errors.New("DATABASE_URL is not set (make trace starts a throwaway PostgreSQL)")
	}
	// One resource for traces and metrics.
	res := resource.NewSchemaless(semconv.ServiceName("billing-a"))

	// Tracing: a span recorder for the summary and, with -spans,
	// stdouttrace for the raw export. Both synchronous, so every ended
	// span is there at the end.
	spans := tracetest.NewSpanRecorder()
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(spans), sdktrace.WithResource(res)}
	if spansFile != "" {
		f, err := os.Create(spansFile)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, f.Close()) }()
		exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
		if err != nil {
			return err
		}
		tpOpts = append(tpOpts, sdktrace.WithSyncer(exp))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)
	defer func() { err = errors.Join(err, tp.Shutdown(context.Background())) }()

	// Metrics: the Prometheus exporter is a reader of the meter provider,
	// registered with its own registry.
	registry := prometheus.NewRegistry()
	pexp, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(pexp), sdkmetric.WithResource(res))
	defer func() { err = errors.Join(err, mp.Shutdown(context.Background())) }()

	// billing-b: another process, as far as locking goes (own Manager and
	// pool); not traced here.
	other, err := manager.Open(ctx, url, manager.Config{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, other.Close(context.Background())) }()
	if err := other.SetupSchema(ctx); err != nil {
		return err
	}
	// billing-a: this process, traced.
	cfg := manager.Config{Retry: retry.Policy{Base: 50 * time.Millisecond, MaxDelay: 400 * time.Millisecond}}
	// readme:begin telemetry
	// tp and mp are an SDK TracerProvider and MeterProvider. Without them the
	// Manager uses the otel globals, which record nothing until SDK
	// providers are installed.
	cfg.Telemetry = telemetry.Config{
		TracerProvider: tp,
		MeterProvider:  mp,
		// Optional: Logger: slogLogger, and
		// KeySecret: secret for keyed (HMAC-SHA-256) key hashes.
	}
	m, err := manager.Open(ctx, url, cfg)
	if err != nil {
		return err
	}
	// readme:end telemetry
	defer func() { err = errors.Join(err, m.Close(context.Background())) }()

	fmt.Fprintf(w, "== The story (the key is shown by its hash, %s…) ==\n", pglease.HashKey(Key)[:8])
	st := &storyteller{w: w, start: time.Now()}
	if err := story(ctx, st, tp.Tracer("billing-a"), m, other); err != nil {
		return err
	}

	// Metrics are gathered before Close, while the loop's gauges are
	// still registered.
	var metrics bytes.Buffer
	mfs, err := registry.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&metrics, mf); err != nil {
			return err
		}
	}

	ended := spans.Ended()
	fmt.Fprintf(w, "\n== Trace summary: the same story as spans (service.name=billing-a) ==\n")
	fmt.Fprintf(w, "   durations in ms; #n numbers spans for links; every database span also carries%s\n\n", serverAttrs(ended))
	summarize(w, ended)
	fmt.Fprintf(w, "\n== Metrics (Prometheus text format) ==\n")
	if _, err := w.Write(metrics.Bytes()); err != nil {
		return err
	}
	if spansFile != "" {
		fmt.Fprintf(w, "\nRaw spans (stdouttrace JSON): %s\n", spansFile)
	} else {
		fmt.Fprintf(w, "\nRaw spans: run with -spans FILE (make trace TRACEFLAGS=\"-spans spans.json\") to write them as stdouttrace exports them.\n")
	}
	return nil
}

// storyteller prints the story's steps with their time since the start.
type storyteller struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (s *storyteller) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, "%6.0f ms  %s\n", float64(time.Since(s.start).Microseconds())/1000, fmt.Sprintf(format, args...))
}

// story: billing-b holds Key; worker 1, then worker 2 wait for it; billing-b
// releases after a while; worker 1 gets it, works, releases; worker 2 gets
// it (local handoff), releases.
func story(ctx context.Context, st *storyteller, tracer trace.Tracer, m, other *manager.Manager) error {
	held, err := other.Acquire(ctx, Key)
	if err != nil {
		return err
	}
	st.say("billing-b (another process) holds the key, fence %d", held.Fence())
	type done struct {
		n   int
		err error
	}
	results := make(chan done, 2)
	worker := func(n int) {
		wctx, span := tracer.Start(ctx, fmt.Sprintf("worker %d: charge payment", n))
		defer span.End()
		st.say("worker %d asks for the key: contended, it waits (backoff, and a NOTIFY wakes it)", n)
		start := time.Now()
		lk, err := m.Acquire(wctx, Key, manager.WithAcquireTimeout(10*time.Second))
		if err != nil {
			results <- done{n, err}
			return
		}
		st.say("worker %d gets the key after %d ms, fence %d; works 50 ms", n, time.Since(start).Milliseconds(), lk.Fence())
		time.Sleep(50 * time.Millisecond) // the protected work
		err = lk.Release(wctx)
		st.say("worker %d releases the key", n)
		results <- done{n, err}
	}
	go worker(1)
	time.Sleep(20 * time.Millisecond) // pacing the story: worker 2 asks a little later
	go worker(2)
	time.Sleep(250 * time.Millisecond) // billing-b works a while, then releases
	if err := held.Release(ctx); err != nil {
		return err
	}
	st.say("billing-b releases the key: its NOTIFY wakes this process")
	var errs []error
	for range 2 {
		d := <-results
		if d.err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", d.n, d.err))
		}
	}
	return errors.Join(errs...)
}

// serverAttrs returns " server.address=… server.port=… db.namespace=…" as
// the first client span carries them.
func serverAttrs(spans []sdktrace.ReadOnlySpan) string {
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindClient {
			continue
		}
		var b strings.Builder
		for _, kv := range s.Attributes() {
			if hiddenAttr[string(kv.Key)] && kv.Key != semconv.DBOperationNameKey {
				fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.String())
			}
		}
		return b.String()
	}
	return " (no database span)"
}

// hiddenAttr are the attributes the summary leaves out of each span: the
// same on every database span (printed once) or said by the span name.
var hiddenAttr = map[string]bool{
	string(semconv.DBSystemNameKey):    true,
	string(semconv.DBOperationNameKey): true,
	string(semconv.ServerAddressKey):   true,
	string(semconv.ServerPortKey):      true,
	string(semconv.DBNamespaceKey):     true,
}

// summarize prints every trace as a tree of spans, in start order.
func summarize(w io.Writer, spans []sdktrace.ReadOnlySpan) {
	slices.SortStableFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	num := map[trace.SpanID]int{}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for i, s := range spans {
		num[s.SpanContext().SpanID()] = i + 1
		byID[s.SpanContext().SpanID()] = s
	}
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if _, ok := byID[s.Parent().SpanID()]; ok && s.Parent().IsValid() {
			children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	var print func(s sdktrace.ReadOnlySpan, depth int)
	print = func(s sdktrace.ReadOnlySpan, depth int) {
		ind := strings.Repeat("  ", depth)
		fmt.Fprintf(w, "%s#%d %s [%s] %s%s\n", ind, num[s.SpanContext().SpanID()], s.Name(), s.SpanKind(),
			ms(s.EndTime().Sub(s.StartTime())), attrs(s.Attributes()))
		if st := s.Status(); st.Code != 0 && st.Description != "" {
			fmt.Fprintf(w, "%s   status %s %s\n", ind, st.Code, st.Description)
		}
		for _, e := range s.Events() {
			fmt.Fprintf(w, "%s   @%s event %s%s\n", ind, ms(e.Time.Sub(s.StartTime())), e.Name, attrs(e.Attributes))
		}
		if len(s.Links()) > 0 {
			var ls []string
			for _, l := range s.Links() {
				if n, ok := num[l.SpanContext.SpanID()]; ok {
					ls = append(ls, fmt.Sprintf("#%d %s", n, byID[l.SpanContext.SpanID()].Name()))
				} else {
					ls = append(ls, "(not recorded)")
				}
			}
			fmt.Fprintf(w, "%s   links → %s\n", ind, strings.Join(ls, ", "))
		}
		for _, c := range children[s.SpanContext().SpanID()] {
			print(c, depth+1)
		}
	}
	for _, r := range roots {
		fmt.Fprintf(w, "trace %s…\n", r.SpanContext().TraceID().String()[:8])
		print(r, 1)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// attrs prints attributes compactly: the "pglease." prefix dropped, key
// hashes shortened, durations in seconds kept as they are.
func attrs(kvs []attribute.KeyValue) string {
	var b strings.Builder
	for _, kv := range kvs {
		k := string(kv.Key)
		if hiddenAttr[k] {
			continue
		}
		v := kv.Value.String()
		if k == "pglease.key.hash" { // see the table in package telemetry
			v = v[:min(len(v), 8)] + "…"
		}
		if kv.Value.Type() == attribute.FLOAT64 {
			v = fmt.Sprintf("%.3g", kv.Value.AsFloat64())
		}
		fmt.Fprintf(&b, " %s=%s", cmp.Or(strings.TrimPrefix(k, "pglease."), k), v)
	}
	return b.String()
}
