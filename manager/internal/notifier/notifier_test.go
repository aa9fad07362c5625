package notifier

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func waitTimeout() time.Duration {
	if os.Getenv("CI") != "" {
		return 30 * time.Second
	}
	return 15 * time.Second
}

// recorder is a set of handlers that record what Deliver and Ended hand
// each topic.
type recorder struct{ got []string }

func (r *recorder) handler(t Topic) Handler {
	return Handler{
		Notice: func(n Notice) {
			r.got = append(r.got, fmt.Sprintf("%d notice %s%s%s", t, n.Hash, n.Note.KeyHash, n.Turn.LockHash))
		},
		Registered: func(keys []string) { r.got = append(r.got, fmt.Sprintf("%d registered %v", t, keys)) },
		Resync:     func() { r.got = append(r.got, fmt.Sprintf("%d resync", t)) },
		Ended:      func() { r.got = append(r.got, fmt.Sprintf("%d ended", t)) },
	}
}

func (r *recorder) take() []string { g := r.got; r.got = nil; return g }

// TestDeliverByTopic: a notification goes to its topic's subscriber only;
// a registration to each keyed topic's, with its own keys (none is still
// a call); a resync and the service's end to every topic's.
func TestDeliverByTopic(t *testing.T) {
	var l Link
	r := &recorder{}
	for tp := range numTopics {
		l.Handle(tp, r.handler(tp))
	}
	check := func(what string, want ...string) {
		t.Helper()
		if got := r.take(); !slices.Equal(got, want) {
			t.Fatalf("%s: delivered %q, want %q", what, got, want)
		}
	}
	h := pglease.HashKey("k")
	l.Deliver(Notice{Topic: Wake, Hash: h})
	check("a wake-up", fmt.Sprintf("%d notice %s", Wake, h))
	l.Deliver(Of(store.Notification{Kind: store.NotifyRevoke, KeyHash: h}))
	check("a revoke", fmt.Sprintf("%d notice %s", Revoke, h))
	l.Deliver(Of(store.Notification{Kind: store.NotifyReleaseRequest, KeyHash: h}))
	check("a release request", fmt.Sprintf("%d notice %s", ReleaseRequest, h))
	l.Deliver(Of(store.Notification{Kind: store.NotifyWatch, KeyHash: h}))
	check("a watch event", fmt.Sprintf("%d notice %s", Watch, h))
	l.Deliver(Notice{Registered: []Sub{{Watch, "a"}, {Wake, "b"}, {Watch, "c"}}})
	check("a registration", fmt.Sprintf("%d registered [b]", Wake), fmt.Sprintf("%d registered [a c]", Watch))
	l.Deliver(Notice{Registered: []Sub{{Watch, "a"}}})
	check("a watch registration", fmt.Sprintf("%d registered []", Wake), fmt.Sprintf("%d registered [a]", Watch))
	l.Deliver(Notice{Resync: true})
	check("a resync", fmt.Sprintf("%d resync", Wake), fmt.Sprintf("%d resync", Watch),
		fmt.Sprintf("%d resync", Revoke), fmt.Sprintf("%d resync", ReleaseRequest), fmt.Sprintf("%d resync", Turn))
	l.Deliver(Notice{Topic: Turn, Turn: store.Turn{LockHash: h}})
	check("a turn", fmt.Sprintf("%d notice %s", Turn, h))
	l.Idle()
	l.Ended()
	check("the end", fmt.Sprintf("%d ended", Wake), fmt.Sprintf("%d ended", Watch),
		fmt.Sprintf("%d ended", Revoke), fmt.Sprintf("%d ended", ReleaseRequest), fmt.Sprintf("%d ended", Turn))
	if l.Live() {
		t.Fatal("live after the service ended")
	}
	l.Deliver(Notice{Topic: Wake, Hash: h}) // the loop's own notices still come through
	check("a wake-up after the end", fmt.Sprintf("%d notice %s", Wake, h))
}

// TestLinkOutbox: subscriptions are recorded for the next handover only
// while a service runs, only for keyed topics; a subscription let go and
// taken again before the handover merges (Unsubscribing).
func TestLinkOutbox(t *testing.T) {
	var l Link
	l.Subscribe(Wake, "k")
	if l.Mailbox() != nil || l.Live() {
		t.Fatal("a subscription without a service is to be handed over")
	}
	l.Idle()
	l.Subscribe(Revoke, "k")
	if l.Mailbox() != nil {
		t.Fatal("a channel-wide topic took a subscription per key")
	}
	l.Subscribe(Watch, "k")
	if l.Mailbox() == nil || !l.Outbox()[Sub{Watch, "k"}] || l.Unsubscribing(Watch, "k") {
		t.Fatalf("outbox %v after Subscribe", l.Outbox())
	}
	l.Handed()
	if l.Mailbox() != nil || len(l.Outbox()) != 0 {
		t.Fatal("the outbox is still offered after the handover")
	}
	l.Unsubscribe(Watch, "k")
	if !l.Unsubscribing(Watch, "k") || l.Unsubscribing(Wake, "k") {
		t.Fatal("the end of the subscription is not pending")
	}
	l.Subscribe(Watch, "k")
	if l.Unsubscribing(Watch, "k") || !l.Outbox()[Sub{Watch, "k"}] {
		t.Fatal("subscribing again did not merge with the pending end")
	}
}

// TestParse: each kind of payload becomes its topic's notice; another
// program's payload is not pglease's.
func TestParse(t *testing.T) {
	h, lh := pglease.HashKey("k"), pglease.HashKey("lock")
	for _, c := range []struct {
		payload string
		ok      bool
		topic   Topic
	}{
		{h, true, Wake},
		{"r:" + h + ":" + lh, true, Revoke},
		{"q:" + h, true, ReleaseRequest},
		{"w:" + h + ":g:000000000000007", true, Watch},
		{"hello", false, 0},
		{"r:" + h, false, 0},
	} {
		n, ok := Parse(c.payload)
		if ok != c.ok || (ok && n.Topic != c.topic) {
			t.Errorf("Parse(%q) = %+v, %v; want topic %d, %v", c.payload, n, ok, c.topic, c.ok)
		}
		if ok && c.topic == Wake && n.Hash != h {
			t.Errorf("Parse(%q): hash %q", c.payload, n.Hash)
		}
	}
}

// TestServiceSubscribesAndResyncs runs the service against a real server:
// it posts a resync once listening; a subscription handed over is taken
// (a registration, and the key's waiter lock held on its session); what
// is notified on its channel is delivered in order by topic, another
// program's payload is not, and on the default channel only watch events
// are; when its session is ended it reconnects, takes its subscriptions
// again and posts a resync; Stop ends it.
func TestServiceSubscribesAndResyncs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout())
	defer cancel()
	url := pgtest.SchemaURL(t)
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	app := pgtest.RandomName("notifier_")
	cc.RuntimeParams["application_name"] = app
	channel := pgtest.RandomName("chan_")
	cfg := Config{
		Conn: connx.Bounded(cc, 2*time.Second), Channel: channel, DefaultChannel: "pglease_release",
		StatementTimeout: 5 * time.Second, Liveness: connx.DefaultLiveness,
		ProbeEvery: ProbeInterval, ProbeTimeout: ProbeTimeout,
	}
	out := make(chan Notice)
	var l Link
	l.Start(cfg, out)
	defer func() {
		l.Stop()
		select {
		case <-l.Done():
		case <-time.After(waitTimeout()):
			t.Error("the service did not end after Stop")
		}
	}()
	next := func(what string) Notice { t.Helper(); return nextNotice(t, &l, out, what) }
	if n := next("the first resync"); !n.Resync {
		t.Fatalf("first notice %+v, want a resync", n)
	}
	l.Subscribe(Wake, "k")
	if n := next("the registration"); !slices.Equal(n.Registered, []Sub{{Wake, "k"}}) {
		t.Fatalf("notice %+v, want the registration of k", n)
	}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	heldLocks := func() int {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE a.application_name = $1 AND l.locktype = 'advisory' AND l.granted`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := heldLocks(); n != 1 {
		t.Fatalf("%d advisory locks on the service's session, want k's waiter lock", n)
	}
	h, lh := pglease.HashKey("k"), pglease.HashKey("lock")
	// A key on another wake channel than k's: nobody here waits for it.
	var other string
	for i := 0; other == "" || store.WakeChannel(channel, pglease.HashKey(other)) == store.WakeChannel(channel, h); i++ {
		other = "z" + strconv.Itoa(i)
	}
	ho := pglease.HashKey(other)
	notify := func(qs ...[2]string) {
		t.Helper()
		for _, q := range qs {
			if _, err := admin.Exec(ctx, "SELECT pg_notify($1, $2)", q[0], q[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	notify([][2]string{
		{channel, "not pglease's"},
		{"pglease_release", "r:" + h + ":" + lh}, // not a watch event: not taken from the default channel
		{"pglease_release", "w:" + h + ":g:000000000000007"},
		{channel, "r:" + h + ":" + lh},
		{channel, h},                         // a wake-up on the channel itself (older functions, triggers)
		{store.WakeChannel(channel, ho), ho}, // not LISTENed to: not heard
		{store.WakeChannel(channel, h), h},   // k's wake channel
	}...)
	if n := next("the watch event"); n.Topic != Watch || n.Note.Fence != 7 {
		t.Fatalf("notice %+v, want the watch event of the default channel", n)
	}
	if n := next("the revoke"); n.Topic != Revoke || n.Note.LockIDHash != lh {
		t.Fatalf("notice %+v, want the revoke", n)
	}
	if n := next("the wake-up"); n.Topic != Wake || n.Hash != h {
		t.Fatalf("notice %+v, want k's wake-up", n)
	}
	if n := next("the wake-up on k's wake channel"); n.Topic != Wake || n.Hash != h {
		t.Fatalf("notice %+v, want k's wake-up from its wake channel (and nothing from %s's)", n, other)
	}

	// End its session: it reconnects, takes k's lock again, resyncs.
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app); err != nil {
		t.Fatal(err)
	}
	if n := next("the resync after the reconnect"); !n.Resync {
		t.Fatalf("notice %+v, want a resync", n)
	}
	if n := heldLocks(); n != 1 {
		t.Fatalf("%d advisory locks on the new session, want k's waiter lock", n)
	}
	notify([2]string{store.WakeChannel(channel, h), h})
	if n := next("k's wake-up after the reconnect"); n.Topic != Wake || n.Hash != h {
		t.Fatalf("notice %+v, want k's wake-up: the new session LISTENs to its wake channel", n)
	}
	// A second key on k's wake channel keeps it LISTENed to after k's
	// subscription ends.
	var same string
	for i := 0; same == "" || store.WakeChannel(channel, pglease.HashKey(same)) != store.WakeChannel(channel, h); i++ {
		same = "s" + strconv.Itoa(i)
	}
	l.Subscribe(Wake, same)
	if n := next("the registration of the second key"); !slices.Equal(n.Registered, []Sub{{Wake, same}}) {
		t.Fatalf("notice %+v, want the registration of %s", n, same)
	}
	locksDown := func(want int, what string) {
		t.Helper()
		deadline := time.Now().Add(waitTimeout())
		for heldLocks() != want {
			select {
			case l.Mailbox() <- l.Outbox():
				l.Handed()
			case n := <-out:
				t.Fatalf("unexpected notice %+v", n)
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d waiter locks, want %d", what, heldLocks(), want)
			}
		}
	}
	l.Unsubscribe(Wake, "k")
	locksDown(1, "k's subscription ended")
	notify([2]string{store.WakeChannel(channel, h), h})
	if n := next("k's wake-up while the second key waits"); n.Topic != Wake || n.Hash != h {
		t.Fatalf("notice %+v: the wake channel the second key still needs was let go", n)
	}
	l.Unsubscribe(Wake, same)
	locksDown(0, "the second key's subscription ended")
	// The wake channel was let go with the last lock, in the same round
	// trip.
	notify([2]string{store.WakeChannel(channel, h), h}, [2]string{channel, "r:" + h + ":" + lh})
	if n := next("the revoke after the wait"); n.Topic != Revoke {
		t.Fatalf("notice %+v, want the revoke: k's wake channel is still LISTENed to", n)
	}
}

// nextNotice runs the loop's side of l until a notice comes on out: it
// hands the outbox over whenever the service takes it.
func nextNotice(t *testing.T, l *Link, out <-chan Notice, what string) Notice {
	t.Helper()
	deadline := time.After(waitTimeout())
	for {
		select {
		case l.Mailbox() <- l.Outbox():
			l.Handed()
		case n := <-out:
			return n
		case <-deadline:
			t.Fatalf("no notice: %s", what)
		}
	}
}
