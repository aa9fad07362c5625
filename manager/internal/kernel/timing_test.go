package kernel

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/pglease/pglease/heartbeat"
)

var hbT0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func hbAt(d time.Duration) time.Time { return hbT0.Add(d) }

func TestHeartbeatHeldLeaseSchedule(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	base := heldLease{Lease: heartbeat.Lease{TTL: 3 * time.Second, Start: hbT0}} // margin 300 ms, slack 250 ms
	with := func(f func(*heldLease)) heldLease { l := base; f(&l); return l }
	for _, tt := range []struct {
		name    string
		l       heldLease
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
		{"manual never due", with(func(l *heldLease) { l.Manual = true }), 2 * time.Second, false, true, 2700 * ms},
		{"pending not due", with(func(l *heldLease) { l.Pending = true }), 2 * time.Second, false, true, 2700 * ms},
		{"not before", with(func(l *heldLease) { l.NotBefore = hbAt(1500 * ms) }), 1400 * ms, false, true, 1500 * ms},
		{"after not before", with(func(l *heldLease) { l.NotBefore = hbAt(1500 * ms) }), 1500 * ms, true, true, 1500 * ms},
		{"custom margin", with(func(l *heldLease) { l.Margin = time.Second }), 2 * time.Second, false, false, time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now := hbAt(tt.now)
			if got := tt.l.due(now); got != tt.due {
				t.Errorf("due = %v, want %v", got, tt.due)
			}
			if got := now.Before(tt.l.TrustedUntil()); got != tt.trusted {
				t.Errorf("trusted = %v, want %v", got, tt.trusted)
			}
			if got := tt.l.NextEvent(); !got.Equal(hbAt(tt.next)) {
				t.Errorf("NextEvent = %v, want %v", got.Sub(hbT0), tt.next)
			}
		})
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
		if got := ValidMargin(tt.ttl, tt.margin); got != tt.ok {
			t.Errorf("validMargin(%v, %v) = %v", tt.ttl, tt.margin, got)
		}
	}
}

// The Manager's default loss margin (Config.LossMargin zero) is the one
// package heartbeat documents for a zero Lease.Margin.
func TestHeartbeatDefaultLossMargin(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	for _, tt := range []struct{ ttl, want time.Duration }{
		{50 * ms, 10 * ms},
		{300 * ms, 30 * ms},
		{3 * time.Second, 300 * ms},
		{time.Hour, 5 * time.Second},
	} {
		if got := DefaultMargin(tt.ttl); got != tt.want {
			t.Errorf("defaultMargin(%v) = %v, want %v", tt.ttl, got, tt.want)
		}
	}
}

func TestHeartbeatCollectBatchesNeighbours(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	ttl := 3 * time.Second
	lease := func(start time.Duration) heartbeat.Lease { return heartbeat.Lease{TTL: ttl, Start: hbAt(start)} }
	leases := map[string]heldLease{
		"a":       {Lease: lease(0)},                // due at 1 s
		"b":       {Lease: lease(200 * ms)},         // due at 1.2 s: within slack of a's tick
		"c":       {Lease: lease(500 * ms)},         // due at 1.5 s: next tick
		"gone":    {Lease: lease(-2 * time.Second)}, // trusted until 0.7 s
		"pending": {Lease: lease(0), Pending: true},
	}
	tick := collectLeases(hbAt(time.Second), maps.All(leases))
	slices.Sort(tick.due)
	if !slices.Equal(tick.due, []string{"a", "b"}) {
		t.Errorf("due = %v", tick.due)
	}
	if !slices.Equal(tick.lost, []string{"gone"}) {
		t.Errorf("lost = %v", tick.lost)
	}
	if !tick.next.Equal(hbAt(1500 * ms)) {
		t.Errorf("next = %v", tick.next.Sub(hbT0))
	}
	if empty := collectLeases(hbAt(0), maps.All(map[int]heldLease{})); !empty.next.IsZero() || empty.due != nil {
		t.Errorf("empty tick = %+v", empty)
	}
}
