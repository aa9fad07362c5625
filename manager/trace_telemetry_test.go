package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/retry"
)

// roundTrip reports whether s is a database round trip made for callers
// (not the listener's connect).
func roundTrip(s sdktrace.ReadOnlySpan) bool {
	return s.SpanKind() == trace.SpanKindClient && s.Name() != spanListen
}

// callerRoots returns the root spans that are not the Manager's own
// (pglease.listen, pglease.heartbeat): the ones a contended acquire adds.
func callerRoots(spans []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if !s.Parent().IsValid() && s.Name() != spanListen && s.Name() != spanHeartbeat {
			out = append(out, s)
		}
	}
	return out
}

func spanNames(spans []sdktrace.ReadOnlySpan) string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	return strings.Join(names, ", ")
}

// TestTelemetryContendedAcquireOneTracePerCaller: two callers of this
// process, each under a span of its own, wait for a key another process
// holds; the second coalesces behind the first, and gets the key by local
// handoff when the first releases it. Every round trip made for them is
// in one of the two callers' traces (none is a root span of its own), and
// each one links, from its start, to every caller it served that is not
// its parent: the caller who follows its own trace reaches every round
// trip made for it, as a child or through a link. The only roots besides
// the Manager's own (listen, heartbeat) are the two callers' spans.
func TestTelemetryContendedAcquireOneTracePerCaller(t *testing.T) {
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
	tracer := rg.tp.Tracer("test")
	type result struct {
		lk  *Lock
		err error
	}
	var callers [2]trace.Span
	var cctx [2]context.Context
	var got [2]chan result
	for i := range 2 {
		cctx[i], callers[i] = tracer.Start(ctx, fmt.Sprintf("caller %d", i+1))
		got[i] = make(chan result, 1)
		go func() {
			lk, err := b.m.Acquire(cctx[i], "hot", WithAcquireTimeout(waitTimeout()))
			got[i] <- result{lk, err}
		}()
		waitFor(t, &b.sig.Queued, func(k string) bool { return k == "hot" })
	}
	// Both wait: of the acquire batches sent from now on, the second and
	// later ones went out with both queued and came back "locked" (see
	// TestTelemetryContended).
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
	for i := range 2 {
		r := <-got[i]
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := r.lk.Release(cctx[i]); err != nil { // the first hands the key to the second
			t.Fatal(err)
		}
		callers[i].End()
	}

	spans := rg.spans.Ended()
	roots := callerRoots(spans)
	t.Logf("root spans of the contended acquire (besides listen, heartbeat): %d (%s)", len(roots), spanNames(roots))
	if len(roots) != 2 {
		t.Errorf("%d root spans (%s), want the 2 callers' only", len(roots), spanNames(roots))
	}
	inCaller := map[trace.TraceID]bool{callers[0].SpanContext().TraceID(): true, callers[1].SpanContext().TraceID(): true}
	trips := 0
	for _, s := range spans {
		if roundTrip(s) {
			trips++
			if !inCaller[s.SpanContext().TraceID()] {
				t.Errorf("%s (parent %v) is not in a caller's trace", s.Name(), s.Parent().SpanID())
			}
		}
	}
	acqs := named(spans, spanAcquire)
	if len(acqs) != 2 || trips < 4 {
		t.Fatalf("%d acquire spans, %d round trips", len(acqs), trips)
	}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	shared, handoff := 0, 0
	for _, a := range acqs {
		// Every round trip that carried an attempt for this caller (the
		// acquire span links to each) is its child or links back to it,
		// except one the loop sent before the caller queued (it cannot
		// link to it; the acquire span's own link reaches it): at most
		// one, since one attempt per key is in flight at a time, and the
		// first of them to start.
		q := events(a, eventQueued)
		if len(q) != 1 {
			t.Fatalf("%d queued events", len(q))
		}
		var unlinked []sdktrace.ReadOnlySpan
		for _, l := range a.Links() {
			db := byID[l.SpanContext.SpanID()]
			if db == nil {
				t.Fatalf("acquire span links to a span that was not recorded")
			}
			if !childOf(db, a.SpanContext()) && !linksTo(db, a.SpanContext()) {
				unlinked = append(unlinked, db)
			}
			if !childOf(db, a.SpanContext()) {
				shared++
			}
			if db.Name() == spanHandOff {
				handoff++
				// The handoff grants this caller (its parent) and releases
				// the other caller's lock: it links to that release span.
				rels := named(spans, spanRelease)
				linked := false
				for _, rel := range rels {
					linked = linked || (linksTo(db, rel.SpanContext()) && linksTo(rel, db.SpanContext()))
				}
				if !childOf(db, a.SpanContext()) || !linked {
					t.Errorf("handoff: child of the waiter's acquire %v, linked to and from the releaser's release span %v",
						childOf(db, a.SpanContext()), linked)
				}
			}
		}
		if len(unlinked) > 1 || len(unlinked) == 1 && unlinked[0].SpanContext().SpanID() != a.Links()[0].SpanContext.SpanID() {
			for _, db := range unlinked {
				t.Errorf("%s (started %v after the caller queued) carried an attempt for an acquire it neither descends from nor links to",
					db.Name(), db.StartTime().Sub(q[0].Time))
			}
		}
	}
	if shared == 0 || handoff != 1 {
		t.Errorf("%d round trips served a caller who is not their parent, %d handoffs: the scenario did not happen", shared, handoff)
	}
}

// TestTelemetryOrphanReleaseInCallersTrace: the caller leaves while its
// attempt is in flight; the attempt is granted with nobody left to take
// the lock, and the loop releases it. That release is made on the
// caller's behalf: its round trip is in the caller's trace, a child of
// the acquire round trip whose grant it undoes (before, it was a root
// span nothing linked to).
func TestTelemetryOrphanReleaseInCallersTrace(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	gate := make(chan struct{})
	var once sync.Once
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}, hooks: kernel.TestHooks{BeforeBatch: func(kind kernel.BatchKind, n int) {
		if kind == kernel.KindAcquire {
			once.Do(func() { <-gate }) // hold the first acquire batch
		}
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	ctx, caller := rg.tp.Tracer("test").Start(ctx, "caller")
	errc := make(chan error, 1)
	go func() {
		_, err := b.m.Acquire(ctx, "gone")
		errc <- err
	}()
	waitFor(t, &b.sig.BatchSent, func(bi kernel.BatchInfo) bool { return bi.Kind == kernel.KindAcquire })
	cancel()
	if err := <-errc; !errors.Is(err, pglease.ErrAborted) {
		t.Fatalf("err = %v", err)
	}
	caller.End()
	wait(t, &b.sig.Abandoned)
	close(gate)
	if k := wait(t, &b.sig.Orphaned); k != "gone" {
		t.Fatalf("orphaned %q", k)
	}
	waitFor(t, &b.sig.Released, func(k string) bool { return k == "gone" })

	spans := rg.spans.Ended()
	acq := one(t, spans, spanAcquire)
	adb := one(t, spans, spanAcquireMany)
	rdb := one(t, spans, spanReleaseMany) // ended before the result reached the loop
	if !childOf(adb, acq.SpanContext()) {
		t.Error("the lone caller's acquire_many is not a child of its acquire span")
	}
	if rdb.SpanContext().TraceID() != caller.SpanContext().TraceID() || !childOf(rdb, adb.SpanContext()) {
		t.Errorf("the orphan release's round trip is not in the caller's trace under the acquire round trip (root: %v)", !rdb.Parent().IsValid())
	}
	if roots := callerRoots(spans); len(roots) != 1 {
		t.Errorf("%d root spans (%s), want the caller's only", len(roots), spanNames(roots))
	}
}

// TestTelemetryDurationsInSeconds: every duration pglease records is in
// seconds: attributes as float64 seconds (pglease.lock.ttl,
// pglease.acquire.wait, pglease.lock.held_for), log fields as the same
// numbers (not slog's nanoseconds), metric instruments with unit "s".
func TestTelemetryDurationsInSeconds(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "units", WithTTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, "DELETE FROM syncguard_locks WHERE key = 'units'"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &b.sig.Lost, func(k string) bool { return k == "units" })
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Release = %v", err)
	}
	spans := rg.spans.Ended()
	acq := one(t, spans, spanAcquire)
	lost := one(t, spans, spanLost)
	if v := attrOf(acq.Attributes(), attrTTL); v.AsFloat64() != 1.5 {
		t.Errorf("pglease.lock.ttl = %v, want 1.5 (seconds)", v.String())
	}
	wantSeconds := map[string]float64{
		"pglease: acquire":   attrOf(acq.Attributes(), attrWait).AsFloat64(),
		"pglease: lock lost": attrOf(lost.Attributes(), attrHeldFor).AsFloat64(),
	}
	field := map[string]string{"pglease: acquire": "wait", "pglease: lock lost": "held_for"}
	for line := range strings.Lines(rg.logs.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		msg, _ := rec["msg"].(string)
		want, ok := wantSeconds[msg]
		if !ok {
			continue
		}
		delete(wantSeconds, msg)
		if got := rec[field[msg]]; got != want || want <= 0 || want > 60 {
			t.Errorf("%q: log field %s = %v, span attribute %v: want the same number of seconds", msg, field[msg], got, want)
		}
	}
	if len(wantSeconds) != 0 {
		t.Errorf("no log records %v", wantSeconds)
	}
	for name, m := range rg.metrics(t) {
		var isDuration bool
		switch m.Data.(type) {
		case metricdata.Histogram[float64]:
			isDuration = strings.HasSuffix(name, ".duration") || strings.HasSuffix(name, ".lag")
		}
		if isDuration && m.Unit != "s" {
			t.Errorf("%s: unit %q, want s", name, m.Unit)
		}
	}
}
