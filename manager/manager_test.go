package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/retry"
)

func TestAcquireReleaseBasics(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "cafe\u0301") // NFC: same lock as "café"
	if err != nil {
		t.Fatal(err)
	}
	if lk.Key() != "café" || lk.Fence() <= 0 || lk.TTL() != kernel.DefaultTTL || lk.Err() != nil {
		t.Fatalf("lock = key %q fence %v ttl %v err %v", lk.Key(), lk.Fence(), lk.TTL(), lk.Err())
	}
	if id, ok := lockRow(t, b.pool, "café"); !ok || id != lk.hd.ID {
		t.Fatalf("lock row missing or not ours")
	}
	_, ok, err := b.m.TryAcquire(ctx, "café")
	if err != nil || ok {
		t.Fatalf("TryAcquire of a held key: ok=%v err=%v", ok, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(lk.Context()), pglease.ErrReleased) {
		t.Fatalf("cause after release = %v", context.Cause(lk.Context()))
	}
	select {
	case <-lk.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if _, ok := lockRow(t, b.pool, "café"); ok {
		t.Fatal("row still live after Release")
	}
	lk2, ok, err := b.m.TryAcquire(ctx, "café")
	if err != nil || !ok {
		t.Fatalf("TryAcquire of a free key: ok=%v err=%v", ok, err)
	}
	if lk2.Fence() <= lk.Fence() {
		t.Fatalf("fence did not grow: %v then %v", lk.Fence(), lk2.Fence())
	}
	if err := lk2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDo(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	ran := false
	err := b.m.Do(ctx, "job:42", func(ctx context.Context, lk *Lock) error {
		ran = true
		if id, ok := lockRow(t, b.pool, "job:42"); !ok || id != lk.hd.ID {
			t.Error("not locked inside Do, or not by the Lock fn got")
		}
		if lk.Fence() <= 0 || lk.Key() != "job:42" || lk.Err() != nil {
			t.Errorf("fn's lock: fence %v key %q err %v", lk.Fence(), lk.Key(), lk.Err())
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do: ran=%v err=%v", ran, err)
	}
	if _, ok := lockRow(t, b.pool, "job:42"); ok {
		t.Fatal("still locked after Do")
	}
	boom := errors.New("boom")
	if err := b.m.Do(ctx, "job:42", func(context.Context, *Lock) error { return boom }); err != boom {
		t.Fatalf("Do error = %v", err)
	}
	if err := b.m.Do(ctx, "job:42", nil); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("nil fn: %v", err)
	}
}

// TestLocalHandoffFIFO: waiters of one key in this process are served in
// arrival order, each through the database with a new lockId and a
// higher fence.
func TestLocalHandoffFIFO(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	first, err := b.m.Acquire(ctx, "fifo")
	if err != nil {
		t.Fatal(err)
	}
	wait(t, &b.sig.Queued)
	wait(t, &b.sig.Granted)
	const n = 5
	got := make(chan int, n)
	locks := make(chan *Lock, n)
	for i := range n {
		go func() {
			lk, err := b.m.Acquire(ctx, "fifo", WithAcquireTimeout(time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			got <- i
			locks <- lk
		}()
		// Wait until waiter i is queued before starting i+1 (order).
		wait(t, &b.sig.Queued)
	}
	prev := first
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for want := range n {
		if i := <-got; i != want {
			t.Fatalf("served waiter %d, want %d", i, want)
		}
		lk := <-locks
		if lk.Fence() <= prev.Fence() || lk.hd.ID == prev.hd.ID {
			t.Fatalf("handoff reused fence or lockId")
		}
		prev = lk
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadInputNoIO(t *testing.T) {
	t.Parallel()
	qc, qn := queryCounter("", "")
	b := setup(t, setupOpts{pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc }}})
	ctx := ctxT(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	before := qn.Load()
	//nolint:staticcheck // nil context on purpose
	var nilCtx context.Context
	cases := []struct {
		name string
		err  error
		want *pglease.Error
	}{
		{"nil ctx", func() error { _, err := b.m.Acquire(nilCtx, "k"); return err }(), pglease.ErrInvalidArgument},
		{"cancelled ctx", func() error { _, err := b.m.Acquire(cancelled, "k"); return err }(), pglease.ErrAborted},
		{"empty key", func() error { _, err := b.m.Acquire(ctx, ""); return err }(), pglease.ErrInvalidArgument},
		{"bad utf8", func() error { _, err := b.m.Acquire(ctx, "\xff\xfe"); return err }(), pglease.ErrInvalidArgument},
		{"nul", func() error { _, _, err := b.m.TryAcquire(ctx, "a\x00b"); return err }(), pglease.ErrInvalidArgument},
		{"513 bytes", func() error { _, err := b.m.Acquire(ctx, strings.Repeat("x", 513)); return err }(), pglease.ErrInvalidArgument},
		{"ttl 0", func() error { _, err := b.m.Acquire(ctx, "k", WithTTL(0)); return err }(), pglease.ErrInvalidArgument},
		{"ttl 1.5ms", func() error { _, err := b.m.Acquire(ctx, "k", WithTTL(1500*time.Microsecond)); return err }(), pglease.ErrInvalidArgument},
		{"ttl below floor", func() error { _, err := b.m.Acquire(ctx, "k", WithTTL(299*time.Millisecond)); return err }(), pglease.ErrInvalidArgument},
		// 11 ms − the 10 ms margin leaves 1 ms for the round trip.
		{"manual ttl 11ms", func() error {
			_, err := b.m.Acquire(ctx, "k", WithTTL(11*time.Millisecond), WithoutAutoExtend())
			return err
		}(), pglease.ErrInvalidArgument},
		{"manual ttl 19ms", func() error {
			_, _, err := b.m.TryAcquire(ctx, "k", WithTTL(19*time.Millisecond), WithoutAutoExtend())
			return err
		}(), pglease.ErrInvalidArgument},
		{"timeout 0", func() error { _, err := b.m.Acquire(ctx, "k", WithAcquireTimeout(0)); return err }(), pglease.ErrInvalidArgument},
		{"nil option", func() error { _, err := b.m.Acquire(ctx, "k", nil); return err }(), pglease.ErrInvalidArgument},
		{"release nil ctx", func() error { return (&Lock{&kernel.Hold{M: b.m.k}}).Release(nilCtx) }(), pglease.ErrInvalidArgument},
		{"close nil ctx", b.m.Close(nilCtx), pglease.ErrInvalidArgument},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: err = %v, want code %v", c.name, c.err, c.want.Code)
		}
		if c.err != nil && strings.Contains(c.err.Error(), "\xff") {
			t.Errorf("%s: error echoes the key", c.name)
		}
	}
	if n := qn.Load() - before; n != 0 {
		t.Errorf("%d queries for bad input", n)
	}
	// A short single-shot lease (below the 300 ms auto-extend floor) is fine
	// without auto-extend. Not 50 ms: under CPU load its grant can come back
	// after its 40 ms trust window, every time until the wait ends.
	lk, err := b.m.Acquire(ctx, "short", WithTTL(250*time.Millisecond), WithoutAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	<-lk.Done() // declared lost at ~225 ms: never extended
	if !errors.Is(lk.Err(), pglease.ErrLockLost) {
		t.Fatalf("manual lock cause = %v", lk.Err())
	}
	if err := lk.Release(ctx); !errors.Is(err, pglease.ErrLockLost) {
		t.Fatalf("release of a lost lock = %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/x")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, cfg := range []Config{
		{TTL: 100 * time.Millisecond},
		{TTL: -1},
		{TTL: 1500 * time.Microsecond},
		{AcquireTimeout: -1},
		{AcquireTimeout: -time.Second},
		{LossMargin: -1},
		{TTL: time.Second, LossMargin: 700 * time.Millisecond},
		{StatementTimeout: -1},
		{CloseTimeout: -1},
		{MaxBatch: -1},
		{MaxBatch: 1 << 30},
		{MaxInFlight: -1},
		{Retry: retry.Policy{Base: -1}},
		{Retry: retry.Policy{Multiplier: 0.5}},
		{Retry: retry.Policy{Jitter: retry.NoJitter + 1}},
		{Retry: retry.Policy{Base: time.Second, MaxDelay: time.Millisecond}},
		{Config: pg.Config{LockTable: "locks; DROP TABLE x"}},
		{Config: pg.Config{LockTable: "same", FenceTable: "same"}},
		{Config: pg.Config{NotifyChannel: "bad channel"}},
		// 61 bytes: its wake channels ("." and two hex digits) would not
		// fit PostgreSQL's 63.
		{Config: pg.Config{NotifyChannel: strings.Repeat("c", 61)}},
	} {
		if _, err := New(pool, cfg); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%+v: err = %v", cfg, err)
		}
	}
	// 60 bytes is the longest channel name.
	if m, err := New(pool, Config{Config: pg.Config{NotifyChannel: strings.Repeat("c", 60)}, DisableNotify: true}); err != nil {
		t.Errorf("a 60-byte channel: %v", err)
	} else {
		_ = m.Close(context.Background())
	}
	if _, err := New(nil, Config{}); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("nil pool: %v", err)
	}
	if _, err := Open(context.Background(), "::not a url::", Config{}); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("bad url: %v", err)
	}
}

// TestLockRedaction: the lockId never appears in any printed form.
func TestLockRedaction(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "secret-key")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	// encoding/json sees no exported field: a field added to Lock would
	// show here, and must be checked for secrets before this changes.
	js, err := json.Marshal(struct {
		P *Lock
		V Lock
		S []*Lock
	}{lk, *lk, []*Lock{lk}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"P":{},"V":{},"S":[{}]}`; string(js) != want {
		t.Fatalf("json.Marshal = %s, want %s", js, want)
	}
	// %#v goes through Format: the redacted form, not the struct's fields.
	if got, want := fmt.Sprintf("%#v", lk), lk.String(); got != want {
		t.Fatalf("%%#v = %q, want %q", got, want)
	}
	var logBuf strings.Builder
	slog.New(slog.NewTextHandler(&logBuf, nil)).Info("held", "lock", lk)
	slog.New(slog.NewJSONHandler(&logBuf, nil)).Info("held", "lock", lk)
	out := fmt.Sprintf("%v %+v %#v %s %q %x", lk, lk, lk, lk, lk, lk) + fmt.Sprint(lk) + string(js) + logBuf.String() +
		fmt.Sprintf("%+v %#v", *lk, []*Lock{lk})
	for _, secret := range []string{lk.hd.ID, "secret-key"} {
		if strings.Contains(out, secret) {
			t.Fatalf("printed forms contain a secret: %s", out)
		}
	}
	if !strings.Contains(out, "[redacted]") || !strings.Contains(out, lk.Fence().String()) {
		t.Fatalf("unexpected printed form: %s", out)
	}
}

func TestClosedManager(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(lk.Context()), pglease.ErrClosed) {
		t.Fatalf("cause after Close = %v", context.Cause(lk.Context()))
	}
	if n := countLocks(t, b.pool); n != 0 {
		t.Fatalf("%d locks left after Close", n)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release after Close = %v", err)
	}
	if _, err := b.m.Acquire(ctx, "k"); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("Acquire after Close = %v", err)
	}
	if _, _, err := b.m.TryAcquire(ctx, "k"); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v", err)
	}
	if err := b.m.Close(ctx); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	select {
	case <-b.m.Done():
	default:
		t.Fatal("Done not closed")
	}
}

// TestLocalHandoffOneStatement: when the holder releases a key that other
// callers of this process wait for, one statement releases it and grants
// it to the head waiter (a handoff batch; no release or acquire batch in
// between), with the next fence and a new lockId; the releaser's Release
// reports success, and the old lockId is gone from the table.
func TestLocalHandoffOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	first, err := b.m.Acquire(ctx, "handoff")
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan *Lock, 1)
	go func() {
		lk, err := b.m.Acquire(ctx, "handoff", WithAcquireTimeout(time.Minute))
		if err != nil {
			t.Error(err)
		}
		next <- lk
	}()
	// Queued twice: the first caller, then the waiter (the holder is local,
	// so the waiter sends no attempt of its own).
	waitFor(t, &b.sig.Queued, func(k string) bool { return k == "handoff" })
	waitFor(t, &b.sig.Queued, func(k string) bool { return k == "handoff" })
	drain(&b.sig.BatchSent)
	if err := first.Release(ctx); err != nil {
		t.Fatalf("Release of a handed-off lock: %v", err)
	}
	lk := <-next
	if lk == nil {
		t.Fatal("no lock")
	}
	if lk.Fence() != first.Fence()+1 || lk.hd.ID == first.hd.ID {
		t.Fatalf("handoff fence %s (want %s), same lockId %v", lk.Fence(), first.Fence()+1, lk.hd.ID == first.hd.ID)
	}
	kinds := map[kernel.BatchKind]int{}
	for {
		select {
		case bi := <-b.sig.BatchSent.Ch:
			kinds[bi.Kind]++
			continue
		default:
		}
		break
	}
	if kinds[kernel.KindHandOff] != 1 || kinds[kernel.KindRelease] != 0 || kinds[kernel.KindAcquire] != 0 {
		t.Fatalf("batches from release to grant: %v, want one handoff", kinds)
	}
	var n int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM syncguard_locks WHERE lock_id = $1", first.hd.ID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("old lockId rows: %d, %v", n, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLocalHandoffBounded: a key is handed over inside the process at most
// maxLocalHandOffs times in a row; the next release is a plain one (it
// notifies, so other processes' waiters get their chance), and the next
// waiter then acquires with an attempt of its own.
func TestLocalHandoffBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	first, err := b.m.Acquire(ctx, "bounded")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, &b.sig.Queued, func(k string) bool { return k == "bounded" })
	const n = kernel.MaxLocalHandOffs + 2
	done := make(chan error, n)
	for range n {
		go func() {
			lk, err := b.m.Acquire(ctx, "bounded", WithAcquireTimeout(time.Minute))
			if err == nil {
				err = lk.Release(ctx)
			}
			done <- err
		}()
		waitFor(t, &b.sig.Queued, func(k string) bool { return k == "bounded" })
	}
	drain(&b.sig.BatchSent)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// first → w1 … w3 → w4: maxLocalHandOffs handoffs; w4 releases plainly
	// and w5 acquires; w5 → w6 is a handoff; w6 releases plainly.
	kinds := map[kernel.BatchKind]int{}
	for {
		select {
		case bi := <-b.sig.BatchSent.Ch:
			kinds[bi.Kind]++
			continue
		default:
		}
		break
	}
	if kinds[kernel.KindHandOff] != kernel.MaxLocalHandOffs+1 || kinds[kernel.KindRelease] != 2 || kinds[kernel.KindAcquire] != 1 {
		t.Fatalf("batches %v, want %d handoffs, 2 releases, 1 acquire", kinds, kernel.MaxLocalHandOffs+1)
	}
}
