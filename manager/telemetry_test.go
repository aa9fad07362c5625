package manager

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/retry"
	"github.com/pglease/pglease/telemetry"
)

// rig is an SDK tracer provider with an in-memory span recorder, a meter
// provider with a manual reader, and a JSON slog handler writing to a
// buffer: everything a Manager built with rig.opts records.
type rig struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	logs   *syncBuffer
	opts   telemetry.Config
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

// newRig must be called before setup, so that its providers shut down
// after the Manager closed.
func newRig(t *testing.T, extra ...func(*telemetry.Config)) *rig {
	t.Helper()
	r := &rig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader(), logs: &syncBuffer{}}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	logger := slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.opts = telemetry.Config{TracerProvider: r.tp, MeterProvider: mp, Logger: logger}
	for _, f := range extra {
		f(&r.opts)
	}
	t.Cleanup(func() {
		_ = r.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return r
}

func (r *rig) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// has reports whether set contains every key=value of want.
func has(set attribute.Set, want ...attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sumOf adds the data points of an int64 sum (counter, updowncounter)
// whose attributes contain want.
func sumOf(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is %T, not an int64 sum", m.Name, m.Data)
	}
	var n int64
	for _, dp := range s.DataPoints {
		if has(dp.Attributes, want...) {
			n += dp.Value
		}
	}
	return n
}

// countOf adds the counts of a histogram's data points whose attributes
// contain want.
func countOf(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) uint64 {
	t.Helper()
	var n uint64
	switch h := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range h.DataPoints {
			if has(dp.Attributes, want...) {
				n += dp.Count
			}
		}
	case metricdata.Histogram[int64]:
		for _, dp := range h.DataPoints {
			if has(dp.Attributes, want...) {
				n += dp.Count
			}
		}
	default:
		t.Fatalf("%s is %T, not a histogram", m.Name, m.Data)
	}
	return n
}

func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	got := named(spans, name)
	if len(got) != 1 {
		t.Fatalf("%d %s spans, want 1", len(got), name)
	}
	return got[0]
}

func attrOf(kvs []attribute.KeyValue, key attribute.Key) attribute.Value {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// wantAttrs fails unless s has every key=value of want.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, kv := range want {
		if got := attrOf(s.Attributes(), kv.Key); got != kv.Value {
			t.Errorf("%s: %s = %q, want %q", s.Name(), kv.Key, got.String(), kv.Value.String())
		}
	}
}

func linksTo(s sdktrace.ReadOnlySpan, target trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.SpanID() == target.SpanID() && l.SpanContext.TraceID() == target.TraceID() {
			return true
		}
	}
	return false
}

func childOf(s sdktrace.ReadOnlySpan, parent trace.SpanContext) bool {
	return s.Parent().SpanID() == parent.SpanID() && s.SpanContext().TraceID() == parent.TraceID()
}

func events(s sdktrace.ReadOnlySpan, name string) []sdktrace.Event {
	var out []sdktrace.Event
	for _, e := range s.Events() {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

var (
	kindLease   = attrLockKind.String("lease")
	dbPostgres  = attribute.String("db.system.name", "postgresql")
	outcomeOK   = attrOutcome.String("ok")
	outcomeGrnt = attrOutcome.String("granted")
)

// TestTelemetryUncontended: one acquire and its release, under a caller's
// span, give the acquire span (child of the caller's span, linked to its
// round trip, which is its child), the release span (linked to the acquire
// span and its own round trip), and the matching metrics.
func TestTelemetryUncontended(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	wait(t, &b.sig.Listening)
	ctx, root := rg.tp.Tracer("test").Start(ctxT(t), "test.root")
	lk, err := b.m.Acquire(ctx, "solo", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.lock.held"], kindLease); n != 1 {
		t.Errorf("pglease.lock.held while held = %d, want 1", n)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	root.End()

	spans := rg.spans.Ended()
	acq := one(t, spans, spanAcquire)
	if !childOf(acq, root.SpanContext()) {
		t.Error("pglease.acquire is not a child of the caller's span")
	}
	wantAttrs(t, acq,
		attrKeyHash.String(pglease.HashKey("solo")), kindLease,
		attrTTL.Float64(10), attrTry.Bool(false), outcomeGrnt,
		attrAttempts.Int64(1), attrContended.Bool(false), attrCoalesced.Bool(false),
		attrFence.Int64(int64(lk.Fence())))
	if acq.Status().Code != codes.Unset {
		t.Errorf("acquire status = %v", acq.Status())
	}
	if q := events(acq, eventQueued); len(q) != 1 || attrOf(q[0].Attributes, attrQueuePosition).AsInt64() != 0 {
		t.Errorf("queued events = %v", q)
	}
	if a := events(acq, eventAttempt); len(a) != 1 || attrOf(a[0].Attributes, attrOutcome).AsString() != "granted" {
		t.Errorf("attempt events = %v", a)
	}
	adb := one(t, spans, spanAcquireMany)
	if adb.SpanKind() != trace.SpanKindClient || !childOf(adb, acq.SpanContext()) || !linksTo(acq, adb.SpanContext()) {
		t.Errorf("acquire_many: kind %v, child of acquire %v, linked %v", adb.SpanKind(),
			childOf(adb, acq.SpanContext()), linksTo(acq, adb.SpanContext()))
	}
	wantAttrs(t, adb, dbPostgres, attribute.String("db.operation.name", "pglease.acquire_many"),
		attrBatchSize.Int(1), attrBatchOK.Int(1), outcomeOK)

	rel := one(t, spans, spanRelease)
	rdb := one(t, spans, spanReleaseMany)
	if !childOf(rel, root.SpanContext()) || !linksTo(rel, acq.SpanContext()) || !linksTo(rel, rdb.SpanContext()) {
		t.Error("pglease.release: not a child of the caller's span, or not linked to the acquire and its round trip")
	}
	if !childOf(rdb, rel.SpanContext()) || rdb.SpanKind() != trace.SpanKindClient {
		t.Error("release_many is not a client child of pglease.release")
	}
	wantAttrs(t, rel, outcomeOK, kindLease, attrKeyHash.String(pglease.HashKey("solo")))
	wantAttrs(t, rdb, attrBatchSize.Int(1), attrBatchOK.Int(1))
	if held := attrOf(rel.Attributes(), attrHeldFor).AsFloat64(); held <= 0 {
		t.Errorf("held_for = %v", held)
	}
	if l := named(spans, spanListen); len(l) == 0 || attrOf(l[0].Attributes(), attrOutcome).AsString() != "ok" {
		t.Error("no successful pglease.listen span")
	}
	if n := len(named(spans, spanLost)); n != 0 {
		t.Errorf("%d pglease.lost spans", n)
	}

	ms = rg.metrics(t)
	if n := countOf(t, ms["pglease.acquire.duration"], kindLease, outcomeGrnt); n != 1 {
		t.Errorf("acquire.duration{granted} count = %d", n)
	}
	if n := countOf(t, ms["pglease.acquire.attempts"], kindLease, outcomeGrnt); n != 1 {
		t.Errorf("acquire.attempts{granted} count = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.held"], kindLease); n != 0 {
		t.Errorf("pglease.lock.held after release = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.releases"], kindLease, outcomeOK); n != 1 {
		t.Errorf("lock.releases{ok} = %d", n)
	}
	for _, op := range []string{"pglease.acquire_many", "pglease.release_many"} {
		if n := countOf(t, ms["db.client.operation.duration"], dbPostgres, attribute.String("db.operation.name", op)); n != 1 {
			t.Errorf("db.client.operation.duration{%s} count = %d", op, n)
		}
		if n := countOf(t, ms["pglease.db.batch.size"], attribute.String("db.operation.name", op)); n != 1 {
			t.Errorf("pglease.db.batch.size{%s} count = %d", op, n)
		}
	}
	g, ok := ms["pglease.manager.loop.busy"].Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value < 0 || g.DataPoints[0].Value > 1 {
		t.Errorf("loop.busy = %+v", ms["pglease.manager.loop.busy"].Data)
	}
	if d, ok := ms["pglease.manager.queue.depth"].Data.(metricdata.Gauge[int64]); !ok || len(d.DataPoints) != 4 {
		t.Errorf("queue.depth = %+v", ms["pglease.manager.queue.depth"].Data)
	}
}

// TestTelemetryContended: another process holds the key while two callers
// of this Manager wait for it. The first caller's span shows contended
// attempts and its grant; the second shows it coalesced behind the first
// and waited for the local handoff; a round trip serving both is a child
// of the head waiter's acquire span, linked to and from the other's.
func TestTelemetryContended(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts,
		Retry: retry.Policy{Base: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond}}})
	peer, _ := b.newPeer(t, Config{DisableNotify: true})
	ctx := ctxT(t)
	holder, err := peer.Acquire(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lk  *Lock
		err error
	}
	acquire := func() chan result {
		ch := make(chan result, 1)
		go func() {
			lk, err := b.m.Acquire(ctx, "hot", WithAcquireTimeout(waitTimeout()))
			ch <- result{lk, err}
		}()
		waitFor(t, &b.sig.Queued, func(k string) bool { return k == "hot" })
		return ch
	}
	first := acquire()
	second := acquire()
	// Both wait now. One attempt per key is in flight at a time, so of the
	// acquire batches sent from now on, the second was flushed after the
	// first came back, with both callers queued: a root round trip serving
	// both. The third is sent only after the second came back, and as the
	// holder still holds the key, the second answered "locked". (Waiting
	// for two sends only, the second could still be in flight when the
	// holder releases, and be granted: no contended root round trip.)
	drain(&b.sig.BatchSent)
	sent := 0
	waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool {
		if bi.Kind == kernel.KindAcquire {
			sent++
		}
		return sent >= 3
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r1 := <-first
	if r1.err != nil {
		t.Fatal(r1.err)
	}
	if err := r1.lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r2 := <-second
	if r2.err != nil {
		t.Fatal(r2.err)
	}
	if err := r2.lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	spans := rg.spans.Ended()
	acqs := named(spans, spanAcquire)
	if len(acqs) != 2 {
		t.Fatalf("%d acquire spans", len(acqs))
	}
	a1, a2 := acqs[0], acqs[1]
	if attrOf(a1.Attributes(), attrFence).AsInt64() > attrOf(a2.Attributes(), attrFence).AsInt64() {
		a1, a2 = a2, a1
	}
	wantAttrs(t, a1, outcomeGrnt, attrContended.Bool(true), attrCoalesced.Bool(false),
		attrFence.Int64(int64(r1.lk.Fence())))
	wantAttrs(t, a2, outcomeGrnt, attrContended.Bool(true), attrCoalesced.Bool(true),
		attrFence.Int64(int64(r2.lk.Fence())))
	for i, a := range []sdktrace.ReadOnlySpan{a1, a2} {
		attempts := events(a, eventAttempt)
		n := attrOf(a.Attributes(), attrAttempts).AsInt64()
		if n < 2 || int(n) != len(attempts) {
			t.Errorf("caller %d: attempts attribute %d, %d attempt events", i+1, n, len(attempts))
		}
		contended := 0
		for _, e := range attempts {
			if attrOf(e.Attributes, attrOutcome).AsString() == "contended" {
				contended++
			}
		}
		last := attempts[len(attempts)-1]
		if contended == 0 || attrOf(last.Attributes, attrOutcome).AsString() != "granted" {
			t.Errorf("caller %d: %d contended attempts, last %v", i+1, contended, last.Attributes)
		}
		if len(a.Links()) == 0 {
			t.Errorf("caller %d: no links to round trips", i+1)
		}
	}
	if q := events(a2, eventQueued); len(q) != 1 || !attrOf(q[0].Attributes, attrCoalesced).AsBool() ||
		attrOf(q[0].Attributes, attrQueuePosition).AsInt64() != 1 {
		t.Errorf("second caller's queued event = %v", q)
	}
	// The first batch sent after both queued served both and answered
	// "locked": it was made for the head waiter (a child of the first
	// caller's acquire span) and links, from its start, to the second
	// caller's, which links to it too.
	shared := 0
	for _, db := range named(spans, spanAcquireMany) {
		if linksTo(a1, db.SpanContext()) && linksTo(a2, db.SpanContext()) &&
			childOf(db, a1.SpanContext()) && linksTo(db, a2.SpanContext()) &&
			attrOf(db.Attributes(), attrBatchOK).AsInt64() == 0 {
			shared++
		}
	}
	if shared == 0 {
		t.Error("no contended round trip under the first caller's acquire span linked to and from the second's")
	}
	// The first caller's release handed the key to the second in one round
	// trip (pglease.handoff): a child of the second caller's acquire span
	// (it grants it), linked to the first caller's release span.
	handoff := false
	for _, db := range named(spans, spanHandOff) {
		for _, rel := range named(spans, spanRelease) {
			handoff = handoff || (childOf(db, a2.SpanContext()) && linksTo(a2, db.SpanContext()) && linksTo(db, rel.SpanContext()))
		}
	}
	if !handoff {
		t.Error("the second caller's grant is not a handoff round trip under its acquire span, linked to the releaser's release span")
	}
	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.acquire.contended"], kindLease); n != 2 {
		t.Errorf("acquire.contended = %d, want 2", n)
	}
	if n := sumOf(t, ms["pglease.acquire.coalesced"], kindLease); n != 1 {
		t.Errorf("acquire.coalesced = %d, want 1", n)
	}
	// Both were served before the last release: the loop's waiter count
	// went back to zero (reported on every loop iteration since).
	d := ms["pglease.manager.queue.depth"].Data.(metricdata.Gauge[int64])
	for _, dp := range d.DataPoints {
		if has(dp.Attributes, attrQueue.String("waiters")) && dp.Value != 0 {
			t.Errorf("queue.depth{waiters} = %d after both were served", dp.Value)
		}
	}
}

// TestTelemetryHeartbeat: a short-TTL lock's extends appear as
// pglease.heartbeat spans, each the parent of its extend_many round trip,
// and as extend metrics.
func TestTelemetryHeartbeat(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := ctxT(t)
	// Not the 300 ms floor: under CPU load (-race, burners) an extend 100 ms
	// into a 300 ms lease can miss its 270 ms trust window, and the lock is
	// then (correctly) lost. 1.5 s: first extend after 500 ms, 850 ms of slack.
	lk, err := b.m.Acquire(ctx, "beat", WithTTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, &b.sig.Extended, func(n int) bool { return n >= 1 })
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rg.spans.Ended()
	var hb sdktrace.ReadOnlySpan
	for _, s := range named(spans, spanHeartbeat) {
		if attrOf(s.Attributes(), attrExtended).AsInt64() >= 1 {
			hb = s
			break
		}
	}
	if hb == nil {
		t.Fatal("no pglease.heartbeat span that extended a lock")
	}
	wantAttrs(t, hb, attrDue.Int(1), attrLost.Int(0), outcomeOK)
	found := false
	for _, db := range named(spans, spanExtendMany) {
		if childOf(db, hb.SpanContext()) {
			found = true
			wantAttrs(t, db, dbPostgres, attrBatchSize.Int(1), attrBatchOK.Int(1))
		}
	}
	if !found {
		t.Error("no extend_many span under the heartbeat span")
	}
	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.lock.extends"], kindLease, outcomeOK); n < 1 {
		t.Errorf("lock.extends{ok} = %d", n)
	}
	if n := countOf(t, ms["pglease.lock.extend.lag"], kindLease); n < 1 {
		t.Errorf("lock.extend.lag count = %d", n)
	}
}

// TestTelemetryLoss: a lock whose row is deleted behind the Manager's
// back is lost at the next extend: a pglease.lost span in the acquirer's
// trace, linked to the round trip that found it, and the lost metric.
func TestTelemetryLoss(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "vanish", WithTTL(900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, "DELETE FROM syncguard_locks WHERE key = 'vanish'"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &b.sig.Lost, func(k string) bool { return k == "vanish" })
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Release = %v", err)
	}
	spans := rg.spans.Ended()
	acq := one(t, spans, spanAcquire)
	lost := one(t, spans, spanLost)
	if !childOf(lost, acq.SpanContext()) {
		t.Error("pglease.lost is not a child of the lock's acquire span")
	}
	wantAttrs(t, lost, attrKeyHash.String(pglease.HashKey("vanish")), kindLease,
		attrLossCause.String("not_held"), attribute.String("error.type", "LockLost"))
	if st := lost.Status(); st.Code != codes.Error || st.Description != "LockLost" {
		t.Errorf("lost status = %+v", st)
	}
	var by sdktrace.ReadOnlySpan
	for _, db := range named(spans, spanExtendMany) {
		if linksTo(lost, db.SpanContext()) {
			by = db
		}
	}
	if by == nil {
		t.Fatal("pglease.lost is not linked to an extend round trip")
	}
	wantAttrs(t, by, attrBatchOK.Int(0))
	hbFound := false
	for _, hb := range named(spans, spanHeartbeat) {
		if by.Parent().SpanID() == hb.SpanContext().SpanID() {
			hbFound = true
			wantAttrs(t, hb, attrLost.Int(1), attrExtended.Int(0))
		}
	}
	if !hbFound {
		t.Error("the extend that found the loss has no heartbeat parent")
	}
	if n := len(named(spans, spanRelease)); n != 0 {
		t.Errorf("%d release spans for a lock that was lost", n)
	}
	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.lock.lost"], kindLease, attrLossCause.String("not_held")); n != 1 {
		t.Errorf("lock.lost{not_held} = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.held"], kindLease); n != 0 {
		t.Errorf("lock.held = %d", n)
	}
	if !strings.Contains(rg.logs.String(), `"msg":"pglease: lock lost"`) {
		t.Error("no log record for the loss")
	}
}

// TestTelemetryNoRawKeysOrLockIDs drives many keys through grants,
// batches, contention, TryAcquire refusals, timeouts, heartbeats, a loss
// and releases, with a key secret, then scans every span (name,
// attributes, events, status, links), every metric attribute and every
// log record for the raw keys and lockIds used: none may appear. Key
// hashes are the HMAC of the key.
func TestTelemetryNoRawKeysOrLockIDs(t *testing.T) {
	t.Parallel()
	secret := []byte("a test secret of at least 32 bytes!!")
	rg := newRig(t, func(c *telemetry.Config) { c.KeySecret = secret })
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts,
		Retry: retry.Policy{Base: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond}}})
	peer, _ := b.newPeer(t, Config{})
	ctx := ctxT(t)

	const n = 40
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer:zoë.%02d@example.com", i)
	}
	var lockIDs []string
	// keys[0:4] are held by the other process.
	var peerLocks []*Lock
	for _, k := range keys[:4] {
		lk, err := peer.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		peerLocks = append(peerLocks, lk)
		lockIDs = append(lockIDs, lk.hd.ID)
	}
	for _, k := range keys[:2] { // contended until the wait ends
		if _, err := b.m.Acquire(ctx, k, WithAcquireTimeout(60*time.Millisecond)); !errors.Is(err, pglease.ErrAcquisitionTimeout) {
			t.Fatalf("Acquire of a held key = %v", err)
		}
	}
	for _, k := range keys[2:4] { // TryAcquire: locked elsewhere
		if _, ok, err := b.m.TryAcquire(ctx, k); ok || err != nil {
			t.Fatalf("TryAcquire of a held key = %v, %v", ok, err)
		}
	}
	// keys[4:] are taken here, concurrently (batched), with a TTL short
	// enough for an extend within the test (after 500 ms) and long enough
	// that a starved extend does not lose them (850 ms of slack: the 300 ms
	// floor lost one under CPU load).
	locks := make([]*Lock, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 4; i < n; i++ {
		wg.Go(func() {
			lk, err := b.m.Acquire(ctx, keys[i], WithTTL(1500*time.Millisecond))
			if err != nil {
				errs <- err
				return
			}
			locks[i] = lk
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, lk := range locks[4:] {
		lockIDs = append(lockIDs, lk.hd.ID)
	}
	if _, ok, err := b.m.TryAcquire(ctx, keys[4]); ok || err != nil { // held here
		t.Fatalf("TryAcquire of a locally held key = %v, %v", ok, err)
	}
	waitFor(t, &b.sig.Extended, func(k int) bool { return k >= 1 })
	if _, err := b.pool.Exec(ctx, "DELETE FROM syncguard_locks WHERE key = $1", keys[5]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &b.sig.Lost, func(k string) bool { return k == keys[5] })
	for i, lk := range locks[4:] {
		err := lk.Release(ctx)
		if i+4 == 5 {
			if !errors.Is(err, pglease.ErrLockLost) {
				t.Fatalf("Release of the lost lock = %v", err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
	}
	for _, lk := range peerLocks {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Everything recorded, as text.
	var texts []string
	spans := rg.spans.Ended()
	kv := func(attrs []attribute.KeyValue) {
		for _, a := range attrs {
			texts = append(texts, string(a.Key)+"="+a.Value.String())
		}
	}
	hashes := map[string]bool{}
	for _, s := range spans {
		texts = append(texts, s.Name(), s.Status().Description)
		kv(s.Attributes())
		for _, e := range s.Events() {
			texts = append(texts, e.Name)
			kv(e.Attributes)
		}
		for _, l := range s.Links() {
			kv(l.Attributes)
		}
		if h := attrOf(s.Attributes(), attrKeyHash); h.Type() == attribute.STRING {
			hashes[h.AsString()] = true
		}
	}
	var rm metricdata.ResourceMetrics
	if err := rg.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	points := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			texts = append(texts, m.Name, m.Description)
			sets := metricAttrSets(m.Data)
			points += len(sets)
			for _, set := range sets {
				kv(set.ToSlice())
			}
		}
	}
	logs := rg.logs.String()
	texts = append(texts, logs)

	// The scan must have had something to scan.
	if len(spans) < 2*n || points < 10 || strings.Count(logs, "\n") < n {
		t.Fatalf("too little recorded: %d spans, %d metric points, %d log lines", len(spans), points, strings.Count(logs, "\n"))
	}
	for _, want := range []string{"pglease: lock lost", "pglease: acquire", `"outcome":"timeout"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q", want)
		}
	}
	all := strings.Join(texts, "\n")
	for _, k := range keys {
		if strings.Contains(all, k) {
			t.Errorf("raw key %q recorded", k)
		}
		if strings.Contains(all, pglease.HashKey(k)) {
			t.Errorf("the unkeyed hash of %q recorded despite the key secret", k)
		}
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(k))
		if h := hex.EncodeToString(m.Sum(nil)[:16]); !hashes[h] {
			t.Errorf("no span carries the keyed hash of %q", k)
		}
	}
	for _, id := range lockIDs {
		if strings.Contains(all, id) {
			t.Error("a lockId was recorded")
		}
	}
	if len(lockIDs) != n {
		t.Fatalf("checked %d lockIds", len(lockIDs))
	}
}

// metricAttrSets returns the attribute sets of every data point of data.
func metricAttrSets(data metricdata.Aggregation) []attribute.Set {
	var out []attribute.Set
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Sum[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	}
	return out
}
