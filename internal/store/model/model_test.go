package model_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/internal/store/model"
	"github.com/pglease/pglease/internal/store/storetest"
)

// clock is a manual clock: it moves only when the test advances it.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// tx stands for a transaction: the model's Guard only checks it for nil.
type tx struct{ store.DB }

// channel stands for the notify channel and the listening session: the
// model hands it every payload, and the session waits for the keys it
// was told to.
type channel struct {
	mu        sync.Mutex
	listening bool
	got       []string
	waited    map[string]bool
	watched   map[string]bool
}

func (c *channel) notify(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listening {
		c.got = append(c.got, p)
	}
}

func (c *channel) isWaited(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waited[key]
}

func (c *channel) isWatched(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watched[key]
}

// listen is Harness.Listen: the model notifies synchronously, so a
// payload not there when asked for never comes.
func (c *channel) listen(t testing.TB) storetest.Listener {
	c.mu.Lock()
	c.listening = true
	c.mu.Unlock()
	set := func(m map[string]bool) func(string) {
		return func(key string) {
			c.mu.Lock()
			defer c.mu.Unlock()
			m[key] = true
		}
	}
	return storetest.Listener{
		Next: func() string {
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.got) == 0 {
				t.Fatal("no notification")
			}
			p := c.got[0]
			c.got = c.got[1:]
			return p
		},
		Wait:  set(c.waited),
		Watch: set(c.watched),
	}
}

func newChannel() *channel { return &channel{waited: map[string]bool{}, watched: map[string]bool{}} }

// TestConformance holds the model to the suite the real store is held to.
func TestConformance(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) *storetest.Harness {
		c := &clock{now: time.UnixMilli(1_700_000_000_123)}
		ch := newChannel()
		a, err := model.New(model.Config{Clock: c.Now, Holder: storetest.HolderA, NotifyChannel: "pglease_release", Notify: ch.notify, Waited: ch.isWaited, Watched: ch.isWatched})
		if err != nil {
			t.Fatal(err)
		}
		return &storetest.Harness{
			Listen: ch.listen,
			Store:  a, Other: a.WithHolder(storetest.HolderB),
			Now:      func(testing.TB) time.Time { return c.Now() },
			Advance:  func(_ testing.TB, d time.Duration) { c.Advance(d) },
			Tx:       func(testing.TB) store.DB { return tx{} },
			SetFence: func(_ testing.TB, key string, f pglease.Fence) { a.SetFenceCounter(key, f) },
		}
	})
}

// TestConformanceSynctest runs the suite with each test in a
// testing/synctest bubble, the model on the bubble's clock (time.Now) and
// time let pass by sleeping: how a simulator drives it.
func TestConformanceSynctest(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) *storetest.Harness {
		ch := newChannel()
		a, err := model.New(model.Config{Clock: time.Now, Holder: storetest.HolderA, NotifyChannel: "pglease_release", Notify: ch.notify, Waited: ch.isWaited, Watched: ch.isWatched})
		if err != nil {
			t.Fatal(err)
		}
		return &storetest.Harness{
			Listen: ch.listen,
			Store:  a, Other: a.WithHolder(storetest.HolderB),
			Now:      func(testing.TB) time.Time { return time.Now() },
			Advance:  func(_ testing.TB, d time.Duration) { time.Sleep(d) },
			Tx:       func(testing.TB) store.DB { return tx{} },
			SetFence: func(_ testing.TB, key string, f pglease.Fence) { a.SetFenceCounter(key, f) },
		}
	}, storetest.Wrap(func(t *testing.T, body func(*testing.T)) { synctest.Test(t, body) }))
}
