package manager

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// TestTelemetrySharedAndSets: a reader and a permit are recorded like a
// lease, with pglease.lock.kind shared and permit, their round trip a
// pglease.acquire_shared_many span; each key of a set is a lease acquire
// of its own, and the set's round trip a pglease.acquire_sets span, a
// child of its first key's acquire span that links to the others.
func TestTelemetrySharedAndSets(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := context.Background()
	kindShared, kindPermit := attrLockKind.String("shared"), attrLockKind.String("permit")
	rd, err := b.m.Acquire(ctx, "tel:rw", Shared())
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.m.Acquire(ctx, "tel:sem", WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	locks, err := b.m.AcquireAll(ctx, []string{"tel:a", "tel:b"})
	if err != nil {
		t.Fatal(err)
	}
	held := rg.metrics(t)["pglease.lock.held"]
	for _, c := range []struct {
		kind attribute.KeyValue
		n    int64
	}{{kindShared, 1}, {kindPermit, 1}, {kindLease, 2}} {
		if got := sumOf(t, held, c.kind); got != c.n {
			t.Errorf("pglease.lock.held{%s} = %d, want %d", c.kind.Value.AsString(), got, c.n)
		}
	}
	for _, lk := range append(locks, rd, p) {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	spans := rg.spans.Ended()
	var acqShared, acqPermit, acqLease int
	for _, s := range named(spans, spanAcquire) {
		switch attrOf(s.Attributes(), attrLockKind).AsString() {
		case "shared":
			acqShared++
		case "permit":
			acqPermit++
		case "lease":
			acqLease++
		}
	}
	if acqShared != 1 || acqPermit != 1 || acqLease != 2 {
		t.Errorf("acquire spans: %d shared, %d permit, %d lease; want 1, 1, 2", acqShared, acqPermit, acqLease)
	}
	if n := len(named(spans, spanAcquireShared)); n != 2 {
		t.Errorf("%d %s spans, want 2", n, spanAcquireShared)
	}
	sets := one(t, spans, spanAcquireSets)
	wantAttrs(t, sets, attrBatchSize.Int(2), attrBatchOK.Int(2))
	parents, links := 0, 0
	for _, s := range named(spans, spanAcquire) {
		switch {
		case attrOf(s.Attributes(), attrLockKind).AsString() != "lease":
		case childOf(sets, s.SpanContext()):
			parents++
		case linksTo(sets, s.SpanContext()):
			links++
		}
	}
	if parents != 1 || links != 1 {
		t.Errorf("the set's round trip is a child of %d key acquire spans and links to %d others; want 1 and 1", parents, links)
	}
	rels := rg.metrics(t)["pglease.lock.releases"]
	for _, k := range []attribute.KeyValue{kindShared, kindPermit} {
		if n := sumOf(t, rels, k, attrOutcome.String("ok")); n != 1 {
			t.Errorf("pglease.lock.releases{%s, ok} = %d, want 1", k.Value.AsString(), n)
		}
	}
}
