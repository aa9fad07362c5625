package kernel

import (
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager/internal/notifier"
)

// watchRig drives one watched key's loop state by hand: notifications
// and read answers come in the order a test chooses, which the
// goroutines cannot be made to produce on demand. (Loop state only: the
// reads are answered by the test, as the server would have.)
type watchRig struct {
	t   *testing.T
	st  *LoopState
	w   *watcher
	ch  eventChan
	got []Event
	now time.Time
}

func newWatchRig(t *testing.T) *watchRig {
	t.Helper()
	k, _ := pgKernel(t, Config{DisableNotify: true})
	st := newLoopState(k)
	st.lis.Idle() // a listener that takes no mail
	// A reader that keeps up: a buffer as large as the test's changes, so
	// every event the loop sends is kept.
	ch := make(eventChan, 1024)
	w := &watcher{key: "k", hash: pglease.HashKey("k"), sink: ch}
	req := &watchReq{w: w, reply: make(chan error, 1)}
	st.handleWatch(req)
	if err := <-req.reply; err != nil {
		t.Fatal(err)
	}
	st.handleWatchRegistered("k")
	return &watchRig{t: t, st: st, w: w, ch: ch, now: time.Now()}
}

// take starts the wanted read, failing when none is wanted.
func (g *watchRig) take() *watchFlight {
	g.t.Helper()
	fl, _ := g.st.takeWatchReads()
	if fl == nil {
		g.t.Fatal("no read wanted")
	}
	return fl
}

// answer gives the read fl the state r.
func (g *watchRig) answer(fl *watchFlight, r store.KeyState) {
	g.st.handleWatchRead(watchDone{fl: fl, res: []store.KeyState{r}, at: g.now})
	g.recv()
}

func (g *watchRig) notice(ev store.WatchEvent, f pglease.Fence) {
	g.st.handleWatchNotice(store.Notification{Kind: store.NotifyWatch, KeyHash: g.w.hash, Event: ev, Fence: f})
	g.recv()
}

func (g *watchRig) recv() {
	for len(g.ch) > 0 {
		g.got = append(g.got, <-g.ch)
	}
}

// free and held are a read's answers.
func (g *watchRig) free(counter pglease.Fence) store.KeyState {
	return store.KeyState{Now: g.now, Counter: counter}
}

func (g *watchRig) held(f pglease.Fence) store.KeyState {
	return store.KeyState{Now: g.now, Held: true, LockIDHash: "h", Fence: f, Counter: f,
		AcquiredAt: g.now, ExpiresAt: g.now.Add(30 * time.Second), Holder: fmt.Sprintf("holder%d", f)}
}

// expect fails unless the events received are kinds/fences want, in order.
func (g *watchRig) expect(want []Event) {
	g.t.Helper()
	ok := len(g.got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = g.got[i].Kind == want[i].Kind && g.got[i].Fence == want[i].Fence
	}
	if !ok {
		g.t.Fatalf("events:\n got %v\nwant %v", brief(g.got), brief(want))
	}
}

func brief(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%s %d", e.Kind, e.Fence)
	}
	return out
}

// TestWatchBacklogOverflow: a key that changes many times (more than the
// backlog holds) while the read of a grant's holder is under way: every
// change is told, in order, the last one last, and none as a resync (no
// notification was lost: the Manager has them all). This is what a busy
// key under load does when its reads are slower than its changes.
func TestWatchBacklogOverflow(t *testing.T) {
	t.Parallel()
	g := newWatchRig(t)
	g.answer(g.take(), g.free(0))
	want := []Event{{Kind: EventReleased}}
	g.expect(want)

	g.notice(store.WatchGranted, 1)
	fl := g.take() // the grant's holder: under way while the key changes
	g.notice(store.WatchReleased, 1)
	const last = 3 * maxBacklog / 2
	for f := pglease.Fence(2); f <= last; f++ {
		g.notice(store.WatchGranted, f)
		g.notice(store.WatchReleased, f)
	}
	g.answer(fl, g.held(1))
	// Reads wanted since (none should be: the key is free) find it free.
	for len(g.st.watch.want) > 0 {
		g.answer(g.take(), g.free(last))
	}
	for f := pglease.Fence(1); f <= last; f++ {
		want = append(want, Event{Kind: EventGranted, Fence: f}, Event{Kind: EventReleased, Fence: f})
	}
	g.expect(want)
}

// TestWatchBacklogGrantsNeedNoRead: changes that come while a grant's
// read is under way cost one more read at most, not one per grant: a
// grant already ended when its turn comes is told without a read, and
// the read tells the holder of a grant it found.
func TestWatchBacklogGrantsNeedNoRead(t *testing.T) {
	t.Parallel()
	g := newWatchRig(t)
	g.answer(g.take(), g.free(0))
	g.notice(store.WatchGranted, 1)
	fl := g.take()
	g.notice(store.WatchReleased, 1)
	for f := pglease.Fence(2); f <= 5; f++ {
		g.notice(store.WatchGranted, f)
		g.notice(store.WatchReleased, f)
	}
	g.notice(store.WatchGranted, 6)
	// The read was made when 3 was the lease (the server's answer lags).
	g.answer(fl, g.held(3))
	want := []Event{{Kind: EventReleased}}
	for f := pglease.Fence(1); f <= 5; f++ {
		want = append(want, Event{Kind: EventGranted, Fence: f}, Event{Kind: EventReleased, Fence: f})
	}
	g.expect(want)
	if h := g.got[5].Holder; h != "holder3" {
		t.Fatalf("granted 3: holder %q, want the one the read found", h)
	}
	// Grant 6 came after the read: one read for it.
	g.answer(g.take(), g.held(6))
	if len(g.st.watch.want) != 0 {
		t.Fatal("another read wanted")
	}
	want = append(want, Event{Kind: EventGranted, Fence: 6})
	g.expect(want)
	if h := g.got[len(g.got)-1].Holder; h != "holder6" {
		t.Fatalf("granted 6: holder %q", h)
	}
}

// TestWatchBusyReadAppliesBacklog: a confirming read (the lease's expiry)
// answered busy because the lease is being released: the release's
// notification, which came meanwhile, is applied then, not left behind
// for the retry, so the next grant does not find the old lease still
// live and report it expired.
func TestWatchBusyReadAppliesBacklog(t *testing.T) {
	t.Parallel()
	g := newWatchRig(t)
	g.answer(g.take(), g.free(0))
	g.notice(store.WatchGranted, 1)
	g.answer(g.take(), g.held(1))
	g.st.dueWatch(g.now.Add(time.Hour)) // the expiry check is due
	fl := g.take()
	g.notice(store.WatchReleased, 1)
	g.answer(fl, store.KeyState{Busy: true})
	g.notice(store.WatchGranted, 2)
	g.answer(g.take(), g.held(2))
	g.expect([]Event{{Kind: EventReleased}, {Kind: EventGranted, Fence: 1}, {Kind: EventReleased, Fence: 1},
		{Kind: EventGranted, Fence: 2}})
}

// TestWatchBusyGrantReadEnded: the read of a grant's holder answered busy
// (the key was changing): the grant's end, come meanwhile, tells the
// grant at once, without waiting for the retry (which could not find it).
func TestWatchBusyGrantReadEnded(t *testing.T) {
	t.Parallel()
	g := newWatchRig(t)
	g.answer(g.take(), g.free(0))
	g.notice(store.WatchGranted, 1)
	g.answer(g.take(), store.KeyState{Busy: true})
	g.notice(store.WatchReleased, 1)
	g.expect([]Event{{Kind: EventReleased}, {Kind: EventGranted, Fence: 1}, {Kind: EventReleased, Fence: 1}})
}

// TestWatchAgainBeforeUnregister: the last watch of a key ends and a new
// one starts before the loop handed the listener the end (the two wishes
// merge in the outbox: the listener keeps the lock and posts no
// registration). The new watch's read is wanted at once; otherwise it
// would wait for a registration that never comes. (Loop state only: the
// handover's timing cannot be forced through the goroutines.)
func TestWatchAgainBeforeUnregister(t *testing.T) {
	t.Parallel()
	k, _ := pgKernel(t, Config{DisableNotify: true})
	st := newLoopState(k)
	st.lis.Idle() // a listener that takes no mail
	add := func(key string) *watcher {
		w := &watcher{key: key, hash: pglease.HashKey(key), sink: make(eventChan, WatchBuffer)}
		req := &watchReq{w: w, reply: make(chan error, 1)}
		st.handleWatch(req)
		if err := <-req.reply; err != nil {
			t.Fatal(err)
		}
		return w
	}
	w1 := add("k")
	st.lis.Handed() // handed over: the listener takes the lock
	st.handleWatchRegistered("k")
	if !st.watch.keys["k"].wantRead {
		t.Fatal("no read after the registration")
	}
	st.watch.want = nil
	st.unwatch(w1)
	if !st.lis.Unsubscribing(notifier.Watch, "k") {
		t.Fatal("the lock's end is not in the outbox")
	}
	add("k")
	if on := st.lis.Outbox()[notifier.Sub{Topic: notifier.Watch, Key: "k"}]; !on {
		t.Fatal("the lock is not wanted again")
	}
	if ws := st.watch.keys["k"]; !ws.wantRead {
		t.Fatal("the new watch waits for a registration that will not come")
	}
}
