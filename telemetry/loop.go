package telemetry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglease/pglease/internal/obs"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// loop measures the Manager loop: how busy it is (as hashicorp/raft's
// saturationMetric does) and the depth of its queues. Busy and Idle are
// for the loop goroutine only; SetDepth may be called from any goroutine.
// Each costs a clock read or an atomic store, and nothing else: the
// numbers are read by the MeterProvider's collection, through callbacks.
// (obs.Loop is its handle; a nil *obs.Loop records nothing.)
type loop struct {
	now  func() time.Time
	base time.Time

	busySince atomic.Int64 // 1 + ns since base when busy began; 0 = idle
	busyTotal atomic.Int64 // ns busy in completed busy periods
	depth     [obs.NumQueues]atomic.Int64
	overload  atomic.Int64 // 1 while the Manager sheds acquires (recorder.Overload)

	mu        sync.Mutex // guards the fields below (collection only)
	lastObs   int64
	lastBusy  int64
	lastRatio float64
}

func newLoop(_ *recorder, now func() time.Time) *loop {
	l := &loop{now: now, base: now()}
	return l
}

func (l *loop) nanos() int64 { return int64(l.now().Sub(l.base)) }

// Loop returns the recorder's loop meter (one per recorder, so one
// recorder per Manager).
func (r *recorder) Loop() obs.LoopImpl {
	return r.loop
}

// Busy marks the start of work: call it right after the loop's select
// returns.
func (l *loop) Busy() {
	if l == nil {
		return
	}
	l.busySince.Store(l.nanos() + 1)
}

// Idle marks the end of work: call it right before the loop blocks in its
// select.
func (l *loop) Idle() {
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
func (l *loop) SetDepth(q obs.Queue, n int) {
	if l == nil || q >= obs.NumQueues {
		return
	}
	l.depth[q].Store(int64(n))
}

// busyRatio returns the share of time the loop was busy since the last
// call (in [0, 1]); the first call covers the time since New.
func (l *loop) busyRatio() float64 {
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

func (l *loop) register(r *recorder, m metric.Meter) {
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
	var observed []metric.Observable
	if err == nil && busy != nil {
		observed = append(observed, busy)
	} else {
		busy = nil
	}
	if err2 == nil && depth != nil {
		observed = append(observed, depth)
	} else {
		depth = nil
	}
	if err3 == nil && over != nil {
		observed = append(observed, over)
	} else {
		over = nil
	}
	if len(observed) == 0 {
		return
	}
	var qOpt [obs.NumQueues]metric.ObserveOption
	for q := range obs.NumQueues {
		qOpt[q] = metric.WithAttributeSet(attribute.NewSet(attrQueue.String(q.String())))
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if busy != nil {
			o.ObserveFloat64(busy, l.busyRatio())
		}
		if depth != nil {
			for q := range obs.NumQueues {
				o.ObserveInt64(depth, l.depth[q].Load(), qOpt[q])
			}
		}
		if over != nil {
			o.ObserveInt64(over, l.overload.Load())
		}
		return nil
	}, observed...)
	if err != nil {
		otel.Handle(err)
		return
	}
	r.reg = reg
}
