package manager

import (
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg/advisory"
)

var kindAdvisory = attrLockKind.String("advisory")

// advHash is the key hash telemetry records for an advisory key (no
// key secret): SyncGuard's hashKey of the key's String form.
func advHash(k advisory.Key) attribute.KeyValue {
	return attrKeyHash.String(pglease.HashKey(k.String()))
}

func dbOp(op string) attribute.KeyValue {
	return attribute.String("db.operation.name", string(op))
}

// heldAdvisory is the current value of pglease.lock.held{kind=advisory};
// 0 before the Manager's first grant (the SDK reports an updowncounter
// only once it has been used).
func heldAdvisory(t *testing.T, rg *rig) int64 {
	t.Helper()
	m, ok := rg.metrics(t)["pglease.lock.held"]
	if !ok {
		return 0
	}
	return sumOf(t, m, kindAdvisory)
}

// TestAdvisoryTelemetryTry: an uncontended TryLockAdvisory and its Release,
// under a caller's span: the acquire span (advisory, try, granted, one
// attempt, no fence) with its pg_try_advisory_lock round trip as a client
// child it links to; the release span with its unlock round trip; the
// held gauge 1 while held and 0 after; the acquire, release and DB
// metrics.
func TestAdvisoryTelemetryTry(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}, noSignals: true})
	ctx, root := rg.tp.Tracer("test").Start(ctxT(t), "test.root")
	key := advKey()
	l, ok, err := b.m.TryLockAdvisory(ctx, key)
	if err != nil || !ok {
		t.Fatalf("TryLockAdvisory = %v, %v", ok, err)
	}
	if n := heldAdvisory(t, rg); n != 1 {
		t.Errorf("lock.held{advisory} while held = %d, want 1", n)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	root.End()

	spans := rg.spans.Ended()
	acq := one(t, spans, spanAcquire)
	if !childOf(acq, root.SpanContext()) {
		t.Error("pglease.acquire is not a child of the caller's span")
	}
	wantAttrs(t, acq, advHash(key), kindAdvisory, attrTry.Bool(true), outcomeGrnt,
		attrAttempts.Int64(1), attrContended.Bool(false))
	if v := attrOf(acq.Attributes(), attrFence); v.Type() != attribute.EMPTY {
		t.Errorf("advisory acquire carries a fence: %v", v.String())
	}
	if v := attrOf(acq.Attributes(), attrTTL); v.Type() != attribute.EMPTY {
		t.Errorf("advisory acquire carries a TTL: %v", v.String())
	}
	if acq.Status().Code != codes.Unset {
		t.Errorf("acquire status = %v", acq.Status())
	}
	try := one(t, spans, spanAdvisoryTryLock)
	if try.SpanKind() != trace.SpanKindClient || !childOf(try, acq.SpanContext()) || !linksTo(acq, try.SpanContext()) {
		t.Errorf("advisory_try_lock: kind %v, child of acquire %v, linked %v", try.SpanKind(),
			childOf(try, acq.SpanContext()), linksTo(acq, try.SpanContext()))
	}
	wantAttrs(t, try, dbPostgres, dbOp(spanAdvisoryTryLock),
		attrBatchSize.Int(1), attrBatchOK.Int(1), outcomeOK)
	if a := events(acq, eventAttempt); len(a) != 1 || attrOf(a[0].Attributes, attrOutcome).AsString() != "granted" {
		t.Errorf("attempt events = %v", a)
	}
	if n := len(named(spans, spanAdvisoryLock)); n != 0 {
		t.Errorf("%d advisory_lock spans for a TryLockAdvisory", n)
	}

	rel := one(t, spans, spanRelease)
	udb := one(t, spans, spanAdvisoryUnlock)
	if !childOf(rel, root.SpanContext()) || !linksTo(rel, acq.SpanContext()) || !linksTo(rel, udb.SpanContext()) {
		t.Error("pglease.release: not a child of the caller's span, or not linked to the acquire and its round trip")
	}
	if !childOf(udb, rel.SpanContext()) || udb.SpanKind() != trace.SpanKindClient {
		t.Error("advisory_unlock is not a client child of pglease.release")
	}
	wantAttrs(t, rel, outcomeOK, kindAdvisory, advHash(key))
	wantAttrs(t, udb, dbPostgres, attrBatchSize.Int(1), attrBatchOK.Int(1), outcomeOK)
	if held := attrOf(rel.Attributes(), attrHeldFor).AsFloat64(); held <= 0 {
		t.Errorf("held_for = %v", held)
	}
	if n := len(named(spans, spanLost)); n != 0 {
		t.Errorf("%d pglease.lost spans", n)
	}

	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.lock.held"], kindAdvisory); n != 0 {
		t.Errorf("lock.held{advisory} after Release = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.held"], kindLease); n != 0 {
		t.Errorf("lock.held{lease} = %d", n)
	}
	if n := countOf(t, ms["pglease.acquire.duration"], kindAdvisory, outcomeGrnt); n != 1 {
		t.Errorf("acquire.duration{advisory,granted} count = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.releases"], kindAdvisory, outcomeOK); n != 1 {
		t.Errorf("lock.releases{advisory,ok} = %d", n)
	}
	for _, op := range []string{spanAdvisoryTryLock, spanAdvisoryUnlock} {
		if n := countOf(t, ms["db.client.operation.duration"], dbPostgres, dbOp(op)); n != 1 {
			t.Errorf("db.client.operation.duration{%s} count = %d", op, n)
		}
	}
}

// TestAdvisoryTelemetryContended: another Manager holds the key. A
// TryLockAdvisory ends "locked"; a LockAdvisory shows a contended
// pg_try_advisory_lock round trip, then one pglease.advisory_lock span
// that covers the whole server-side wait (it started before the waiter
// was seen waiting in pg_locks and ended after the holder let go), and
// ends granted after 2 attempts. Both count as contended.
func TestAdvisoryTelemetryContended(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}, noSignals: true})
	peer, _ := b.newPeer(t, Config{})
	admin, _ := pgtest.Pool(t)
	ctx := ctxT(t)
	key := advKey()
	pl, err := peer.LockAdvisory(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.m.TryLockAdvisory(ctx, key); ok || err != nil {
		t.Fatalf("TryLockAdvisory of a held key = %v, %v", ok, err)
	}
	got := make(chan lockResult, 1)
	go func() {
		l, err := b.m.LockAdvisory(ctx, key)
		got <- lockResult{l, err}
	}()
	eventually(t, waitTimeout(), "the waiter waits on the server", func() bool { return waitingFor(t, admin, b.m) })
	seenWaiting := time.Now()
	if n := heldAdvisory(t, rg); n != 0 {
		t.Errorf("lock.held{advisory} while waiting = %d", n)
	}
	beforeUnlock := time.Now()
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var r lockResult
	select {
	case r = <-got:
	case <-time.After(waitTimeout()):
		t.Fatal("the waiter was not granted the key")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if n := heldAdvisory(t, rg); n != 1 {
		t.Errorf("lock.held{advisory} while held = %d, want 1", n)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	spans := rg.spans.Ended()
	acqs := named(spans, spanAcquire)
	if len(acqs) != 2 { // the peer has no telemetry configured here
		t.Fatalf("%d acquire spans, want 2", len(acqs))
	}
	tryAcq, lockAcq := acqs[0], acqs[1]
	if !attrOf(tryAcq.Attributes(), attrTry).AsBool() {
		tryAcq, lockAcq = lockAcq, tryAcq
	}
	wantAttrs(t, tryAcq, advHash(key), kindAdvisory, attrTry.Bool(true),
		attrOutcome.String("locked"), attrAttempts.Int64(1), attrContended.Bool(true))
	if tryAcq.Status().Code != codes.Unset {
		t.Errorf("a locked TryLockAdvisory has status %v", tryAcq.Status())
	}
	wantAttrs(t, lockAcq, advHash(key), kindAdvisory, attrTry.Bool(false), outcomeGrnt,
		attrAttempts.Int64(2), attrContended.Bool(true))
	var outcomes []string
	for _, e := range events(lockAcq, eventAttempt) {
		outcomes = append(outcomes, attrOf(e.Attributes, attrOutcome).AsString())
	}
	if len(outcomes) != 2 || outcomes[0] != "contended" || outcomes[1] != "granted" {
		t.Errorf("LockAdvisory attempt outcomes = %v, want [contended granted]", outcomes)
	}

	var lockTry sdktrace.ReadOnlySpan
	for _, s := range named(spans, spanAdvisoryTryLock) {
		wantAttrs(t, s, attrBatchOK.Int(0), outcomeOK) // both tries found it held
		if childOf(s, lockAcq.SpanContext()) {
			lockTry = s
		}
	}
	if lockTry == nil || !linksTo(lockAcq, lockTry.SpanContext()) {
		t.Fatal("LockAdvisory's try round trip is not its linked child")
	}
	wait := one(t, spans, spanAdvisoryLock)
	if wait.SpanKind() != trace.SpanKindClient || !childOf(wait, lockAcq.SpanContext()) || !linksTo(lockAcq, wait.SpanContext()) {
		t.Error("advisory_lock is not a linked client child of LockAdvisory's acquire span")
	}
	wantAttrs(t, wait, dbPostgres, dbOp(spanAdvisoryLock),
		attrBatchSize.Int(1), attrBatchOK.Int(1), outcomeOK)
	if !wait.StartTime().Before(seenWaiting) || !wait.EndTime().After(beforeUnlock) {
		t.Errorf("advisory_lock span [%v, %v] does not cover the wait (seen waiting %v, holder unlocked after %v)",
			wait.StartTime(), wait.EndTime(), seenWaiting, beforeUnlock)
	}
	if wait.StartTime().Before(lockTry.EndTime()) {
		t.Error("the wait started before the contended try ended")
	}

	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.acquire.contended"], kindAdvisory); n != 2 {
		t.Errorf("acquire.contended{advisory} = %d, want 2", n)
	}
	if n := countOf(t, ms["pglease.acquire.duration"], kindAdvisory, attrOutcome.String("locked")); n != 1 {
		t.Errorf("acquire.duration{advisory,locked} count = %d", n)
	}
	if n := countOf(t, ms["pglease.acquire.attempts"], kindAdvisory, outcomeGrnt); n != 1 {
		t.Errorf("acquire.attempts{advisory,granted} count = %d", n)
	}
	if n := countOf(t, ms["db.client.operation.duration"], dbPostgres, dbOp(spanAdvisoryLock)); n != 1 {
		t.Errorf("db.client.operation.duration{advisory_lock} count = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.held"], kindAdvisory); n != 0 {
		t.Errorf("lock.held{advisory} after Release = %d", n)
	}
}

// TestAdvisoryTelemetryLoss: pg_terminate_backend of the session's
// backend ends both held advisory locks. By the time each lock's Done
// fires, its pglease.lost span (child of its acquire span, cause
// session_ended, status Error LockLost) has been recorded; the held gauge
// is back to 0; Release of a lost lock returns LockLost and records no
// release span.
func TestAdvisoryTelemetryLoss(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}, noSignals: true})
	fastProbe(b.m)
	admin, _ := pgtest.Pool(t)
	ctx := ctxT(t)
	ka, kb := advKey(), advKey()
	la, err := b.m.LockAdvisory(ctx, ka)
	if err != nil {
		t.Fatal(err)
	}
	lb, ok, err := b.m.TryLockAdvisory(ctx, kb)
	if err != nil || !ok {
		t.Fatalf("TryLockAdvisory = %v, %v", ok, err)
	}
	if n := heldAdvisory(t, rg); n != 2 {
		t.Errorf("lock.held{advisory} = %d, want 2", n)
	}
	var terminated bool
	if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", advPID(b.m)).Scan(&terminated); err != nil || !terminated {
		t.Fatalf("pg_terminate_backend = %v, %v", terminated, err)
	}
	for _, l := range []*advisory.Lock{la, lb} {
		waitDone(t, l)
		if !errors.Is(l.Err(), pglease.ErrLockLost) {
			t.Fatalf("cause = %v, want ErrLockLost", l.Err())
		}
	}
	// Recorded before Done fired: no waiting needed.
	spans := rg.spans.Ended()
	losts := named(spans, spanLost)
	if len(losts) != 2 {
		t.Fatalf("%d pglease.lost spans, want 2", len(losts))
	}
	acqs := named(spans, spanAcquire)
	for _, k := range []advisory.Key{ka, kb} {
		var acq, lost sdktrace.ReadOnlySpan
		for _, s := range acqs {
			if attrOf(s.Attributes(), attrKeyHash) == advHash(k).Value {
				acq = s
			}
		}
		for _, s := range losts {
			if attrOf(s.Attributes(), attrKeyHash) == advHash(k).Value {
				lost = s
			}
		}
		if acq == nil || lost == nil {
			t.Fatalf("key %v: acquire span %v, lost span %v", k, acq != nil, lost != nil)
		}
		if !childOf(lost, acq.SpanContext()) {
			t.Errorf("key %v: pglease.lost is not a child of its acquire span", k)
		}
		wantAttrs(t, lost, kindAdvisory, attrLossCause.String("session_ended"),
			attribute.String("error.type", "LockLost"))
		if st := lost.Status(); st.Code != codes.Error || st.Description != "LockLost" {
			t.Errorf("key %v: lost status = %+v", k, st)
		}
		if held := attrOf(lost.Attributes(), attrHeldFor).AsFloat64(); held <= 0 {
			t.Errorf("key %v: held_for = %v", k, held)
		}
	}
	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.lock.held"], kindAdvisory); n != 0 {
		t.Errorf("lock.held{advisory} after the loss = %d", n)
	}
	if n := sumOf(t, ms["pglease.lock.lost"], kindAdvisory, attrLossCause.String("session_ended")); n != 2 {
		t.Errorf("lock.lost{advisory,session_ended} = %d, want 2", n)
	}
	if err := la.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("Release of a lost lock = %v, want ErrLockLost", err)
	}
	if n := len(named(rg.spans.Ended(), spanRelease)); n != 0 {
		t.Errorf("%d release spans for lost locks", n)
	}
	if n := heldAdvisory(t, rg); n != 0 {
		t.Errorf("lock.held{advisory} after Release of a lost lock = %d", n)
	}
}

// TestAdvisoryTelemetryClose: Close releases two held advisory locks with
// the session: a pglease.release span each (outcome ok), both linked to
// one root pglease.advisory_unlock round trip of batch size 2, and the
// held gauge back to 0. A lock unlocked before Close is released once. A
// call after Close records its acquire span, ended "closed".
func TestAdvisoryTelemetryClose(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}, noSignals: true})
	ctx := ctxT(t)
	var locks []*advisory.Lock
	for range 3 {
		l, err := b.m.LockAdvisory(ctx, advKey())
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if err := locks[2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := heldAdvisory(t, rg); n != 2 {
		t.Errorf("lock.held{advisory} = %d, want 2", n)
	}
	if err := b.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range locks[:2] {
		if !errors.Is(l.Err(), pglease.ErrClosed) {
			t.Fatalf("cause after Close = %v", l.Err())
		}
	}
	spans := rg.spans.Ended()
	rels := named(spans, spanRelease)
	if len(rels) != 3 {
		t.Fatalf("%d release spans, want 3 (one Release, two by Close)", len(rels))
	}
	var closeDB sdktrace.ReadOnlySpan
	for _, s := range named(spans, spanAdvisoryUnlock) {
		if attrOf(s.Attributes(), attrBatchSize).AsInt64() == 2 {
			closeDB = s
		}
	}
	if closeDB == nil {
		t.Fatal("no advisory_unlock round trip of batch size 2 for Close")
	}
	if closeDB.Parent().IsValid() {
		t.Error("Close's round trip serving two releases is not a root span")
	}
	wantAttrs(t, closeDB, attrBatchOK.Int(2), outcomeOK)
	linked := 0
	for _, r := range rels {
		wantAttrs(t, r, outcomeOK, kindAdvisory)
		if linksTo(r, closeDB.SpanContext()) {
			linked++
		}
	}
	if linked != 2 {
		t.Errorf("%d release spans linked to Close's round trip, want 2", linked)
	}
	ms := rg.metrics(t)
	if n := sumOf(t, ms["pglease.lock.releases"], kindAdvisory, outcomeOK); n != 3 {
		t.Errorf("lock.releases{advisory,ok} = %d, want 3", n)
	}
	if n := sumOf(t, ms["pglease.lock.held"], kindAdvisory); n != 0 {
		t.Errorf("lock.held{advisory} after Close = %d", n)
	}

	late := advKey()
	if _, _, err := b.m.TryLockAdvisory(ctx, late); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("TryLockAdvisory after Close = %v, want ErrClosed", err)
	}
	var lateAcq sdktrace.ReadOnlySpan
	for _, s := range named(rg.spans.Ended(), spanAcquire) {
		if attrOf(s.Attributes(), attrKeyHash) == advHash(late).Value {
			lateAcq = s
		}
	}
	if lateAcq == nil {
		t.Fatal("no acquire span for a TryLockAdvisory after Close")
	}
	wantAttrs(t, lateAcq, kindAdvisory, attrTry.Bool(true), attrOutcome.String("closed"), attrAttempts.Int64(0))
}
