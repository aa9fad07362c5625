package manager

import (
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
)

// TestTelemetryRevoke: a Revoke is one pglease.revoke round trip, a child
// of the caller's span; the revoked lock's loss is a pglease.lost span
// with cause revoked and error.type Revoked, counted in pglease.lock.lost
// by that cause; a RequestRelease is one pglease.request_release round
// trip; a Watch's reads are pglease.snapshot round trips.
func TestTelemetryRevoke(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	const key = "telemetry:revoke"
	ch, err := b.m.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventReleased, 0)
	lk, err := b.m.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, nextEvent(t, ch), EventGranted, lk.Fence())
	pctx, parent := rg.tp.Tracer("test").Start(ctx, "caller")
	if err := b.m.RequestRelease(pctx, key); err != nil {
		t.Fatal(err)
	}
	<-lk.ReleaseRequested()
	if n, _, err := b.m.Revoke(pctx, key); err != nil || n != 1 {
		t.Fatalf("Revoke = %v, %v", n, err)
	}
	parent.End()
	<-lk.Done()
	expectEvent(t, nextEvent(t, ch), EventRevoked, lk.Fence())
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrRevoked) {
		t.Fatalf("Release = %v", err)
	}
	spans := rg.spans.Ended()
	psc := parent.SpanContext()
	for _, name := range []string{spanRevoke, spanRequestRelease} {
		s := one(t, spans, name)
		if !childOf(s, psc) || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("%s: not a client span child of the caller's span", name)
		}
		wantAttrs(t, s, dbPostgres, attribute.String("db.operation.name", name), outcomeOK)
	}
	if len(named(spans, spanSnapshot)) < 2 { // the watch's first read, the grant's
		t.Errorf("%d snapshot round trips", len(named(spans, spanSnapshot)))
	}
	lost := one(t, spans, spanLost)
	if !childOf(lost, one(t, spans, spanAcquire).SpanContext()) {
		t.Error("pglease.lost is not a child of the lock's acquire span")
	}
	wantAttrs(t, lost, kindLease, attrLossCause.String("revoked"), attribute.String("error.type", "Revoked"))
	if st := lost.Status(); st.Code != codes.Error || st.Description != "Revoked" {
		t.Errorf("lost status = %+v", st)
	}
	if n := len(named(spans, spanRelease)); n != 0 {
		t.Errorf("%d release spans for a revoked lock", n)
	}
	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.lock.lost"], kindLease, attrLossCause.String("revoked")); n != 1 {
		t.Errorf("lock.lost{revoked} = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.held"], kindLease); n != 0 {
		t.Errorf("lock.held = %d", n)
	}
}
