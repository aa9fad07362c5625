package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx(t), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// listenOn returns a session LISTENing to channel and to its 256 wake
// channels (store.WakeChannel), so that it hears every wake-up;
// nextNotification checks that each came on its key's wake channel.
func listenOn(t *testing.T, channel string) *pgx.Conn {
	t.Helper()
	l := connect(t)
	if _, err := l.Exec(ctx(t), listenAllSQL(channel)); err != nil {
		t.Fatal(err)
	}
	return l
}

// listenAllSQL LISTENs to channel and its 256 wake channels.
func listenAllSQL(channel string) string {
	q := "LISTEN " + channel
	for i := range 256 {
		q += fmt.Sprintf(`; LISTEN "%s.%02x"`, channel, i)
	}
	return q
}

// wakeRuleErr checks where a notification came: a wake-up (a key's hash
// alone) on its key's wake channel, anything else on a channel without
// a wake suffix.
func wakeRuleErr(n *pgconn.Notification) error {
	note, ok := store.ParseNotification(n.Payload)
	base, suffix, sharded := strings.Cut(n.Channel, ".")
	switch {
	case ok && note.Kind == store.NotifyWake && (!sharded || n.Channel != store.WakeChannel(base, note.KeyHash)):
		return fmt.Errorf("wake-up %s came on %q, not on its key's wake channel", n.Payload, n.Channel)
	case (!ok || note.Kind != store.NotifyWake) && sharded:
		return fmt.Errorf("%q came on the wake channel %q (suffix %s)", n.Payload, n.Channel, suffix)
	}
	return nil
}

func acquireOK(t *testing.T, s *store.Store, key string) string {
	t.Helper()
	r, err := s.Acquire(ctx(t), store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !r.OK {
		t.Fatalf("Acquire(%s) = %+v, %v", pglease.HashKey(key), r, err)
	}
	return r.LockID
}

func nextNotification(t *testing.T, l *pgx.Conn) string {
	t.Helper()
	wc, cancel := context.WithTimeout(ctx(t), 10*time.Second)
	defer cancel()
	n, err := l.WaitForNotification(wc)
	if err != nil {
		t.Fatal("no notification:", err)
	}
	if err := wakeRuleErr(n); err != nil {
		t.Fatal(err)
	}
	return n.Payload
}

// waiterLocks counts the holds of keys' waiter locks (other tests' keys
// are none of this test's business).
func waiterLocks(t *testing.T, db testDB, keys ...string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(ctx(t), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objsubid = 2"+
		" AND objid IN (SELECT hashtext(k)::oid FROM unnest($2::text[]) AS k)", store.WaiterLockClass, keys).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ReleaseWaited notifies a released key only while a session holds its
// waiter lock, answers like ReleaseMany, and leaves no lock behind.
// Notifications arrive in commit order, so "the next notification is the
// waited key's" shows that the releases before it sent none.
func TestReleaseWaitedNotifiesOnlyWaitedKeys(t *testing.T) {
	t.Parallel()
	const ch = "pglease_waited"
	s, pool, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	l := listenOn(t, ch)
	w := connect(t)
	kFree, kWaited := "rw-free-"+t.Name(), "rw-waited-😀-"+t.Name()

	ok, err := store.RegisterWaiters(c, w, []string{kWaited})
	if err != nil || len(ok) != 1 || !ok[0] {
		t.Fatalf("RegisterWaiters = %v, %v", ok, err)
	}
	if n := waiterLocks(t, pool, kFree, kWaited); n != 1 {
		t.Fatalf("%d waiter locks after registering one key", n)
	}
	free, waited := acquireOK(t, s, kFree), acquireOK(t, s, kWaited)
	res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: free, Key: kFree}, {LockID: keys.NewLockID(), Key: kFree}})
	if err != nil || len(res) != 2 || !res[0] || res[1] {
		t.Fatalf("ReleaseWaited(free, unknown) = %v, %v; want [true false]", res, err)
	}
	if res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: waited, Key: kWaited}}); err != nil || !res[0] {
		t.Fatalf("ReleaseWaited(waited) = %v, %v", res, err)
	}
	if got := nextNotification(t, l); got != pglease.HashKey(kWaited) {
		t.Fatalf("first notification %s, want the waited key's %s (the unwaited release notified)", got, pglease.HashKey(kWaited))
	}
	// The releaser's check took and dropped the lock: only the waiter's
	// shared hold remains.
	if n := waiterLocks(t, pool, kFree, kWaited); n != 1 {
		t.Fatalf("%d waiter locks after the releases, want the waiter's 1", n)
	}

	// Unregistered: its release is silent again.
	if err := store.UnregisterWaiters(c, w, []string{kWaited}); err != nil {
		t.Fatal(err)
	}
	if n := waiterLocks(t, pool, kFree, kWaited); n != 0 {
		t.Fatalf("%d waiter locks after UnregisterWaiters", n)
	}
	again := acquireOK(t, s, kWaited)
	if res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: again, Key: kWaited}}); err != nil || !res[0] {
		t.Fatalf("ReleaseWaited = %v, %v", res, err)
	}
	sentinel := "rw-sentinel-" + t.Name()
	if _, err := store.RegisterWaiters(c, w, []string{sentinel}); err != nil {
		t.Fatal(err)
	}
	id := acquireOK(t, s, sentinel)
	if res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: id, Key: sentinel}}); err != nil || !res[0] {
		t.Fatalf("ReleaseWaited = %v, %v", res, err)
	}
	if got := nextNotification(t, l); got != pglease.HashKey(sentinel) {
		t.Fatalf("notification %s after unregistering, want the sentinel's", got)
	}

	// ReleaseMany still notifies every release.
	id = acquireOK(t, s, kFree)
	if ok, err := s.ReleaseMany(c, []string{id}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	if got := nextNotification(t, l); got != pglease.HashKey(kFree) {
		t.Fatalf("ReleaseMany notified %s, want %s", got, pglease.HashKey(kFree))
	}
}

// No lost wake-up: a waiter that registers, then tries the key, either
// gets it or is notified of the release that frees it, however the
// release and its steps interleave (many rounds, release and waiter on
// their own connections at the same time).
func TestReleaseWaitedNoLostWakeUp(t *testing.T) {
	t.Parallel()
	const ch = "pglease_waited_race"
	s, _, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	w := listenOn(t, ch) // the waiter's session registers and listens, like a Manager's listener
	rounds := 150
	if testing.Short() {
		rounds = 40
	}
	var tried, notified int
	for i := range rounds {
		key := fmt.Sprintf("rw-race-%d-%s", i, t.Name())
		held := acquireOK(t, s, key)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: held, Key: key}}); err != nil || !res[0] {
				t.Errorf("ReleaseWaited = %v, %v", res, err)
			}
		}()
		if ok, err := store.RegisterWaiters(c, w, []string{key}); err != nil {
			t.Fatal(err)
		} else if !ok[0] {
			// The release held the lock exclusively at that instant: it
			// has checked, so the key is free or about to be.
			wg.Wait()
			if _, err := store.RegisterWaiters(c, w, []string{key}); err != nil {
				t.Fatal(err)
			}
		}
		r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if r.OK {
			tried++
		} else {
			// Earlier rounds' notifications may still arrive: skip them.
			for nextNotification(t, w) != pglease.HashKey(key) {
			}
			notified++
			r, err = s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
			if err != nil || !r.OK {
				t.Fatalf("round %d: Acquire after the notification = %+v, %v", i, r, err)
			}
		}
		wg.Wait()
		if err := store.UnregisterWaiters(c, w, []string{key}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(c, r.LockID); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rounds: the waiter's try got the key in %d, a notification woke it in %d", rounds, tried, notified)
}

// Bad input is InvalidArgument before any I/O.
func TestReleaseWaitedBadInputNoIO(t *testing.T) {
	t.Parallel()
	cnt := &pgtest.Recorder{}
	s, _, _ := newStore(t, store.Config{NotifyChannel: "pglease_bad"}, cnt.Configure)
	c := ctx(t)
	cnt.Reset()
	good := keys.NewLockID()
	for name, reqs := range map[string][]store.ReleaseRequest{
		"bad lockId": {{LockID: "nope", Key: "k"}},
		"empty key":  {{LockID: good, Key: ""}},
		"bad key":    {{LockID: good, Key: "k\xff"}},
		"too many":   make([]store.ReleaseRequest, store.MaxBatch+1),
	} {
		if _, err := s.ReleaseWaited(c, reqs); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
	mine := "bad-input-" + t.Name()
	if _, err := store.RegisterWaiters(c, nil, []string{mine}); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("RegisterWaiters(nil conn): %v", err)
	}
	w := connect(t)
	if _, err := store.RegisterWaiters(c, w, []string{mine, ""}); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("RegisterWaiters(empty key): %v", err)
	}
	if err := store.UnregisterWaiters(c, w, []string{"k\xff"}); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("UnregisterWaiters(bad key): %v", err)
	}
	if q := cnt.Queries() + cnt.Writes(); q != 0 {
		t.Fatalf("%d queries/writes for bad input", q)
	}
	if n := waiterLocks(t, w, mine); n != 0 {
		t.Fatalf("%d waiter locks after refused registrations", n)
	}
	if res, err := s.ReleaseWaited(c, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty ReleaseWaited = %v, %v", res, err)
	}
	if out := fmt.Sprintf("%v %+v", store.ReleaseRequest{LockID: good, Key: "secret-key"}, store.ReleaseRequest{LockID: good, Key: "secret-key"}); strings.Contains(out, "secret-key") || strings.Contains(out, good) {
		t.Fatal("ReleaseRequest prints its key or lockId")
	}
}

// RegisterWaiters LISTENs to the channels it is given in its own round
// trip, and UnregisterWaiters UNLISTENs those it is given, with keys or
// without; a release of a waited key is heard on its key's wake channel
// alone, by a session that LISTENs to nothing else.
func TestRegisterWaitersListens(t *testing.T) {
	t.Parallel()
	ch := pgtest.RandomName("wakech_")
	s, _, _ := newStore(t, store.Config{NotifyChannel: ch})
	c := ctx(t)
	w := connect(t)
	listening := func() []string {
		t.Helper()
		var got []string
		rows, err := w.Query(c, "SELECT pg_listening_channels() ORDER BY 1")
		if err != nil {
			t.Fatal(err)
		}
		got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	k1 := "wake-1-" + t.Name()
	wc1 := store.WakeChannel(ch, pglease.HashKey(k1))
	if ok, err := store.RegisterWaiters(c, w, []string{k1}, wc1); err != nil || !ok[0] {
		t.Fatalf("RegisterWaiters = %v, %v", ok, err)
	}
	if got := listening(); len(got) != 1 || got[0] != wc1 {
		t.Fatalf("listening to %q after RegisterWaiters, want [%q]", got, wc1)
	}
	id := acquireOK(t, s, k1)
	if res, err := s.ReleaseWaited(c, []store.ReleaseRequest{{LockID: id, Key: k1}}); err != nil || !res[0] {
		t.Fatalf("ReleaseWaited = %v, %v", res, err)
	}
	if got := nextNotification(t, w); got != pglease.HashKey(k1) {
		t.Fatalf("notified %s, want %s", got, pglease.HashKey(k1))
	}
	// Unregistering the key and UNLISTENing its channel in one call.
	if err := store.UnregisterWaiters(c, w, []string{k1}, wc1); err != nil {
		t.Fatal(err)
	}
	if got := listening(); len(got) != 0 {
		t.Fatalf("listening to %q after UnregisterWaiters", got)
	}
	// A channel alone, without keys.
	if _, err := w.Exec(c, `LISTEN "`+wc1+`"`); err != nil {
		t.Fatal(err)
	}
	if err := store.UnregisterWaiters(c, w, nil, wc1); err != nil {
		t.Fatal(err)
	}
	if got := listening(); len(got) != 0 {
		t.Fatalf("listening to %q after UnregisterWaiters(no keys, %s)", got, wc1)
	}
	if n := waiterLocks(t, w, k1); n != 0 {
		t.Fatalf("%d waiter locks left", n)
	}
}

// WakeChannel spreads keys over the 256 wake channels: 2,560 keys named
// in sequence (the common case: "tenant-17", "job/00042") use most of
// them, none far above its share of 10. The low byte of hashKey's last
// word, used at first, put them on 56 channels, up to 125 on one.
func TestWakeChannelSpread(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"tenant-%d", "order:%d:lock", "k%d", "job/%05d"} {
		n := map[string]int{}
		for i := range 2560 {
			n[store.WakeChannel("c", pglease.HashKey(fmt.Sprintf(format, i)))]++
		}
		most := 0
		for _, v := range n {
			most = max(most, v)
		}
		if len(n) < 200 || most > 40 {
			t.Errorf("%s: 2,560 keys on %d wake channels, up to %d on one; want ≥ 200 channels, ≤ 40 keys each", format, len(n), most)
		}
	}
}
