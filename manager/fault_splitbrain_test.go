package manager

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// Split brain: the standby is promoted while the old primary keeps
// running, writable, and some clients still reach it. A lock is a row in
// one database: two databases that both accept writes are two lock
// services, and no lock on either can exclude a holder on the other.

// splitGuards are a resource in the package's own database (so it sees
// the writes of both sides) behind a plain FenceGuard and one made
// WithGrantColumn.
type splitGuards struct {
	res          *pgxpool.Pool
	plain, grant *pg.FenceGuard
}

func newSplitGuards(t *testing.T, ctx context.Context) *splitGuards {
	t.Helper()
	res, _ := pgtest.Pool(t)
	if _, err := res.Exec(ctx, `CREATE TABLE sb_plain (k text PRIMARY KEY, fence bigint, v int);
		CREATE TABLE sb_granted (k text PRIMARY KEY, fence bigint, fence_grant text, v int)`); err != nil {
		t.Fatal(err)
	}
	plain, err := pg.NewFenceGuard("sb_plain", "k", "fence")
	if err != nil {
		t.Fatal(err)
	}
	gg, err := pg.NewFenceGuard("sb_granted", "k", "fence")
	if err == nil {
		gg, err = gg.WithGrantColumn("fence_grant")
	}
	if err != nil {
		t.Fatal(err)
	}
	return &splitGuards{res: res, plain: plain, grant: gg}
}

// write writes under lk through both guards: plainOK is the plain
// guard's answer, grantErr the grant guard's refusal (nil: accepted).
func (g *splitGuards) write(t *testing.T, ctx context.Context, lk *Lock, v int) (plainOK bool, grantErr error) {
	t.Helper()
	ok, err := g.plain.Upsert(ctx, g.res, lk.Key(), lk.Fence(), pg.Set{Column: "v", Value: v})
	if err != nil {
		t.Fatal(err)
	}
	ok2, err := g.grant.Upsert(ctx, g.res, lk.Key(), lk.Fence(), pg.Set{Column: "fence_grant", Value: lk.GrantID()}, pg.Set{Column: "v", Value: v})
	if err == nil && !ok2 {
		err = errors.New("refused (older fence)")
	}
	return ok, err
}

// splitSides returns Managers on node 0 alone (a client that still
// reaches the old primary) and, once promoted, node 1 alone.
func splitManager(t *testing.T, r *pgtest.Replicated, node int, cfg Config) *Manager {
	t.Helper()
	return faultManager(t, serverPool(t, r.NodeURL(node, ""), 4), cfg)
}

// TestSplitBrainAsync: with an asynchronous standby promoted while the old
// primary stays writable, each side grants the same key to its own client
// at the same time, with the same fence (both counters continue from the
// promotion's). A plain FenceGuard accepts both holders' writes (an equal
// fence passes); a guard made WithGrantColumn refuses the second grant of
// a fence (pg.ErrFenceRepeated) but then accepts the next fence from
// either side, so the two holders' writes interleave: no guard restores
// exclusivity. A holder on the old side keeps extending its lease there
// and trusts it while the key is granted on the new side. A process that
// moves from the old side to the new one (multi-host, the old server
// stopped) refuses the new side's fence when it is not above the one the
// old side gave it (FenceRegression). The negative control: before the
// promotion, the check that finds two holders finds none (the second
// process is refused).
func TestSplitBrainAsync(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{})
	ctx := harnessCtx(t)
	cfg := Config{TTL: 2 * time.Second, StatementTimeout: 2 * time.Second}
	oldA := splitManager(t, r, 0, cfg)
	if err := oldA.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	oldC := splitManager(t, r, 0, cfg)
	// The multi-host process: on node 0 first (listed first, writable).
	mover, _ := failoverManager(t, r.URL("", "connect_timeout=2"), cfg, kernel.TestHooks{})
	g := newSplitGuards(t, ctx)

	// The control: one server, one holder.
	held, err := oldA.Acquire(ctx, "sb:held")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := oldC.TryAcquire(ctx, "sb:held"); ok || err != nil {
		t.Fatalf("second process on the same server: granted %v, %v; want refused (the control: no two holders on one server)", ok, err)
	}
	for _, key := range []string{"sb:k", "sb:moved"} {
		lk, err := oldA.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.WaitReplayed(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}

	// The split: node 1 promoted, node 0 still up and writable.
	if err := r.Promote(ctx, 1); err != nil {
		t.Fatal(err)
	}
	newB := splitManager(t, r, 1, cfg)
	a, err := oldA.Acquire(ctx, "sb:k")
	if err != nil {
		t.Fatal(err)
	}
	b, err := newB.Acquire(ctx, "sb:k")
	if err != nil {
		t.Fatalf("the new primary refused a key the old one granted: %v; this test shows both granting", err)
	}
	if a.Err() != nil || b.Err() != nil {
		t.Fatalf("holders not both trusting: %v, %v", a.Err(), b.Err())
	}
	if a.Fence() != b.Fence() {
		t.Fatalf("fences %d (old side) and %d (new side); both counters continue from the promotion's, so they are equal", a.Fence(), b.Fence())
	}
	pa, ga := g.write(t, ctx, a, 1)
	pb, gb := g.write(t, ctx, b, 2)
	if !pa || !pb {
		t.Errorf("plain guard: old side %v, new side %v; both accepted (equal fences pass)", pa, pb)
	}
	if ga != nil || !errors.Is(gb, pg.ErrFenceRepeated) {
		t.Errorf("grant guard: old side %v, new side %v; want the first accepted, the repeat refused", ga, gb)
	}
	t.Logf("split brain: key granted on both sides with fence %d; plain guard accepted both writes, grant guard refused the second", a.Fence())
	// The next grant on either side has a higher fence and passes both
	// guards: the writes of two holders interleave.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a2, err := oldA.Acquire(ctx, "sb:k")
	if err != nil {
		t.Fatal(err)
	}
	if p, gerr := g.write(t, ctx, a2, 3); !p || gerr != nil {
		t.Errorf("old side's next fence %d: plain %v, grant guard %v; want both accepted", a2.Fence(), p, gerr)
	}
	if err := a2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A lease held across the split: extended on the old side, and the
	// key granted on the new side once the lease expires there.
	t0 := time.Now()
	nb, err := newB.Acquire(ctx, "sb:held", WithAcquireTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if held.Err() != nil {
		t.Fatalf("old side's holder: %v; it extends on the old primary and keeps trusting", held.Err())
	}
	t.Logf("lease held on the old side: granted again on the new side %v later, while its holder still trusts it (fences %d, %d)",
		time.Since(t0).Round(time.Millisecond), held.Fence(), nb.Fence())
	if err := nb.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A process that moves from one side to the other.
	m1, err := mover.Acquire(ctx, "sb:moved")
	if err != nil {
		t.Fatal(err)
	}
	if err := m1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Crash(0); err != nil { // the operator stops the old primary
		t.Fatal(err)
	}
	var pe *pglease.Error
	for {
		_, err = mover.Acquire(ctx, "sb:moved", WithAcquireTimeout(20*time.Second))
		if !errors.As(err, &pe) || pe.Code != pglease.CodeServiceUnavailable {
			break // its pool's connections to the stopped server fail first
		}
	}
	if pe == nil || pe.Code != pglease.CodeFenceRegression {
		t.Fatalf("process that saw fence %d on the old side, then asked the new side (which never saw it): %v, want CodeFenceRegression",
			m1.Fence(), err)
	}
	t.Logf("process moved from the old side (fence %d) to the new one: %v", m1.Fence(), pe.Code)
}

// TestSplitBrainSync: with a synchronous standby promoted while the old
// primary stays up, the old primary cannot acknowledge a commit (it waits
// for a standby that no longer streams from it): a client still on it is
// granted nothing (typed errors), and its held lease ends with ErrLockLost
// within the trust window, before the new side may grant the key. Its
// commits are not all lost, though: a commit whose wait its client's
// statement timeout cancelled (pgconn sends a cancel request as it
// closes the connection) lands on the old server alone, with a fence the
// new side issues again. The negative control: before the promotion, the
// same client is granted (the check that finds "nothing granted" is not
// vacuous).
func TestSplitBrainSync(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	ctx := harnessCtx(t)
	cfg := Config{TTL: 2 * time.Second, StatementTimeout: time.Second}
	oldA := splitManager(t, r, 0, cfg)
	if err := oldA.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	// The control: granted before the split.
	held, err := oldA.Acquire(ctx, "sb:held")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReplayed(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Promote(ctx, 1); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	newB := splitManager(t, r, 1, cfg)
	toldAt := make(chan time.Time, 1)
	go func() {
		select {
		case <-held.Done():
			toldAt <- time.Now()
		case <-time.After(4 * cfg.TTL):
			toldAt <- time.Time{}
		}
	}()

	// The old side grants nothing.
	var codes []pglease.Code
	for i := range 3 {
		_, err := oldA.Acquire(ctx, "sb:k", WithAcquireTimeout(2*time.Second))
		if err == nil {
			t.Fatalf("old primary (synchronous standby gone) granted attempt %d", i)
		}
		codes = append(codes, pglease.CodeOf(err))
	}
	at := <-toldAt
	if at.IsZero() {
		t.Fatal("holder on the old side still trusts its lease 4 TTLs after the split")
	}
	told := at.Sub(promoted)
	nb, err := newB.Acquire(ctx, "sb:held", WithAcquireTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if nb.AcquiredAt().Before(held.ExpiresAt()) {
		t.Errorf("new side granted the key at %v, before the old holder's lease expired (%v)", nb.AcquiredAt(), held.ExpiresAt())
	}
	t.Logf("old side: acquires failed %v; its holder told lost %v after the split (%v), the new side granted the key %v after",
		codes, told.Round(time.Millisecond), held.Err(), time.Since(promoted).Round(time.Millisecond))

	// The commits that waited and were cancelled landed on the old side.
	var oldFence, newFence int64
	p0 := serverPool(t, r.NodeURL(0, ""), 2)
	p1 := serverPool(t, r.NodeURL(1, ""), 2)
	if err := p0.QueryRow(ctx, `SELECT coalesce(max(fence), 0) FROM syncguard_fence_counters WHERE key_debug = 'sb:k'`).Scan(&oldFence); err != nil {
		t.Fatal(err)
	}
	if err := p1.QueryRow(ctx, `SELECT coalesce(max(fence), 0) FROM syncguard_fence_counters WHERE key_debug = 'sb:k'`).Scan(&newFence); err != nil {
		t.Fatal(err)
	}
	t.Logf("fences of sb:k committed on the old side alone (by cancelled commit waits, granted to no caller): %d; on the new side: %d", oldFence, newFence)
}
