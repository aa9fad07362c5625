package model_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/internal/store/model"
)

// TestInvariants drives the model with seeded random calls of every
// method that changes it, the clock moving between them, and checks
// after every call what the lease store promises: at most one live
// exclusive holder of a key and never together with shared holds, never
// more permits than the smallest live limit, sets granted whole or not at
// all, fences strictly increasing per key across exclusive grants and
// permits, and the lookup agreeing with the snapshot. A failing seed is
// printed, and replays.
func TestInvariants(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runInvariants(t, seed, 1500)
		})
	}
}

func runInvariants(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 0x706c))
	c := &clock{now: time.UnixMilli(1_700_000_000_000)}
	base, err := model.New(model.Config{Clock: c.Now, Holder: "p0", NotifyChannel: "ch", Notify: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	procs := []*model.Store{base, base.WithHolder("p1"), base.WithHolder("p2")}
	keyNames := []string{"a", "b", "c", "d"}
	ctx := context.Background()
	type held struct{ key, id string }
	var holds []held
	lastFence := map[string]pglease.Fence{}
	grant := func(step int, key string, r store.AcquireResult, counts bool) {
		if !r.OK {
			return
		}
		holds = append(holds, held{key, r.LockID})
		if !counts {
			return
		}
		if r.Fence <= lastFence[key] {
			t.Fatalf("seed %d step %d: key %s granted fence %v after %v", seed, step, key, r.Fence, lastFence[key])
		}
		lastFence[key] = r.Fence
	}
	pick := func() held { return holds[rng.IntN(len(holds))] }
	ttl := func() time.Duration { return time.Duration(50+rng.IntN(3000)) * time.Millisecond }
	for step := 0; step < steps; step++ {
		s := procs[rng.IntN(len(procs))]
		key := keyNames[rng.IntN(len(keyNames))]
		switch op := rng.IntN(10); {
		case op == 0:
			c.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		case op == 1 || op == 2:
			var d time.Duration
			if rng.IntN(4) == 0 {
				d = time.Duration(rng.IntN(4000)) * time.Millisecond
			}
			res, err := s.AcquireMany(ctx, []store.AcquireRequest{{Key: key, TTL: ttl(), LockDelay: d}})
			must(t, err)
			grant(step, key, res[0], true)
		case op == 3:
			lim := rng.IntN(4) // 0: a reader
			res, err := s.AcquireSharedMany(ctx, []store.SharedRequest{{Key: key, TTL: ttl(), Limit: lim}})
			must(t, err)
			grant(step, key, res[0], lim > 0)
		case op == 4 && len(holds) > 0:
			h := pick()
			_, err := s.ReleaseWaited(ctx, []store.ReleaseRequest{{LockID: h.id, Key: h.key}})
			must(t, err)
		case op == 5 && len(holds) > 0:
			_, err := s.ExtendMany(ctx, []store.ExtendRequest{{LockID: pick().id, TTL: ttl()}})
			must(t, err)
		case op == 6:
			var d time.Duration
			if rng.IntN(3) == 0 {
				d = time.Duration(rng.IntN(3000)) * time.Millisecond
			}
			_, err := s.Revoke(ctx, []store.RevokeRequest{{Key: key, Delay: d}})
			must(t, err)
		case op == 7 && len(holds) > 0:
			h := pick()
			res, err := s.HandOff(ctx, []store.HandOffRequest{{Old: h.id, Key: h.key, TTL: ttl()}})
			must(t, err)
			grant(step, h.key, res[0].AcquireResult, true)
		case op == 8:
			other := keyNames[(rng.IntN(len(keyNames)-1)+1+indexOf(keyNames, key))%len(keyNames)]
			out, err := s.AcquireSets(ctx, [][]store.AcquireRequest{{{Key: key, TTL: ttl()}, {Key: other, TTL: ttl()}}})
			must(t, err)
			if out[0][0].OK != out[0][1].OK {
				t.Fatalf("seed %d step %d: a set granted in part: %+v", seed, step, out[0])
			}
			grant(step, key, out[0][0], true)
			grant(step, other, out[0][1], true)
		}
		states, err := base.Snapshot(ctx, keyNames)
		must(t, err)
		for i, st := range states {
			switch {
			case st.Held && st.Shared > 0:
				t.Fatalf("seed %d step %d: key %s held exclusively with %d shared holds", seed, step, keyNames[i], st.Shared)
			case st.Shared > 0 && st.Limit > 0 && st.Shared > st.Limit:
				t.Fatalf("seed %d step %d: key %s has %d permits, smallest live limit %d", seed, step, keyNames[i], st.Shared, st.Limit)
			case st.Counter < lastFence[keyNames[i]]:
				t.Fatalf("seed %d step %d: key %s counter %v below a granted fence %v", seed, step, keyNames[i], st.Counter, lastFence[keyNames[i]])
			}
		}
		// The lookup and the snapshot agree on who holds a key.
		for _, k := range keyNames {
			info, err := base.LookupByKey(ctx, k)
			must(t, err)
			if st := states[indexOf(keyNames, k)]; (info != nil) != st.Held {
				t.Fatalf("seed %d step %d: key %s lookup %v but snapshot held %v", seed, step, k, info, st.Held)
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

// TestConcurrentUse: the model is safe for concurrent use (run with
// -race): processes call it at once, and the promises still hold after.
func TestConcurrentUse(t *testing.T) {
	c := &clock{now: time.UnixMilli(1_700_000_000_000)}
	notified := make(chan string, 1<<16)
	base, err := model.New(model.Config{Clock: c.Now, Holder: "p", NotifyChannel: "ch",
		Notify: func(p string) { notified <- p }, Waited: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keyNames := []string{"a", "b"}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := base.WithHolder(fmt.Sprint("p", g))
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 300 {
				key := keyNames[rng.IntN(2)]
				switch rng.IntN(4) {
				case 0:
					res, err := s.AcquireMany(ctx, []store.AcquireRequest{{Key: key, TTL: time.Second}})
					if err == nil && res[0].OK {
						_, err = s.ReleaseWaited(ctx, []store.ReleaseRequest{{LockID: res[0].LockID, Key: key}})
					}
					if err != nil {
						t.Error(err)
						return
					}
				case 1:
					_, err := s.AcquireSharedMany(ctx, []store.SharedRequest{{Key: key, TTL: time.Second, Limit: 2}})
					if err != nil {
						t.Error(err)
						return
					}
				case 2:
					_, err := s.Revoke(ctx, []store.RevokeRequest{{Key: key}})
					if err != nil {
						t.Error(err)
						return
					}
				default:
					c.Advance(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	states, err := base.Snapshot(ctx, keyNames)
	must(t, err)
	for i, st := range states {
		if (st.Held && st.Shared > 0) || (st.Limit > 0 && st.Shared > st.Limit) {
			t.Fatalf("key %s after concurrent use: %+v", keyNames[i], st)
		}
	}
	if len(notified) == 0 {
		t.Fatal("no notification from releases and revokes of waited keys")
	}
}
