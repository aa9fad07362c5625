package notifier

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestServiceProbesByActivity: the service probes its connection every
// ProbeEvery while the loop wants the Active subscription, and every
// IdleProbeEvery otherwise: here an hour, so no probe at all while idle;
// the first Active probes at once (the last probe is long past
// ProbeEvery), and they stop again once Active is dropped.
func TestServiceProbesByActivity(t *testing.T) {
	t.Parallel()
	cc, err := pgx.ParseConfig(pgtest.SchemaURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var probes atomic.Int64
	cfg := Config{
		Conn: connx.Bounded(cc, 2*time.Second), Channel: pgtest.RandomName("chan_"), DefaultChannel: "pglease_release",
		StatementTimeout: 5 * time.Second, Liveness: connx.DefaultLiveness,
		ProbeEvery: 100 * time.Millisecond, ProbeTimeout: 5 * time.Second, IdleProbeEvery: time.Hour,
		Probed: func() { probes.Add(1) },
	}
	out := make(chan Notice)
	var l Link
	l.Start(cfg, out)
	defer func() {
		l.Stop()
		<-l.Done()
	}()
	if n := nextNotice(t, &l, out, "the first resync"); !n.Resync {
		t.Fatalf("first notice %+v, want a resync", n)
	}
	// hand passes the outbox to the service and waits d, answering
	// whatever it posts.
	hand := func(d time.Duration) {
		t.Helper()
		deadline := time.After(d)
		for {
			select {
			case l.Mailbox() <- l.Outbox():
				l.Handed()
			case <-out:
			case <-deadline:
				return
			}
		}
	}
	hand(time.Second)
	if n := probes.Load(); n != 0 {
		t.Fatalf("%d probes while idle (IdleProbeEvery an hour), want 0", n)
	}
	l.SetActive(true)
	deadline := time.Now().Add(waitTimeout())
	for probes.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d probes in %v while active (ProbeEvery 100ms), want 3", probes.Load(), waitTimeout())
		}
		hand(50 * time.Millisecond)
	}
	l.SetActive(false)
	hand(200 * time.Millisecond) // handed over, and a probe under way finished
	n := probes.Load()
	hand(time.Second)
	if got := probes.Load(); got != n {
		t.Fatalf("%d probes in 1s after Active was dropped, want 0 (IdleProbeEvery an hour)", got-n)
	}
}
