package election

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

// TestElectionObserveLatency measures how soon followers learn of a new
// leader: three candidates, each in its own Manager (its own pool and
// listener, as in three processes), with the default TTL of 3 s; each
// leader resigns after 1 s (longer than the polling interval of before,
// so that every change is seen), and the time from the new leader's
// grant (the lease's acquired_at) to each other candidate's OnNewLeader
// is recorded. It prints the distribution; it fails only when a follower does not
// learn within the polling bound (TTL/4) plus a generous slack, or when
// a candidate reports its own term as another's.
func TestElectionObserveLatency(t *testing.T) {
	t.Parallel()
	b := setup(t, manager.Config{})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	const ttl = 3 * time.Second
	const terms = 8
	var mu sync.Mutex
	// Each term's grant (the lease's acquired_at: the server's clock,
	// this machine's) and each observation.
	type seen struct {
		id string
		at time.Time
	}
	var grants, observed []seen
	count := 0
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 {
		id := fmt.Sprintf("cand-%d", i)
		m := b.newPeer(t, manager.Config{Config: pg.Config{Holder: id}})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = Run(ctx, m, Config{
				Name: "leader:latency", TTL: ttl,
				OnNewLeader: func(leader string, self bool) {
					now := time.Now()
					if self {
						return
					}
					if leader == id {
						// Its own term, reported as another's (the
						// campaign's grant seen by its own watch).
						t.Errorf("%s: OnNewLeader(%q, false) for its own term", id, leader)
					}
					mu.Lock()
					observed = append(observed, seen{leader, now})
					mu.Unlock()
				},
			}, func(fctx context.Context, term *Term) error {
				mu.Lock()
				grants = append(grants, seen{id, term.Lock().AcquiredAt()})
				mu.Unlock()
				select {
				case <-time.After(time.Second):
				case <-fctx.Done():
				}
				mu.Lock()
				count++
				if count == terms {
					close(done)
				}
				mu.Unlock()
				return nil // resign
			})
		}()
	}
	select {
	case <-done:
	case <-time.After(2 * waitTimeout()):
		t.Fatal("terms stopped coming")
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	// An observation is of its leader's latest grant before it (a
	// follower may learn before the leader's function starts).
	var lat []time.Duration
	for _, o := range observed {
		var g time.Time
		for _, gr := range grants {
			if gr.id == o.id && !gr.at.After(o.at) && gr.at.After(g) {
				g = gr.at
			}
		}
		if !g.IsZero() {
			lat = append(lat, o.at.Sub(g))
		}
	}
	if len(lat) < terms/2 {
		t.Fatalf("only %d observations", len(lat))
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	t.Logf("leader's grant → a follower's OnNewLeader (TTL %v): p50 %v  p90 %v  max %v  (n=%d)",
		ttl, s[len(s)/2].Round(100*time.Microsecond), s[len(s)*9/10].Round(100*time.Microsecond), s[len(s)-1].Round(100*time.Microsecond), len(s))
	if s[len(s)-1] > ttl/4+waitTimeout() {
		t.Errorf("a follower learned of a new leader after %v", s[len(s)-1])
	}
}
