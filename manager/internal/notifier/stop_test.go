package notifier

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestStopEndsBrokenSession: a probe that gets no answer breaks the
// listening connection, and pgx then closes it in a goroutine of its own
// (a cancel request on a new connection, then a drain), which keeps the
// socket open, and the server's session with the subscriptions' locks
// held, for up to two seconds more. When the service ends (Stop, as
// Manager.Close does) right after, its session must end with it: no
// session of the service and no advisory lock of its may be left on the
// server once Done is closed (the server ends a session within
// milliseconds of its socket closing; the poll allows far more).
func TestStopEndsBrokenSession(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout())
	defer cancel()
	url := pgtest.SchemaURL(t)
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(cc.Host + ":" + strconv.Itoa(int(cc.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	purl, err := proxy.ConnString(url)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgx.ParseConfig(purl)
	if err != nil {
		t.Fatal(err)
	}
	app := pgtest.RandomName("notifier_")
	pc.RuntimeParams["application_name"] = app
	failed := make(chan struct{}, 1)
	cfg := Config{
		Conn: connx.Bounded(pc, 2*time.Second), Channel: pgtest.RandomName("chan_"), DefaultChannel: "pglease_release",
		StatementTimeout: 5 * time.Second, Liveness: connx.DefaultLiveness,
		ProbeEvery: 100 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond,
		ProbeFailed: func() {
			select {
			case failed <- struct{}{}:
			default:
			}
		},
	}
	out := make(chan Notice)
	var l Link
	l.Start(cfg, out)
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		l.Stop()
		select {
		case <-l.Done():
		case <-time.After(waitTimeout()):
			t.Fatal("the service did not end after Stop")
		}
	}
	defer stop()
	next := func(what string) Notice { t.Helper(); return nextNotice(t, &l, out, what) }
	if n := next("the first resync"); !n.Resync {
		t.Fatalf("first notice %+v, want a resync", n)
	}
	l.Subscribe(Wake, "k")
	l.Subscribe(Watch, "w")
	for got := 0; got < 2; {
		n := next("the registrations")
		got += len(n.Registered)
	}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	left := func() (sessions, locks int) {
		if err := admin.QueryRow(ctx, `SELECT count(DISTINCT a.pid), count(l.pid) FROM pg_stat_activity a
			LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
			WHERE a.application_name = $1`, app).Scan(&sessions, &locks); err != nil {
			t.Fatal(err)
		}
		return sessions, locks
	}
	if s, n := left(); s != 1 || n != 2 {
		t.Fatalf("%d sessions holding %d advisory locks, want 1 holding the waiter and watch locks", s, n)
	}

	// The connection goes silent: the next probe fails, pgx starts its
	// clean-up, and the service is stopped at once.
	select {
	case <-failed: // a probe that failed before (a loaded machine) does not count
	default:
	}
	if err := proxy.Blackhole(); err != nil {
		t.Fatal(err)
	}
	// The loop's side goes on meanwhile: a service that reconnected
	// before the blackhole posts a resync.
	timeout := time.After(waitTimeout())
wait:
	for {
		select {
		case <-failed:
			break wait
		case l.Mailbox() <- l.Outbox():
			l.Handed()
		case <-out:
		case <-timeout:
			t.Fatal("the probe did not fail on a silent connection")
		}
	}
	stop()
	// The proxy closes the server's side as soon as the client's closes,
	// whatever its mode.
	deadline := time.Now().Add(time.Second)
	for {
		s, n := left()
		if s == 0 && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Stop: %d sessions of the service still open, holding %d advisory locks", s, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
