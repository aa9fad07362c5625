package telemetry

import (
	"context"
	"sync"
	"time"

	"github.com/pglease/pglease/internal/obs"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// waitState is what an acquisition's last refusal found: its reason and
// the holder identity the refusal named ("" when none: a SyncGuard
// holder, readers, a lock delay).
type waitState struct {
	reason obs.WaitReason
	holder string
}

// Waiting records why the acquire waits after a refusal (loop): reason,
// and holder, the identity the refusing holder recorded (its
// manager.Config.Holder, "program[pid]@host" by default; "" when the
// refusal named none). The first refusal and each change of reason or
// holder add a pglease.wait event to the acquire span; at its end the
// span carries the last ones as pglease.wait.reason and pglease.holder,
// and a contended acquire's wait is recorded in
// pglease.acquire.wait.duration under that reason.
func (a *acquisition) Waiting(reason obs.WaitReason, holder string) {
	if a == nil || reason == obs.WaitNone {
		return
	}
	reason = reason.Norm()
	a.flags.Or(flagContended)
	prevR := obs.WaitReason(a.waitReason.Swap(uint32(reason)))
	if prevR == obs.WaitNone {
		a.r.live.add(a) // for pglease.acquire.wait.longest, until it ends
		if a.state.Load() != stAcquiring {
			a.r.live.remove(a) // it ended meanwhile (finish removed it before the add)
		}
	}
	prevH := a.waitHolder.Swap(&holder)
	changed := prevR != reason || prevH == nil || *prevH != holder
	if changed && a.span.IsRecording() {
		attrs := []attribute.KeyValue{attrWaitReason.String(reason.String())}
		if holder != "" {
			attrs = append(attrs, attrHolder.String(holder))
		}
		a.span.AddEvent(eventWait, trace.WithAttributes(attrs...))
	}
}

func (a *acquisition) lastWait() waitState {
	w := waitState{reason: obs.WaitReason(a.waitReason.Load()).Norm()}
	if h := a.waitHolder.Load(); h != nil {
		w.holder = *h
	}
	return w
}

// live is the set of a recorder's acquisitions waiting after a refusal
// (from Waiting) or holding (from Granted),
// read by the pglease.lock.oldest.age and pglease.acquire.wait.longest
// callbacks. A sync.Map: recording (Store, Delete) never waits for a
// collection walking it.
type live struct{ m sync.Map }

func (l *live) add(a *acquisition)    { l.m.Store(a, struct{}{}) }
func (l *live) remove(a *acquisition) { l.m.Delete(a) }

// oldest returns the held lock granted longest ago and the acquisition
// waiting longest, at now (nil when none).
func (l *live) oldest(now time.Time) (held *acquisition, heldFor time.Duration, wait *acquisition, waitFor time.Duration) {
	l.m.Range(func(k, _ any) bool {
		a := k.(*acquisition)
		switch a.state.Load() {
		case stHeld:
			if d := a.heldFor(now); held == nil || d > heldFor {
				held, heldFor = a, d
			}
		case stAcquiring:
			if a.flags.Load()&flagContended == 0 || a.try {
				return true
			}
			if d := now.Sub(a.start); wait == nil || d > waitFor {
				wait, waitFor = a, d
			}
		}
		return true
	})
	return
}

// registerAges registers the callback of the two age gauges and
// pglease.listener.up.
func (r *recorder) registerAges(m metric.Meter) {
	oldest, err := m.Float64ObservableGauge(metricLockOldestAge,
		metric.WithUnit("s"),
		metric.WithDescription("How long the lock this process has held longest has been held, with its key hash and lock kind; no point when none is held."))
	if err != nil || oldest == nil {
		otel.Handle(err)
		oldest = nil
	}
	longest, err := m.Float64ObservableGauge(metricAcquireWaitLongest,
		metric.WithUnit("s"),
		metric.WithDescription("How long the acquire of this process that has waited longest for a held key has waited, with its key hash, lock kind and wait reason; no point when none waits."))
	if err != nil || longest == nil {
		otel.Handle(err)
		longest = nil
	}
	listenUp, err := m.Int64ObservableGauge(metricListenerUp,
		metric.WithUnit("{session}"),
		metric.WithDescription("1 while the Manager's listening session (release notifications, revocations, watch events) is connected, 0 while it is not; no point for a Manager that does not listen."))
	if err != nil || listenUp == nil {
		otel.Handle(err)
		listenUp = nil
	}
	var observed []metric.Observable
	if listenUp != nil {
		observed = append(observed, listenUp)
	}
	if oldest != nil {
		observed = append(observed, oldest)
	}
	if longest != nil {
		observed = append(observed, longest)
	}
	if len(observed) == 0 {
		return
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if v := r.listenUp.Load(); v != 0 && listenUp != nil {
			o.ObserveInt64(listenUp, v-1)
		}
		h, hd, w, wd := r.live.oldest(time.Now())
		if h != nil && oldest != nil {
			o.ObserveFloat64(oldest, hd.Seconds(), metric.WithAttributes(
				attrKeyHash.String(h.key.Hash()), attrLockKind.String(h.kind.String())))
		}
		if w != nil && longest != nil {
			o.ObserveFloat64(longest, wd.Seconds(), metric.WithAttributes(
				attrKeyHash.String(w.key.Hash()), attrLockKind.String(w.kind.String()),
				attrWaitReason.String(w.lastWait().reason.String())))
		}
		return nil
	}, observed...)
	if err != nil {
		otel.Handle(err)
		return
	}
	r.agesReg = reg
}

// holdDone records a lock's hold time when it ends (released or lost).
func (r *recorder) holdDone(a *acquisition, held time.Duration) {
	if held <= 0 {
		return
	}
	r.holdDuration.Record(context.Background(), held.Seconds(), r.kindOpt[a.kind].rec...)
}
