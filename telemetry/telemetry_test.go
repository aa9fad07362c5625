package telemetry

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/obs"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

var (
	lease    = attrLockKind.String("lease")
	advisory = attrLockKind.String("advisory")
)

// grant drives one uncontended acquire the way the Manager does for a lone
// caller: the DB span is the acquire span's child.
func grant(h *harness, ctx context.Context, key string, fence pglease.Fence) *obs.Acquisition {
	r := h.rec
	_, a := r.StartAcquire(ctx, r.Key(key), obs.AcquireInfo{Kind: obs.KindLease, TTL: 30 * time.Second})
	a.Queued(obs.QueueInfo{})
	_, db := r.StartDB(context.Background(), obs.OpAcquireMany, 1, a.SpanContext())
	db.End(1, nil)
	a.Attempt(db.SpanContext(), obs.AttemptGranted, 0)
	a.Granted(fence)
	return a
}

func TestAcquireUncontended(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, caller := recOf(h.rec).tracer.Start(context.Background(), "caller")
	grant(h, ctx, "resource:123", 7)
	caller.End()

	acq := h.oneSpan(spanAcquire)
	if acq.SpanKind() != trace.SpanKindInternal {
		t.Errorf("acquire span kind %v", acq.SpanKind())
	}
	if acq.Parent().SpanID() != caller.SpanContext().SpanID() {
		t.Errorf("acquire span is not a child of the caller's span")
	}
	if acq.InstrumentationScope().Name != ScopeName || acq.InstrumentationScope().Version != scopeVersion {
		t.Errorf("scope = %+v", acq.InstrumentationScope())
	}
	a := acq.Attributes()
	wantAttr(t, "acquire", a, attrKeyHash.String("e90a28c676a29a3291e2874a"))
	wantAttr(t, "acquire", a, lease)
	wantAttr(t, "acquire", a, attrTry.Bool(false))
	wantAttr(t, "acquire", a, attrTTL.Float64(30))
	wantAttr(t, "acquire", a, attrOutcome.String("granted"))
	wantAttr(t, "acquire", a, attrAttempts.Int64(1))
	wantAttr(t, "acquire", a, attrContended.Bool(false))
	wantAttr(t, "acquire", a, attrCoalesced.Bool(false))
	wantAttr(t, "acquire", a, attrFence.Int64(7))
	if acq.Status().Code != codes.Unset {
		t.Errorf("acquire status %v", acq.Status())
	}

	db := h.oneSpan(string(obs.OpAcquireMany))
	if db.SpanKind() != trace.SpanKindClient {
		t.Errorf("db span kind %v", db.SpanKind())
	}
	if db.Parent().SpanID() != acq.SpanContext().SpanID() {
		t.Errorf("lone acquire's DB span is not the acquire span's child")
	}
	d := db.Attributes()
	wantAttr(t, "db", d, semconv.DBSystemNamePostgreSQL)
	wantAttr(t, "db", d, semconv.DBOperationName("pglease.acquire_many"))
	wantAttr(t, "db", d, attrBatchSize.Int(1))
	wantAttr(t, "db", d, attrBatchOK.Int(1))
	wantAttr(t, "db", d, attrOutcome.String("ok"))
	if !hasLink(acq, db.SpanContext()) {
		t.Errorf("acquire span does not link to its DB span")
	}

	rm := h.collect()
	if p := h.point(rm, "pglease.acquire.duration", lease, attrOutcome.String("granted")); p.count != 1 {
		t.Errorf("acquire.duration count = %d, want 1", p.count)
	}
	if p := h.point(rm, "pglease.acquire.attempts", lease); p.count != 1 || p.sum != 1 {
		t.Errorf("acquire.attempts = %+v, want one acquire with 1 attempt", p)
	}
	if p := h.point(rm, "pglease.lock.held", lease); p.value != 1 {
		t.Errorf("lock.held = %v, want 1", p.value)
	}
	if p := h.point(rm, "pglease.acquire.contended"); p.value != 0 {
		t.Errorf("acquire.contended = %v, want 0", p.value)
	}
	if p := h.point(rm, "pglease.db.batch.size", semconv.DBOperationName("pglease.acquire_many")); p.count != 1 || p.sum != 1 {
		t.Errorf("db.batch.size = %+v", p)
	}
	if p := h.point(rm, "db.client.operation.duration", semconv.DBSystemNamePostgreSQL,
		semconv.DBOperationName("pglease.acquire_many")); p.count != 1 {
		t.Errorf("db.client.operation.duration count = %d", p.count)
	}
}

// TestContendedAcquire is the doc.go story: the key is held by another
// process; two attempts find it taken, the third wins.
func TestContendedAcquire(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	_, a := r.StartAcquire(context.Background(), r.Key("payment:123"), obs.AcquireInfo{Kind: obs.KindLease, TTL: time.Second})
	a.Queued(obs.QueueInfo{})
	var dbs []trace.SpanContext
	for i, out := range []obs.AttemptOutcome{obs.AttemptContended, obs.AttemptContended, obs.AttemptGranted} {
		_, db := r.StartDB(context.Background(), obs.OpAcquireMany, 1, a.SpanContext())
		ok := 0
		if out == obs.AttemptGranted {
			ok = 1
		}
		db.End(ok, nil)
		dbs = append(dbs, db.SpanContext())
		retry := time.Duration(0)
		if out == obs.AttemptContended {
			retry = 100 * time.Millisecond << i
		}
		a.Attempt(db.SpanContext(), out, retry)
	}
	a.Granted(42)

	acq := h.oneSpan(spanAcquire)
	wantAttr(t, "acquire", acq.Attributes(), attrContended.Bool(true))
	wantAttr(t, "acquire", acq.Attributes(), attrAttempts.Int64(3))
	wantAttr(t, "acquire", acq.Attributes(), attrFence.Int64(42))
	var outcomes []string
	var retries []float64
	for _, ev := range acq.Events() {
		if ev.Name != eventAttempt {
			continue
		}
		v, _ := attrOf(ev.Attributes, attrOutcome)
		outcomes = append(outcomes, v.AsString())
		if v, ok := attrOf(ev.Attributes, attrRetryIn); ok {
			retries = append(retries, v.AsFloat64())
		}
	}
	if want := []string{"contended", "contended", "granted"}; len(outcomes) != 3 ||
		outcomes[0] != want[0] || outcomes[1] != want[1] || outcomes[2] != want[2] {
		t.Errorf("attempt events %v, want %v", outcomes, want)
	}
	if len(retries) != 2 || retries[0] != 0.1 || retries[1] != 0.2 {
		t.Errorf("retry_in %v, want [0.1 0.2]", retries)
	}
	for i, sc := range dbs {
		if !hasLink(acq, sc) {
			t.Errorf("acquire span lacks a link to DB attempt %d", i+1)
		}
	}
	if n := len(h.spansNamed(string(obs.OpAcquireMany))); n != 3 {
		t.Errorf("%d DB spans, want 3", n)
	}
	rm := h.collect()
	if p := h.point(rm, "pglease.acquire.contended", lease); p.value != 1 {
		t.Errorf("acquire.contended = %v, want 1", p.value)
	}
	if p := h.point(rm, "pglease.acquire.attempts", lease); p.sum != 3 {
		t.Errorf("attempts sum = %v, want 3", p.sum)
	}
}

// TestCoalescedBatch: two callers of one process wait for one key; one
// round trip serves both (made for the head waiter: its child, linked to
// and from the second); the second is coalesced and gets the key by local
// handoff after the first releases (a child of the second's acquire span,
// linked to and from the first's release span).
func TestCoalescedBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	k := r.Key("job:42")
	_, a := r.StartAcquire(context.Background(), k, obs.AcquireInfo{Kind: obs.KindLease})
	_, b := r.StartAcquire(context.Background(), k, obs.AcquireInfo{Kind: obs.KindLease})
	a.Queued(obs.QueueInfo{Position: 0})
	b.Queued(obs.QueueInfo{Coalesced: true, Position: 1})
	_, db := r.StartDB(context.Background(), obs.OpAcquireMany, 1, a.SpanContext(), a.SpanContext(), b.SpanContext())
	db.End(1, nil)
	a.Attempt(db.SpanContext(), obs.AttemptGranted, 0)
	b.Attempt(db.SpanContext(), obs.AttemptContended, 0)
	a.Granted(1)
	rctx, rel := a.StartRelease(context.Background())
	relSC := trace.SpanContextFromContext(rctx)
	_, db2 := r.StartDB(context.Background(), obs.OpHandOff, 1, b.SpanContext(), relSC, b.SpanContext()) // release + acquire for b
	db2.End(1, nil)
	rel.Served(db2.SpanContext())
	rel.End(nil)
	b.Attempt(db2.SpanContext(), obs.AttemptGranted, 0)
	b.Granted(2)

	batch := h.spansNamed(string(obs.OpAcquireMany))[0]
	var spA, spB trace.SpanContext = a.SpanContext(), b.SpanContext()
	if batch.Parent().SpanID() != spA.SpanID() || len(batch.Links()) != 1 || !hasLink(batch, spB) {
		t.Errorf("the shared round trip: parent %v, links %v; want a child of the head waiter linked to the other", batch.Parent().SpanID(), batch.Links())
	}
	handoff := h.oneSpan(string(obs.OpHandOff))
	if handoff.Parent().SpanID() != spB.SpanID() || !hasLink(handoff, relSC) || !hasLink(h.oneSpan(spanRelease), handoff.SpanContext()) {
		t.Errorf("the handoff: parent %v, links %v; want a child of the waiter linked to and from the release", handoff.Parent().SpanID(), handoff.Links())
	}
	for _, s := range h.spansNamed(spanAcquire) {
		if !hasLink(s, batch.SpanContext()) {
			t.Errorf("acquire span %s lacks a link to the shared batch", s.SpanContext().SpanID())
		}
		if s.SpanContext().Equal(spB) {
			wantAttr(t, "b", s.Attributes(), attrCoalesced.Bool(true))
			wantAttr(t, "b", s.Attributes(), attrContended.Bool(true))
			wantAttr(t, "b", s.Attributes(), attrAttempts.Int64(2))
		}
		if s.SpanContext().Equal(spA) {
			wantAttr(t, "a", s.Attributes(), attrCoalesced.Bool(false))
		}
	}
	rm := h.collect()
	if p := h.point(rm, "pglease.acquire.coalesced", lease); p.value != 1 {
		t.Errorf("acquire.coalesced = %v, want 1", p.value)
	}
	if p := h.point(rm, "pglease.db.batch.size"); p.count != 2 || p.sum != 2 {
		t.Errorf("db.batch.size = %+v, want 2 batches of one key each", p)
	}
	if p := h.point(rm, "pglease.lock.held", lease); p.value != 1 {
		t.Errorf("lock.held = %v, want 1", p.value)
	}
}

func TestHeartbeatExtendAndLoss(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	keep := grant(h, context.Background(), "keep", 1)
	lose := grant(h, context.Background(), "lose", 2)
	expire := grant(h, context.Background(), "expire", 3)

	hctx, hb := r.StartHeartbeat(context.Background(), 3)
	_, db := r.StartDB(hctx, obs.OpExtendMany, 3, trace.SpanContext{})
	db.End(1, nil)
	keep.Extended(20 * time.Millisecond)
	lose.Lost(obs.LossNotHeld, db.SpanContext())
	lose.Lost(obs.LossNotHeld, db.SpanContext()) // once only
	expire.ExtendFailed(pgerr.New(pglease.CodeServiceUnavailable, "extend", "conn lost", nil))
	hb.End(1, 1, nil)
	expire.Lost(obs.LossExpired, trace.SpanContext{})

	hbSpan := h.oneSpan(spanHeartbeat)
	wantAttr(t, "heartbeat", hbSpan.Attributes(), attrDue.Int(3))
	wantAttr(t, "heartbeat", hbSpan.Attributes(), attrExtended.Int(1))
	wantAttr(t, "heartbeat", hbSpan.Attributes(), attrLost.Int(1))
	ext := h.oneSpan(string(obs.OpExtendMany))
	if ext.Parent().SpanID() != hbSpan.SpanContext().SpanID() {
		t.Errorf("extend DB span is not the heartbeat's child")
	}
	lost := h.spansNamed(spanLost)
	if len(lost) != 2 {
		t.Fatalf("%d lost spans, want 2", len(lost))
	}
	for _, s := range lost {
		if s.Status().Code != codes.Error || s.Status().Description != "LockLost" {
			t.Errorf("lost span status %+v", s.Status())
		}
		switch s.Parent().SpanID() {
		case lose.SpanContext().SpanID():
			wantAttr(t, "lost", s.Attributes(), attrLossCause.String("not_held"))
			wantAttr(t, "lost", s.Attributes(), attrKeyHash.String(r.Key("lose").Hash()))
			if !hasLink(s, ext.SpanContext()) {
				t.Errorf("lost span does not link to the extend that found the loss")
			}
		case expire.SpanContext().SpanID():
			wantAttr(t, "lost", s.Attributes(), attrLossCause.String("expired"))
		default:
			t.Errorf("lost span is not a child of the lock's acquire span")
		}
	}

	rm := h.collect()
	if p := h.point(rm, "pglease.lock.extends", lease, attrOutcome.String("ok")); p.value != 1 {
		t.Errorf("extends ok = %v, want 1", p.value)
	}
	if p := h.point(rm, "pglease.lock.extends", lease, attrOutcome.String("error")); p.value != 1 {
		t.Errorf("extends error = %v, want 1", p.value)
	}
	if p := h.point(rm, "pglease.lock.extend.lag", lease); p.count != 1 || math.Abs(p.sum-0.02) > 1e-9 {
		t.Errorf("extend.lag = %+v, want one 0.02 s", p)
	}
	if p := h.point(rm, "pglease.lock.lost", lease, attrLossCause.String("not_held")); p.value != 1 {
		t.Errorf("lost{not_held} = %v, want 1", p.value)
	}
	if p := h.point(rm, "pglease.lock.lost", lease, attrLossCause.String("expired")); p.value != 1 {
		t.Errorf("lost{expired} = %v, want 1", p.value)
	}
	if p := h.point(rm, "pglease.lock.held", lease); p.value != 1 {
		t.Errorf("lock.held = %v, want 1 (3 granted, 2 lost)", p.value)
	}
	if logs := h.logs.String(); !containsAll(logs, `"msg":"pglease: lock lost"`, `"cause":"not_held"`, `"msg":"pglease: extend failed"`) {
		t.Errorf("logs lack the loss/extend records:\n%s", logs)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	a := grant(h, context.Background(), "rel", 5)
	b := grant(h, context.Background(), "rel-gone", 6)
	_, ra := a.StartRelease(context.Background())
	_, rb := b.StartRelease(context.Background())
	_, db := r.StartDB(context.Background(), obs.OpReleaseMany, 2, trace.SpanContext{})
	db.End(1, nil)
	ra.Served(db.SpanContext())
	rb.Served(db.SpanContext())
	ra.End(nil)
	rb.End(pgerr.New(pglease.CodeLockLost, "release", "lock was no longer held", nil))
	b.Lost(obs.LossNotHeld, trace.SpanContext{}) // after release: no-op

	for _, s := range h.spansNamed(spanRelease) {
		if !hasLink(s, db.SpanContext()) {
			t.Errorf("release span lacks a link to its DB span")
		}
		if !hasLink(s, a.SpanContext()) && !hasLink(s, b.SpanContext()) {
			t.Errorf("release span lacks a link to its acquire span")
		}
	}
	if n := len(h.spansNamed(spanLost)); n != 0 {
		t.Errorf("%d lost spans after release, want 0", n)
	}
	rm := h.collect()
	if p := h.point(rm, "pglease.lock.held", lease); p.value != 0 {
		t.Errorf("lock.held = %v, want 0", p.value)
	}
	if p := h.point(rm, "pglease.lock.releases", lease, attrOutcome.String("ok")); p.value != 1 {
		t.Errorf("releases ok = %v", p.value)
	}
	if p := h.point(rm, "pglease.lock.releases", lease, attrOutcome.String("not_held")); p.value != 1 {
		t.Errorf("releases not_held = %v", p.value)
	}
	if p := h.point(rm, "pglease.db.batch.size", semconv.DBOperationName("pglease.release_many")); p.sum != 2 {
		t.Errorf("release batch size = %+v", p)
	}
}

func TestAcquireFailures(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	start := func(key string, try bool) *obs.Acquisition {
		_, a := r.StartAcquire(context.Background(), r.Key(key), obs.AcquireInfo{Kind: obs.KindAdvisory, Try: try})
		return a
	}
	timeout := start("t", false)
	timeout.Attempt(trace.SpanContext{}, obs.AttemptContended, time.Second)
	timeout.Failed(pgerr.New(pglease.CodeAcquisitionTimeout, "manager.Acquire", "wait bound passed", nil))
	timeout.Granted(9) // too late: no-op

	aborted := start("a", false)
	aborted.Failed(context.Canceled)

	locked := start("l", true)
	locked.Attempt(trace.SpanContext{}, obs.AttemptContended, 0)
	locked.NotAcquired()

	broken := start("b", false)
	broken.Attempt(trace.SpanContext{}, obs.AttemptFailed, 0)
	broken.Failed(errors.New("boom"))

	byKey := map[string]struct {
		outcome, status string
		code            codes.Code
	}{
		r.Key("t").Hash(): {"timeout", "AcquisitionTimeout", codes.Error},
		r.Key("a").Hash(): {"aborted", "context.Canceled", codes.Error},
		r.Key("l").Hash(): {"locked", "", codes.Unset},
		r.Key("b").Hash(): {"error", "_OTHER", codes.Error},
	}
	spans := h.spansNamed(spanAcquire)
	if len(spans) != 4 {
		t.Fatalf("%d acquire spans, want 4", len(spans))
	}
	for _, s := range spans {
		kh, _ := attrOf(s.Attributes(), attrKeyHash)
		want := byKey[kh.AsString()]
		wantAttr(t, kh.AsString(), s.Attributes(), attrOutcome.String(want.outcome))
		wantAttr(t, kh.AsString(), s.Attributes(), advisory)
		if s.Status().Code != want.code || s.Status().Description != want.status {
			t.Errorf("%s: status %+v, want %v %q", want.outcome, s.Status(), want.code, want.status)
		}
		if want.code == codes.Error {
			wantAttr(t, want.outcome, s.Attributes(), semconv.ErrorTypeKey.String(want.status))
		}
		if _, ok := attrOf(s.Attributes(), attrFence); ok {
			t.Errorf("%s: failed acquire carries a fence", want.outcome)
		}
	}
	rm := h.collect()
	for _, o := range []string{"timeout", "aborted", "locked", "error"} {
		if p := h.point(rm, "pglease.acquire.duration", advisory, attrOutcome.String(o)); p.count != 1 {
			t.Errorf("acquire.duration{%s} count = %d, want 1", o, p.count)
		}
	}
	if p := h.point(rm, "pglease.lock.held"); p.value != 0 {
		t.Errorf("lock.held = %v after failures only", p.value)
	}
	if p := h.point(rm, "pglease.acquire.contended", advisory); p.value != 2 {
		t.Errorf("contended = %v, want 2 (timeout and locked)", p.value)
	}
}

func TestLoopMeter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l := loopOf(h.rec.Loop())
	clock := time.Unix(1000, 0)
	l.mu.Lock() // the fields below are set before any use; the lock is for -race clarity
	l.now = func() time.Time { return clock }
	l.base, l.lastObs, l.lastBusy = clock, 0, 0
	l.mu.Unlock()
	busy := func() float64 {
		t.Helper()
		p := h.point(h.collect(), "pglease.manager.loop.busy")
		if !p.found {
			t.Fatalf("no loop.busy point")
		}
		return p.value
	}
	l.Busy()
	clock = clock.Add(300 * time.Millisecond)
	l.Idle()
	clock = clock.Add(700 * time.Millisecond)
	if got := busy(); math.Abs(got-0.3) > 1e-9 {
		t.Errorf("busy = %v, want 0.3", got)
	}
	l.Busy()
	clock = clock.Add(500 * time.Millisecond)
	if got := busy(); got != 1 {
		t.Errorf("busy while working = %v, want 1", got)
	}
	clock = clock.Add(500 * time.Millisecond)
	l.Idle()
	clock = clock.Add(time.Second)
	if got := busy(); math.Abs(got-1.0/3) > 1e-9 {
		t.Errorf("busy = %v, want 1/3", got)
	}

	l.SetDepth(obs.QueueWaiters, 5)
	l.SetDepth(obs.QueueInflight, 2)
	l.SetDepth(obs.Queue(200), 9) // ignored
	rm := h.collect()
	if p := h.point(rm, "pglease.manager.queue.depth", attrQueue.String("waiters")); p.value != 5 {
		t.Errorf("waiters depth = %v", p.value)
	}
	if p := h.point(rm, "pglease.manager.queue.depth", attrQueue.String("inflight")); p.value != 2 {
		t.Errorf("inflight depth = %v", p.value)
	}
	h.rec.Close()
	if _, ok := findMetric(h.collect(), "pglease.manager.queue.depth"); ok {
		t.Errorf("queue.depth still observed after Close")
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestDBSpanLinksServed: a round trip's span links, from its start, to
// every operation span it serves, except its parent, each once; invalid
// span contexts are skipped; at most MaxLinks. Without a parent it is a
// root span.
func TestDBSpanLinksServed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	ctx := context.Background()
	var scs []trace.SpanContext
	for range 3 {
		_, a := r.StartAcquire(ctx, r.Key("k"), obs.AcquireInfo{})
		scs = append(scs, a.SpanContext())
	}
	head, b, c := scs[0], scs[1], scs[2]
	_, db := r.StartDB(ctx, obs.OpAcquireMany, 1, head, head, b, trace.SpanContext{}, b, c)
	db.End(0, nil)
	_, root := r.StartDB(ctx, obs.OpReleaseMany, 2, trace.SpanContext{}, b, c)
	root.End(2, nil)
	many := make([]trace.SpanContext, 0, obs.MaxLinks+10)
	for range obs.MaxLinks + 10 {
		_, a := r.StartAcquire(ctx, r.Key("k"), obs.AcquireInfo{})
		many = append(many, a.SpanContext())
	}
	_, big := r.StartDB(ctx, obs.OpAcquireMany, len(many), trace.SpanContext{}, many...)
	big.End(0, nil)

	for _, s := range h.ended() {
		switch s.SpanContext().SpanID() {
		case db.SpanContext().SpanID():
			if s.Parent().SpanID() != head.SpanID() {
				t.Error("the round trip is not a child of its parent")
			}
			if len(s.Links()) != 2 || !hasLink(s, b) || !hasLink(s, c) {
				t.Errorf("links %v, want b and c once each", s.Links())
			}
		case root.SpanContext().SpanID():
			if s.Parent().IsValid() || len(s.Links()) != 2 || !hasLink(s, b) || !hasLink(s, c) {
				t.Errorf("root batch: parent %v, links %v", s.Parent().SpanID(), s.Links())
			}
		case big.SpanContext().SpanID():
			if len(s.Links()) != obs.MaxLinks || s.DroppedLinks() != 0 {
				t.Errorf("%d links (%d dropped), want %d", len(s.Links()), s.DroppedLinks(), obs.MaxLinks)
			}
		}
	}
}

// TestReleaseTriggerInstalledMetric: pglease.release_trigger.installed is
// 1 for a Manager with the trigger (counted once), 0 for one without, and
// Close takes the 1 back; a missing trigger is one Info record, no Warn.
func TestReleaseTriggerInstalledMetric(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.rec
	r.ReleaseTrigger(true, "pglease_release")
	r.ReleaseTrigger(true, "pglease_release")
	if p := h.point(h.collect(), metricReleaseTriggerInstalled); !p.found || p.value != 1 {
		t.Errorf("installed = %+v, want 1", p)
	}
	r.Close()
	r.ReleaseTrigger(true, "pglease_release") // after Close: not counted again
	if p := h.point(h.collect(), metricReleaseTriggerInstalled); !p.found || p.value != 0 {
		t.Errorf("installed after Close = %+v, want 0", p)
	}
	if logs := h.logs.String(); strings.Contains(logs, "release trigger") {
		t.Errorf("logged about an installed trigger: %s", logs)
	}

	h2 := newHarness(t)
	h2.rec.ReleaseTrigger(false, "pglease_release")
	if p := h2.point(h2.collect(), metricReleaseTriggerInstalled); !p.found || p.value != 0 {
		t.Errorf("installed without the trigger = %+v, want a 0 point", p)
	}
	logs := h2.logs.String()
	if strings.Count(logs, "\n") != 1 || !strings.Contains(logs, `"level":"DEBUG"`) || !strings.Contains(logs, "SetupReleaseTrigger") {
		t.Errorf("want one Debug record naming the fix, got: %s", logs)
	}
	// A SyncGuard holder met: one Info record, however many are met.
	h2.rec.ForeignHolder()
	h2.rec.ForeignHolder()
	logs = h2.logs.String()
	if strings.Count(logs, `"level":"INFO"`) != 1 || !strings.Contains(logs, "SyncGuard process") {
		t.Errorf("want one Info record once a SyncGuard holder is met, got: %s", logs)
	}
	h.rec.ForeignHolder() // the trigger is installed: nothing
	if logs := h.logs.String(); strings.Contains(logs, "SyncGuard process") {
		t.Errorf("logged about a SyncGuard holder although the trigger is installed: %s", logs)
	}
}
