package obs

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Loop measures the Manager loop: how busy it is (as hashicorp/raft's
// saturationMetric does) and the depth of its queues. Busy and Idle are
// for the loop goroutine only; SetDepth may be called from any goroutine.
// Each costs a clock read or an atomic store, and nothing else: the
// numbers are read by the MeterProvider's collection, through callbacks.
// A nil *Loop is valid and records nothing.
type Loop struct {
	now  func() time.Time
	base time.Time

	busySince atomic.Int64 // 1 + ns since base when busy began; 0 = idle
	busyTotal atomic.Int64 // ns busy in completed busy periods
	depth     [numQueues]atomic.Int64
	overload  atomic.Int64 // 1 while the Manager sheds acquires (Recorder.Overload)

	mu        sync.Mutex // guards the fields below (collection only)
	lastObs   int64
	lastBusy  int64
	lastRatio float64
}

func newLoop(_ *Recorder, now func() time.Time) *Loop {
	l := &Loop{now: now, base: now()}
	return l
}

func (l *Loop) nanos() int64 { return int64(l.now().Sub(l.base)) }

// Loop returns the Recorder's loop meter (one per Recorder, so one
// Recorder per Manager). Nil for a nil Recorder.
func (r *Recorder) Loop() *Loop {
	if r == nil {
		return nil
	}
	return r.loop
}

// Busy marks the start of work: call it right after the loop's select
// returns.
func (l *Loop) Busy() {
	if l == nil {
		return
	}
	l.busySince.Store(l.nanos() + 1)
}

// Idle marks the end of work: call it right before the loop blocks in its
// select.
func (l *Loop) Idle() {
	if l == nil {
		return
	}
	if s := l.busySince.Swap(0); s != 0 {
		if d := l.nanos() - (s - 1); d > 0 {
			l.busyTotal.Add(d)
		}
	}
}

// SetDepth sets the current depth of queue q.
func (l *Loop) SetDepth(q Queue, n int) {
	if l == nil || q >= numQueues {
		return
	}
	l.depth[q].Store(int64(n))
}

// busyRatio returns the share of time the loop was busy since the last
// call (in [0, 1]); the first call covers the time since New.
func (l *Loop) busyRatio() float64 {
	now := l.nanos()
	total := l.busyTotal.Load()
	if s := l.busySince.Load(); s != 0 && now > s-1 {
		total += now - (s - 1)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now <= l.lastObs {
		return l.lastRatio
	}
	ratio := float64(total-l.lastBusy) / float64(now-l.lastObs)
	ratio = min(max(ratio, 0), 1)
	l.lastObs, l.lastBusy, l.lastRatio = now, total, ratio
	return ratio
}

func (l *Loop) register(r *Recorder, m metric.Meter) {
	busy, err := m.Float64ObservableGauge(metricManagerLoopBusy,
		metric.WithUnit("1"),
		metric.WithDescription("Share of time the Manager loop spent working (not waiting in select) since the previous collection."))
	if err != nil {
		otel.Handle(err)
	}
	depth, err2 := m.Int64ObservableGauge(metricManagerQueueDepth,
		metric.WithUnit("{item}"),
		metric.WithDescription("Items waiting in the Manager's queues, by queue."))
	if err2 != nil {
		otel.Handle(err2)
	}
	over, err3 := m.Int64ObservableGauge(metricManagerOverload,
		metric.WithUnit("1"),
		metric.WithDescription("1 while the Manager holds back acquires because the database answers slowly (held leases are renewed first), 0 otherwise."))
	if err3 != nil {
		otel.Handle(err3)
	}
	var obs []metric.Observable
	if err == nil && busy != nil {
		obs = append(obs, busy)
	} else {
		busy = nil
	}
	if err2 == nil && depth != nil {
		obs = append(obs, depth)
	} else {
		depth = nil
	}
	if err3 == nil && over != nil {
		obs = append(obs, over)
	} else {
		over = nil
	}
	if len(obs) == 0 {
		return
	}
	var qOpt [numQueues]metric.ObserveOption
	for q := range numQueues {
		qOpt[q] = metric.WithAttributeSet(attribute.NewSet(attrQueue.String(q.String())))
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if busy != nil {
			o.ObserveFloat64(busy, l.busyRatio())
		}
		if depth != nil {
			for q := range numQueues {
				o.ObserveInt64(depth, l.depth[q].Load(), qOpt[q])
			}
		}
		if over != nil {
			o.ObserveInt64(over, l.overload.Load())
		}
		return nil
	}, obs...)
	if err != nil {
		otel.Handle(err)
		return
	}
	r.reg = reg
}
