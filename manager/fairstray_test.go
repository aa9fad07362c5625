package manager

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest/pgrec"
)

// TestFairHotKeyNoStrayGrants: callers of one Manager with the fair queue
// take a hot key in turn. An attempt in flight when its waiter's grant
// came (by a turn) and was released must not queue that lockId again:
// the next release would grant it for nobody, and the Manager would
// release that stray grant too — two releases of one lockId, a wasted
// handoff. Attempts after a ticket's first answer only refresh it, so no
// lockId is released twice. Before, about one section in two made a
// stray (699 lockIds released twice in 1,271 sections, 1.48 releases per
// section); the bound here is 1 % (or one).
func TestFairHotKeyNoStrayGrants(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	released := map[string]int{}
	twice, releases := 0, 0
	rec := &pgrec.Recorder{OnStart: func(st pgrec.Statement) {
		if !strings.Contains(st.SQL, "pglease_qrelease") || len(st.Args) == 0 {
			return
		}
		ids, ok := st.Args[0].([]string)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		releases++
		for _, id := range ids {
			if released[id]++; released[id] == 2 {
				twice++
			}
		}
	}}
	b := setup(t, setupOpts{cfg: Config{FairQueue: true},
		pool: []func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = rec }}})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	var sections int
	var smu sync.Mutex
	deadline := time.Now().Add(2 * time.Second)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				lk, err := b.m.Acquire(ctx, "fair:hot")
				if err != nil {
					t.Error(err)
					return
				}
				if err := lk.Release(ctx); err != nil {
					t.Error(err)
					return
				}
				smu.Lock()
				sections++
				smu.Unlock()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d sections, %d release statements, %d lockIds released twice", sections, releases, twice)
	if sections < 20 {
		t.Fatalf("only %d sections in 2 s", sections)
	}
	// A loaded machine may hedge a first attempt, which still queues: one
	// stray, or 1 %, is allowed.
	if twice > max(1, sections/100) {
		t.Errorf("%d lockIds released twice in %d sections (stray grants), want at most 1 %% (or one)", twice, sections)
	}
}
