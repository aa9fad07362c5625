package manager

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
)

// TestContendedSpanNamesHolderAndReason: an acquire that finds its key
// held says on its pglease.acquire span who holds the key (the holder
// identity the holder's Manager recorded, as the timeout error does) and
// why it waits: an exclusive holder, readers an exclusive attempt waits
// for, a full semaphore, a writer's mark, a lock delay, or one key of a
// set another key of which is held. The wait is recorded in
// pglease.acquire.wait.duration by that reason.
func TestContendedSpanNamesHolderAndReason(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := ctxT(t)
	other := func(holder string) *Manager {
		t.Helper()
		m, err := New(b.pool, Config{Config: pg.Config{Holder: holder}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close(context.Background()) })
		return m
	}
	ma, mc := other("holder-a[1]@host-a"), other("reader-c[3]@host-c")
	must := func(l *Lock, err error) *Lock {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	try := func(key string, opts ...AcquireOption) {
		t.Helper()
		l, ok, err := b.m.TryAcquire(ctx, key, opts...)
		if err != nil || ok {
			if l != nil {
				_ = l.Release(ctx)
			}
			t.Fatalf("TryAcquire(%s) = %v, %v; want held", key, ok, err)
		}
	}
	// An exclusive holder: a try, and an Acquire that times out.
	must(ma.Acquire(ctx, "wr/excl"))
	try("wr/excl")
	if _, err := b.m.Acquire(ctx, "wr/excl", WithAcquireTimeout(300*time.Millisecond)); pglease.CodeOf(err) != pglease.CodeAcquisitionTimeout {
		t.Fatalf("Acquire of a held key: %v, want AcquisitionTimeout", err)
	}
	// Readers an exclusive attempt waits for.
	must(ma.Acquire(ctx, "wr/readers", Shared()))
	try("wr/readers")
	// A full semaphore.
	must(ma.Acquire(ctx, "wr/sem", WithLimit(1)))
	try("wr/sem", WithLimit(1))
	// A writer's mark: a reader holds the key, a writer waits (and marks
	// it), a new reader is refused for the mark.
	must(ma.Acquire(ctx, "wr/mark", Shared()))
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() { _, _ = mc.Acquire(wctx, "wr/mark") }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, ok, err := b.m.TryAcquire(ctx, "wr/mark", Shared())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		_ = l.Release(ctx)
		if time.Now().After(deadline) {
			t.Fatal("the writer's mark never kept a reader off")
		}
		time.Sleep(20 * time.Millisecond)
	}
	wcancel()
	// A lock delay: the holder's lease expired unreleased, its delay runs.
	lk := must(ma.Acquire(ctx, "wr/delay", WithTTL(200*time.Millisecond), WithoutAutoExtend(), WithLockDelay(20*time.Second)))
	<-lk.Done()
	time.Sleep(1500 * time.Millisecond) // past expiry + the 1 s tolerance
	try("wr/delay")
	// One key of a set: wr/free is free, wr/excl is held.
	if _, ok, err := b.m.TryAcquireAll(ctx, []string{"wr/free", "wr/excl"}); ok || err != nil {
		t.Fatalf("TryAcquireAll = %v, %v; want held", ok, err)
	}

	spans := rg.spans.Ended()
	check := func(key, outcome, reason, holder string) {
		t.Helper()
		var found bool
		for _, s := range named(spans, "pglease.acquire") {
			if attrOf(s.Attributes(), "pglease.key.hash").AsString() != pglease.HashKey(key) ||
				attrOf(s.Attributes(), "pglease.outcome").AsString() != outcome {
				continue
			}
			found = true
			wantAttrs(t, s, attribute.String("pglease.wait.reason", reason))
			if got := attrOf(s.Attributes(), "pglease.holder").AsString(); got != holder {
				t.Errorf("%s (%s): pglease.holder = %q, want %q", key, outcome, got, holder)
			}
			if ev := events(s, "pglease.wait"); len(ev) == 0 {
				t.Errorf("%s (%s): no pglease.wait event", key, outcome)
			}
		}
		if !found {
			t.Errorf("no pglease.acquire span of %s with outcome %s", key, outcome)
		}
	}
	check("wr/excl", "locked", "holder", "holder-a[1]@host-a")
	check("wr/excl", "timeout", "holder", "holder-a[1]@host-a")
	check("wr/readers", "locked", "shared_holders", "holder-a[1]@host-a")
	check("wr/sem", "locked", "semaphore_full", "holder-a[1]@host-a")
	check("wr/mark", "locked", "writer_mark", "")
	check("wr/delay", "locked", "lock_delay", "holder-a[1]@host-a") // the expired holder whose delay runs
	check("wr/free", "locked", "set_member", "")

	// The timed-out Acquire's wait, by reason.
	m, ok := rg.metrics(t)["pglease.acquire.wait.duration"]
	if !ok {
		t.Fatal("pglease.acquire.wait.duration not recorded")
	}
	if countOf(t, m, attribute.String("pglease.wait.reason", "holder"), attribute.String("pglease.lock.kind", "lease")) == 0 {
		t.Errorf("pglease.acquire.wait.duration has no point with pglease.wait.reason=holder: %+v", m.Data)
	}
}

// TestSetFailureLogsOnce: an AcquireAll that fails with an error logs one
// Warn record for the set, not one per key (a role without the privileges
// made one AcquireAll of 100 keys log 100 records).
func TestSetFailureLogsOnce(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := ctxT(t)
	var role string
	if err := b.pool.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := b.admin.Exec(ctx, "REVOKE UPDATE ON syncguard_fence_counters FROM "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.admin.Exec(context.Background(), "GRANT UPDATE ON syncguard_fence_counters TO "+role) })
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = "once/" + string(rune('a'+i))
	}
	_, err := b.m.AcquireAll(ctx, keys, WithAcquireTimeout(5*time.Second))
	if err == nil {
		t.Fatal("AcquireAll without UPDATE on the fence table succeeded")
	}
	var warns int
	for line := range strings.Lines(rg.logs.String()) {
		var rec struct {
			Level, Msg string
			Size       int `json:"set.size"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Level == "WARN" && rec.Msg == "pglease: acquire" {
			warns++
			if rec.Size != len(keys) {
				t.Errorf("the set's record says set.size %d, want %d", rec.Size, len(keys))
			}
		}
	}
	if warns != 1 {
		t.Fatalf("%d Warn records for one failed AcquireAll of %d keys, want 1 (error %v)", warns, len(keys), err)
	}
	for _, s := range named(rg.spans.Ended(), "pglease.acquire") {
		if attrOf(s.Attributes(), "pglease.outcome").AsString() != "error" {
			t.Errorf("a key's span ended %q, want error", attrOf(s.Attributes(), "pglease.outcome").AsString())
		}
	}
}

// TestSetErrorsSayWhatToDo: a key given twice names both of its indexes;
// too many keys names the alternatives.
func TestSetErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	_, err := b.m.AcquireAll(ctx, []string{"a", "b", "c", "b"})
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument || !strings.Contains(err.Error(), "keys[1] and keys[3]") {
		t.Errorf("duplicate key: %v; want InvalidArgument naming keys[1] and keys[3]", err)
	}
	many := make([]string, kernel.MaxSetKeys+1)
	for i := range many {
		many[i] = "k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	_, err = b.m.AcquireAll(ctx, many)
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument || !strings.Contains(err.Error(), "coarser key") ||
		!strings.Contains(err.Error(), "smaller sets") {
		t.Errorf("too many keys: %v; want InvalidArgument saying what to do instead", err)
	}
}

// TestHoldAndWaitGauges: while a lock is held and an acquire waits, the
// gauges name the oldest lock and the longest wait by key hash (never the
// raw key) with their ages; hold times are recorded per lock kind when
// locks are released; the listener gauge is 1 while it listens.
func TestHoldAndWaitGauges(t *testing.T) {
	t.Parallel()
	rg := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: rg.opts}})
	ctx := ctxT(t)
	other, err := New(b.pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	old, err := b.m.Acquire(ctx, "gauge/old-secret-key")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := b.m.Acquire(ctx, "gauge/new"); err != nil {
		t.Fatal(err)
	}
	rd, err := b.m.Acquire(ctx, "gauge/read", Shared())
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.Acquire(ctx, "gauge/busy-secret-key")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := b.m.Acquire(wctx, "gauge/busy-secret-key")
		waited <- err
	}()
	type point struct {
		v     float64
		attrs map[string]string
	}
	gauge := func(name string) (point, bool) {
		m, ok := rg.metrics(t)[name]
		if !ok {
			return point{}, false
		}
		g, ok := m.Data.(metricdata.Gauge[float64])
		if !ok || len(g.DataPoints) != 1 {
			t.Fatalf("%s: %T with %d points, want one float64 gauge point", name, m.Data, len(g.DataPoints))
		}
		p := point{v: g.DataPoints[0].Value, attrs: map[string]string{}}
		for _, kv := range g.DataPoints[0].Attributes.ToSlice() {
			p.attrs[string(kv.Key)] = kv.Value.String()
			if strings.Contains(kv.Value.String(), "secret-key") {
				t.Fatalf("%s carries a raw key: %v", name, kv)
			}
		}
		return p, true
	}
	deadline := time.Now().Add(20 * time.Second)
	var wp point
	for {
		if p, ok := gauge("pglease.acquire.wait.longest"); ok && p.v > 0.1 {
			wp = p
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pglease.acquire.wait.longest never showed the waiting acquire")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if wp.attrs["pglease.key.hash"] != pglease.HashKey("gauge/busy-secret-key") || wp.attrs["pglease.wait.reason"] != "holder" ||
		wp.attrs["pglease.lock.kind"] != "lease" {
		t.Errorf("pglease.acquire.wait.longest: %+v; want the busy key's hash, reason holder, kind lease", wp)
	}
	op, ok := gauge("pglease.lock.oldest.age")
	if !ok || op.v < 0.2 || op.attrs["pglease.key.hash"] != pglease.HashKey("gauge/old-secret-key") {
		t.Errorf("pglease.lock.oldest.age: %+v (reported %v); want ≥ 0.2 s for the oldest key's hash", op, ok)
	}
	if m, ok := rg.metrics(t)["pglease.listener.up"]; !ok || m.Data.(metricdata.Gauge[int64]).DataPoints[0].Value != 1 {
		t.Errorf("pglease.listener.up: %+v (reported %v), want 1", m.Data, ok)
	}
	wcancel()
	<-waited
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rd.Release(ctx); err != nil {
		t.Fatal(err)
	}
	m, ok := rg.metrics(t)["pglease.lock.hold.duration"]
	if !ok {
		t.Fatal("pglease.lock.hold.duration not recorded")
	}
	if countOf(t, m, attribute.String("pglease.lock.kind", "lease")) < 1 || countOf(t, m, attribute.String("pglease.lock.kind", "shared")) != 1 {
		t.Errorf("pglease.lock.hold.duration: want a lease and a shared hold recorded: %+v", m.Data)
	}
	// The oldest lock now is gauge/new, granted after gauge/old.
	if p, ok := gauge("pglease.lock.oldest.age"); !ok || p.attrs["pglease.key.hash"] != pglease.HashKey("gauge/new") {
		t.Errorf("after releasing the oldest: %+v (reported %v); want gauge/new's hash", p, ok)
	}
	if _, ok := gauge("pglease.acquire.wait.longest"); ok {
		t.Error("pglease.acquire.wait.longest still reports a wait after it ended")
	}
}

// TestTryRefusedByQueueSaysQueued: with the fair queue, a try refused
// because other callers' tickets go first (nothing holds the key: the
// set at the head of its line waits for its other key) says so on its
// span, pglease.wait.reason "queued", for an exclusive try and a reader's.
// It was labelled as a lock delay (exclusive) or a writer's mark (reader)
// before: the answer names no holder, expiry or retry time.
func TestTryRefusedByQueueSaysQueued(t *testing.T) {
	rg := newRig(t)
	b, ms, _ := fairManagers(t, 2, true)
	tm, tsig := b.newPeer(t, Config{FairQueue: true, Telemetry: rg.opts})
	wait(t, &tsig.Listening)
	ctx := ctxT(t)
	const key, key2 = "wr/queued/a", "wr/queued/b"
	done := setTurn(t, b, ms[0], ms[1], key, key2)
	for _, opts := range [][]AcquireOption{nil, {Shared()}} {
		if lk, ok, err := tm.TryAcquire(ctx, key, opts...); err != nil || ok {
			if lk != nil {
				_ = lk.Release(ctx)
			}
			t.Fatalf("TryAcquire(%v) = %v, %v; want refused for the set's ticket", opts, ok, err)
		}
	}
	n := 0
	for _, s := range named(rg.spans.Ended(), "pglease.acquire") {
		if attrOf(s.Attributes(), "pglease.key.hash").AsString() != pglease.HashKey(key) {
			continue
		}
		n++
		wantAttrs(t, s, attribute.String("pglease.outcome", "locked"), attribute.String("pglease.wait.reason", "queued"))
	}
	if n != 2 {
		t.Errorf("%d pglease.acquire spans of the key, want the 2 tries'", n)
	}
	done()
}
