package heartbeat_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pglease/pglease/heartbeat"
)

const ms = time.Millisecond

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestHeartbeatDefaultMargin(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ ttl, want time.Duration }{
		{50 * ms, 10 * ms},
		{300 * ms, 30 * ms},
		{time.Second, 100 * ms},
		{30 * time.Second, 3 * time.Second},
		{time.Hour, 5 * time.Second},
	} {
		// A zero Margin: the window ends the default margin before t0 + ttl.
		if got := tt.ttl - (heartbeat.Lease{TTL: tt.ttl, Start: t0}).TrustedUntil().Sub(t0); got != tt.want {
			t.Errorf("ttl %v: default margin %v, want %v", tt.ttl, got, tt.want)
		}
		// From the auto-extend floor up, the default window reaches past
		// the first extend.
		if l := (heartbeat.Lease{TTL: tt.ttl, Start: t0}); tt.ttl >= heartbeat.MinAutoExtendTTL && !l.NextExtend().Before(l.TrustedUntil()) {
			t.Errorf("ttl %v: extend at %v is not before the end of trust at %v", tt.ttl, l.NextExtend().Sub(t0), l.TrustedUntil().Sub(t0))
		}
	}
}

func TestHeartbeatLeaseSchedule(t *testing.T) {
	t.Parallel()
	base := heartbeat.Lease{TTL: 3 * time.Second, Start: t0} // margin 300 ms
	for _, tt := range []struct {
		name    string
		l       heartbeat.Lease
		now     time.Duration
		trusted bool
	}{
		{"fresh", base, 0, true},
		{"due", base, time.Second, true},
		{"late but trusted", base, 2699 * ms, true},
		{"trust ends", base, 2700 * ms, false},
		{"custom margin", heartbeat.Lease{TTL: 3 * time.Second, Start: t0, Margin: time.Second}, 2 * time.Second, false},
		{"custom margin, before", heartbeat.Lease{TTL: 3 * time.Second, Start: t0, Margin: time.Second}, 1999 * ms, true},
	} {
		if got := at(tt.now).Before(tt.l.TrustedUntil()); got != tt.trusted {
			t.Errorf("%s: trusted at %v = %v, want %v", tt.name, tt.now, got, tt.trusted)
		}
	}
	if got := base.NextExtend(); !got.Equal(at(time.Second)) {
		t.Errorf("NextExtend = %v", got.Sub(t0))
	}
	if got := base.TrustedUntil(); !got.Equal(at(2700 * ms)) {
		t.Errorf("TrustedUntil = %v", got.Sub(t0))
	}
}

func TestHeartbeatRetryAt(t *testing.T) {
	t.Parallel()
	l := heartbeat.Lease{TTL: time.Second, Start: t0} // trusted until 900 ms
	for _, tt := range []struct{ failed, want time.Duration }{
		{400 * ms, 500 * ms},
		{850 * ms, 900 * ms}, // capped at the trust deadline
	} {
		if got := l.RetryAt(at(tt.failed)); !got.Equal(at(tt.want)) {
			t.Errorf("RetryAt(%v) = %v, want %v", tt.failed, got.Sub(t0), tt.want)
		}
	}
	short := heartbeat.Lease{TTL: 50 * ms, Start: t0}
	if got := short.RetryAt(at(0)); !got.Equal(at(10 * ms)) {
		t.Errorf("RetryAt floor = %v", got.Sub(t0))
	}
}

// TestHeartbeatLoopKeepsOrLosesInTime drives a miniature heartbeat loop,
// as a pg.Store user writes it, on the fake clock of testing/synctest
// against a fake server that answers extends after a delay and starts
// failing at some point. While extends succeed the lease is kept; once
// they fail, the loop declares the lease lost strictly before the server
// would let anybody else have it.
func TestHeartbeatLoopKeepsOrLosesInTime(t *testing.T) {
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
				next := l.NextExtend()
				serverExpiry := start.Add(ttl) // server time == local time here
				var lostAt time.Time
				for lostAt.IsZero() && time.Since(start) < 5*time.Second {
					switch now := time.Now(); {
					case !now.Before(l.TrustedUntil()):
						lostAt = now
					case !now.Before(next):
						sent := now
						time.Sleep(tt.rtt) // fake clock: the round trip
						if time.Since(start) < tt.failFrom {
							serverExpiry = sent.Add(tt.rtt / 2).Add(ttl)
							l = heartbeat.Lease{TTL: ttl, Start: sent}
							next = l.NextExtend()
						} else {
							next = l.RetryAt(time.Now())
						}
					default:
						time.Sleep(earlier(next, l.TrustedUntil()).Sub(now))
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

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
