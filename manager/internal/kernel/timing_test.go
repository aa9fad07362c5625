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

// An extend batch gives up at the statement timeout, or at the earliest
// trust deadline of its leases when that comes first; and when the
// timeout leaves no lease of the batch time for a retry before its trust
// deadline, at the earliest of those deadlines: a late answer can still
// keep the leases, a retry could not.
func TestExtendDeadline(t *testing.T) {
	t.Parallel()
	const s = time.Second
	lease := func(ttl, start time.Duration) *holding {
		return &holding{lease: heldLease{Lease: heartbeat.Lease{TTL: ttl, Start: hbAt(start)}}}
	}
	for _, tt := range []struct {
		name     string
		now      time.Duration
		timeout  time.Duration
		batch    []*holding
		deadline time.Duration // after hbT0
		slack    time.Duration
	}{
		// TTL 60 s: due at 20 s, trusted until 54 s; a 5 s timeout at
		// 25 s leaves a retry (6 s later) well inside.
		{"a retry fits", 20 * s, 5 * s, []*holding{lease(60*s, 0)}, 25 * s, 5 * s},
		// TTL 10 s: due at 3.33 s, trusted until 9 s; a timeout at 8.33 s
		// and a retry 1 s later would come after 9 s.
		{"no room for a retry", 3333 * time.Millisecond, 5 * s, []*holding{lease(10*s, 0)}, 9 * s, 5 * s},
		// The trust deadline before the timeout bounds it, as always.
		{"trust ends first", 7 * s, 5 * s, []*holding{lease(10*s, 0)}, 9 * s, 2 * s},
		// Only when no lease of the batch could be retried: a lease
		// that could keeps the timeout, and its retry.
		{"one lease has room", 3333 * time.Millisecond, 5 * s, []*holding{lease(60*s, 0), lease(10*s, 0)}, 8333 * time.Millisecond, 5 * s},
		{"one lease of two has room", 3500 * time.Millisecond, 5 * s, []*holding{lease(10*s, 0), lease(10*s, s)}, 8500 * time.Millisecond, 5 * s},
		{"neither has room: the earliest deadline", 3500 * time.Millisecond, 5 * s, []*holding{lease(10*s, 500*time.Millisecond), lease(10*s, 0)}, 9 * s, 5 * s},
		{"every lease has room", 20 * s, 5 * s, []*holding{lease(60*s, 0), lease(60*s, 10*s)}, 25 * s, 5 * s},
		// Exactly at the edge: timeout + retry gap = trust deadline.
		{"retry at the deadline", 3 * s, 5 * s, []*holding{lease(10*s, 0)}, 9 * s, 5 * s},
		{"retry just before the deadline", 2999 * time.Millisecond, 5 * s, []*holding{lease(10*s, 0)}, 7999 * time.Millisecond, 5 * s},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, slack := extendDeadline(hbAt(tt.now), tt.timeout, tt.batch)
			if !d.Equal(hbAt(tt.deadline)) || slack != tt.slack {
				t.Errorf("extendDeadline = %v, %v; want %v, %v", d.Sub(hbT0), slack, tt.deadline, tt.slack)
			}
		})
	}
}

// A lost lease's row is kept (for its release) until the server has
// expired it for sure, whatever its last extend of unknown outcome did:
// that extend may have run until its deadline (extendDeadline), the trust
// deadline when no retry fitted, and pushed the expiry TTL past it.
func TestKeptUntilCoversExtendDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 5 * time.Second
	st := &LoopState{m: &Kernel{cfg: Config{StatementTimeout: timeout}}}
	for _, ttl := range []time.Duration{time.Second, 10 * time.Second, 60 * time.Second, time.Hour} {
		for _, sentAt := range []time.Duration{ttl / 4, ttl / 3, ttl / 2, ttl * 8 / 10} {
			h := &holding{lock: &Hold{TTL: ttl}, lease: heldLease{Lease: heartbeat.Lease{TTL: ttl, Start: hbT0}}}
			if !hbAt(sentAt).Before(h.lease.TrustedUntil()) {
				continue
			}
			deadline, _ := extendDeadline(hbAt(sentAt), timeout, []*holding{h})
			h.unknownStart = hbAt(sentAt)
			if got, need := st.keptUntil(h), deadline.Add(ttl); got.Before(need) {
				t.Errorf("TTL %v, extend sent at %v: kept until %v, but the server may keep the row until %v",
					ttl, sentAt, got.Sub(hbT0), need.Sub(hbT0))
			}
		}
	}
}
