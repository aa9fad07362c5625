package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/internal/store/storetest"
)

// TestConformance holds the real store to the suite the in-memory model
// (package model) is held to.
func TestConformance(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) *storetest.Harness {
		a, pool, _ := newStore(t, store.Config{Holder: storetest.HolderA, NotifyChannel: "pglease_release"})
		b, err := store.New("pg.New", pool, store.Config{Holder: storetest.HolderB, NotifyChannel: "pglease_release"})
		if err != nil {
			t.Fatal(err)
		}
		return &storetest.Harness{
			Store: a, Other: b,
			Now: func(t testing.TB) time.Time { return time.UnixMilli(serverNow(t, pool)) },
			Advance: func(t testing.TB, d time.Duration) {
				waitServer(t, pool, serverNow(t, pool)+d.Milliseconds()+1)
			},
			Tx: func(t testing.TB) store.DB {
				tx, err := pool.Begin(ctx(t))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
				return tx
			},
			SetFence: func(t testing.TB, key string, f pglease.Fence) {
				_, err := pool.Exec(ctx(t), "INSERT INTO syncguard_fence_counters (fence_key, fence, key_debug) VALUES ('fence:' || $1, $2, $1)"+
					" ON CONFLICT (fence_key) DO UPDATE SET fence = EXCLUDED.fence", key, int64(f))
				if err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
