package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/internal/store/storetest"
)

// TestConformance holds the real store to the suite the in-memory model
// (package model) is held to.
func TestConformance(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) *storetest.Harness {
		// A channel of the test's own: channels are the database's.
		channel := pgtest.RandomName("storetest_")
		a, pool, _ := newStore(t, store.Config{Holder: storetest.HolderA, NotifyChannel: channel})
		b, err := store.New("pg.New", pool, store.Config{Holder: storetest.HolderB, NotifyChannel: channel})
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
			Listen: func(t testing.TB) storetest.Listener {
				conn, err := pgx.ConnectConfig(ctx(t), pool.Config().ConnConfig.Copy())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close(context.Background()) })
				// The channel and its 256 wake channels: Next hears every
				// wake-up, and checks it came on its key's wake channel.
				if _, err := conn.Exec(ctx(t), listenAllSQL(channel)); err != nil {
					t.Fatal(err)
				}
				register := func(reg func(context.Context, *pgx.Conn, []string) ([]bool, error)) func(string) {
					return func(key string) {
						ok, err := reg(ctx(t), conn, []string{key})
						if err != nil || len(ok) != 1 || !ok[0] {
							t.Fatalf("register = %v, %v", ok, err)
						}
					}
				}
				return storetest.Listener{
					Next: func() string {
						c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						n, err := conn.WaitForNotification(c)
						cancel()
						if err != nil {
							t.Fatalf("no notification: %v", err)
						}
						// A wake-up (a key's hash alone) comes on its key's
						// wake channel, everything else on the channel
						// itself.
						want := channel
						if note, ok := store.ParseNotification(n.Payload); ok && note.Kind == store.NotifyWake {
							want = store.WakeChannel(channel, note.KeyHash)
						}
						if n.Channel != want {
							t.Fatalf("%q notified on channel %q, want %q", n.Payload, n.Channel, want)
						}
						return n.Payload
					},
					Wait: register(func(c context.Context, conn *pgx.Conn, keys []string) ([]bool, error) {
						return store.RegisterWaiters(c, conn, keys, store.WakeChannel(channel, pglease.HashKey(keys[0])))
					}),
					Watch: register(store.RegisterWatchers),
				}
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
