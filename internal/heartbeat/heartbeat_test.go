package heartbeat_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pglease/pglease/internal/heartbeat"
)

const ms = time.Millisecond

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestDefaultMargin(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ ttl, want time.Duration }{
		{50 * ms, 10 * ms},
		{300 * ms, 30 * ms},
		{time.Second, 100 * ms},
		{30 * time.Second, 3 * time.Second},
		{time.Hour, 5 * time.Second},
	} {
		if got := heartbeat.DefaultMargin(tt.ttl); got != tt.want {
			t.Errorf("DefaultMargin(%v) = %v, want %v", tt.ttl, got, tt.want)
		}
		if !heartbeat.ValidMargin(tt.ttl, heartbeat.DefaultMargin(tt.ttl)) && tt.ttl >= heartbeat.MinAutoExtendTTL {
			t.Errorf("default margin of %v not valid", tt.ttl)
		}
	}
	for _, tt := range []struct {
		ttl, margin time.Duration
		ok          bool
	}{
		{time.Second, 0, false},
		{time.Second, -1, false},
		{time.Second, 666 * ms, true},
		{time.Second, 667 * ms, false},
	} {
		if got := heartbeat.ValidMargin(tt.ttl, tt.margin); got != tt.ok {
			t.Errorf("ValidMargin(%v, %v) = %v", tt.ttl, tt.margin, got)
		}
	}
}

func TestLeaseSchedule(t *testing.T) {
	t.Parallel()
	base := heartbeat.Lease{TTL: 3 * time.Second, Start: t0} // margin 300 ms, slack 250 ms
	tests := []struct {
		name    string
		l       heartbeat.Lease
		now     time.Duration
		due     bool
		trusted bool
		next    time.Duration
	}{
		{"fresh", base, 0, false, true, time.Second},
		{"just before slack", base, 749 * ms, false, true, time.Second},
		{"within slack", base, 750 * ms, true, true, time.Second},
		{"due", base, time.Second, true, true, time.Second},
		{"late but trusted", base, 2699 * ms, true, true, time.Second},
		{"trust ends", base, 2700 * ms, false, false, time.Second},
		{"manual never due", with(base, func(l *heartbeat.Lease) { l.Manual = true }), 2 * time.Second, false, true, 2700 * ms},
		{"pending not due", with(base, func(l *heartbeat.Lease) { l.Pending = true }), 2 * time.Second, false, true, 2700 * ms},
		{"not before", with(base, func(l *heartbeat.Lease) { l.NotBefore = at(1500 * ms) }), 1400 * ms, false, true, 1500 * ms},
		{"after not before", with(base, func(l *heartbeat.Lease) { l.NotBefore = at(1500 * ms) }), 1500 * ms, true, true, 1500 * ms},
		{"custom margin", with(base, func(l *heartbeat.Lease) { l.Margin = time.Second }), 2 * time.Second, false, false, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := at(tt.now)
			if got := tt.l.Due(now); got != tt.due {
				t.Errorf("Due = %v, want %v", got, tt.due)
			}
			if got := tt.l.Trusted(now); got != tt.trusted {
				t.Errorf("Trusted = %v, want %v", got, tt.trusted)
			}
			if got := tt.l.NextEvent(); !got.Equal(at(tt.next)) {
				t.Errorf("NextEvent = %v, want %v", got.Sub(t0), tt.next)
			}
		})
	}
	if got := base.TrustedUntil(); !got.Equal(at(2700 * ms)) {
		t.Errorf("TrustedUntil = %v", got.Sub(t0))
	}
}

func with(l heartbeat.Lease, f func(*heartbeat.Lease)) heartbeat.Lease { f(&l); return l }

func TestRetryAt(t *testing.T) {
	t.Parallel()
	l := heartbeat.Lease{TTL: time.Second, Start: t0} // trusted until 900 ms
	for _, tt := range []struct{ failed, want time.Duration }{
		{400 * ms, 500 * ms},
		{850 * ms, 900 * ms}, // capped at the trust deadline
	} {
		if got := heartbeat.RetryAt(l, at(tt.failed)); !got.Equal(at(tt.want)) {
			t.Errorf("RetryAt(%v) = %v, want %v", tt.failed, got.Sub(t0), tt.want)
		}
	}
	short := heartbeat.Lease{TTL: 50 * ms, Start: t0}
	if got := heartbeat.RetryAt(short, at(0)); !got.Equal(at(10 * ms)) {
		t.Errorf("RetryAt floor = %v", got.Sub(t0))
	}
}

func TestCollectBatchesNeighbours(t *testing.T) {
	t.Parallel()
	ttl := 3 * time.Second
	leases := map[string]heartbeat.Lease{
		"a":       {TTL: ttl, Start: at(0)},                // due at 1 s
		"b":       {TTL: ttl, Start: at(200 * ms)},         // due at 1.2 s: within slack of a's tick
		"c":       {TTL: ttl, Start: at(500 * ms)},         // due at 1.5 s: next tick
		"gone":    {TTL: ttl, Start: at(-2 * time.Second)}, // trusted until 0.7 s
		"pending": {TTL: ttl, Start: at(0), Pending: true},
	}
	tick := heartbeat.Collect(at(time.Second), maps.All(leases))
	slices.Sort(tick.Due)
	if !slices.Equal(tick.Due, []string{"a", "b"}) {
		t.Errorf("Due = %v", tick.Due)
	}
	if !slices.Equal(tick.Lost, []string{"gone"}) {
		t.Errorf("Lost = %v", tick.Lost)
	}
	if !tick.Next.Equal(at(1500 * ms)) {
		t.Errorf("Next = %v", tick.Next.Sub(t0))
	}
	if empty := heartbeat.Collect(at(0), maps.All(map[int]heartbeat.Lease{})); !empty.Next.IsZero() || empty.Due != nil {
		t.Errorf("empty tick = %+v", empty)
	}
}

// TestLoopKeepsOrLosesInTime drives a miniature heartbeat loop on the fake
// clock of testing/synctest against a fake server that answers extends
// after a delay and starts failing at some point. While extends succeed
// the lease is kept; once they fail, the loop declares the lease lost
// strictly before the server would let anybody else have it.
func TestLoopKeepsOrLosesInTime(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		failFrom time.Duration // server stops answering ok from then on
		rtt      time.Duration
	}{
		{time.Hour, 40 * ms},
		{2 * time.Second, 40 * ms},
		{2 * time.Second, 300 * ms}, // slow round trips
		{0, 10 * ms},                // every extend fails
	} {
		t.Run(fmt.Sprintf("fail@%v/rtt%v", tt.failFrom, tt.rtt), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const ttl = time.Second
				start := time.Now()
				l := heartbeat.Lease{TTL: ttl, Start: start}
				serverExpiry := start.Add(ttl) // server time == local time here
				var lostAt time.Time
				for lostAt.IsZero() && time.Since(start) < 5*time.Second {
					tick := heartbeat.Collect(time.Now(), func(yield func(int, heartbeat.Lease) bool) { yield(0, l) })
					switch {
					case len(tick.Lost) == 1:
						lostAt = time.Now()
					case len(tick.Due) == 1:
						sent := time.Now()
						time.Sleep(tt.rtt) // fake clock: the round trip
						if time.Since(start) < tt.failFrom {
							serverExpiry = sent.Add(tt.rtt / 2).Add(ttl)
							l = heartbeat.Lease{TTL: ttl, Start: sent}
						} else {
							l.NotBefore = heartbeat.RetryAt(l, time.Now())
						}
					default:
						time.Sleep(time.Until(tick.Next))
					}
				}
				if tt.failFrom > 5*time.Second {
					if !lostAt.IsZero() {
						t.Fatalf("lost at %v although every extend succeeded", lostAt.Sub(start))
					}
					return
				}
				if lostAt.IsZero() {
					t.Fatal("never declared lost")
				}
				if !lostAt.Before(serverExpiry) {
					t.Fatalf("declared lost at %v, server expiry %v", lostAt.Sub(start), serverExpiry.Sub(start))
				}
			})
		})
	}
}
