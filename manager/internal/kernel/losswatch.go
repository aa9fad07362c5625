package kernel

import (
	"sync"
	"time"

	"github.com/pglease/pglease/heartbeat"
)

// lossWatch ends the leases whose trust window passed (timely loss signal): the loss
// deadline of every held lease sits in one min-heap, and one runtime timer
// (time.AfterFunc, so its callback runs in a goroutine of its own) fires
// at the earliest. The callback cancels the lock's context by itself and
// then nudges the loop on lossCh, exactly as a per-lock timer did: a busy
// or stuck loop does not delay a loss signal. The loop only takes the
// mutex for O(log n) heap updates, never while it waits for anything.
//
// One heap entry costs a pointer and 16 bytes in the holding, where a
// per-lock timer cost its runtime timer and callback closure (≈ 200 bytes
// of heap per held lock).
//
// Removing an entry (the lease was extended or dropped) does not re-arm the
// timer: a timer set for a deadline that went away fires, finds nothing
// due, and is set for the new earliest one.
type lossWatch struct {
	epoch time.Time // deadlines are nanoseconds after epoch (on now's clock)
	fired func(*Hold)
	now   func() time.Time // the Manager's clock (Manager.now); set before the first start

	mu    sync.Mutex
	heap  []*holding // min-heap on lossAt; holding.lossIdx is the position
	timer *time.Timer
	armed int64 // the timer's deadline (nanoseconds after epoch); 0: not armed
}

// newLossWatch returns a watch whose timer calls fired (from its own
// goroutine, never holding the watch's mutex) for each lease whose
// deadline passed.
func newLossWatch(fired func(*Hold)) *lossWatch {
	w := &lossWatch{epoch: heartbeat.Now(), fired: fired, now: heartbeat.Now}
	w.timer = time.AfterFunc(time.Hour, w.fire)
	w.timer.Stop()
	return w
}

func (w *lossWatch) at(t time.Time) int64 {
	// +1 keeps every deadline above 0, the "not armed" value.
	return max(int64(t.Sub(w.epoch)), 0) + 1
}

// Start watches h's lease: its lock is ended as lost at deadline unless
// stop is called first. h must not be watched already.
func (w *lossWatch) Start(h *holding, deadline time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h.lossAt = w.at(deadline)
	h.lossFired = false
	w.push(h)
	if w.armed == 0 || h.lossAt < w.armed {
		w.armed = h.lossAt
		w.timer.Reset(deadline.Sub(w.now()))
	}
}

// stop stops watching h and reports whether it was still watched: false
// when its deadline already fired (as time.Timer.Stop).
func (w *lossWatch) stop(h *holding) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.lossIdx < 0 {
		return false
	}
	w.remove(int(h.lossIdx))
	return !h.lossFired
}

// Close stops the timer; leases still watched are no longer ended.
func (w *lossWatch) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer.Stop()
	w.armed = 0
}

// fire is the timer's callback: it ends every lease whose deadline passed
// and sets the timer for the next one.
func (w *lossWatch) fire() {
	var due []*Hold
	w.mu.Lock()
	now := int64(w.now().Sub(w.epoch)) + 1
	for len(w.heap) > 0 && w.heap[0].lossAt <= now {
		h := w.heap[0]
		w.remove(0)
		h.lossFired = true
		due = append(due, h.lock)
	}
	w.armed = 0
	if len(w.heap) > 0 {
		w.armed = w.heap[0].lossAt
		w.timer.Reset(time.Duration(w.armed - now))
	}
	w.mu.Unlock()
	for _, l := range due {
		w.fired(l)
	}
}

// The heap (container/heap's algorithms on the concrete type: no
// interface conversions). Called with mu held.

func (w *lossWatch) push(h *holding) {
	h.lossIdx = int32(len(w.heap))
	w.heap = append(w.heap, h)
	w.up(len(w.heap) - 1)
}

func (w *lossWatch) remove(i int) {
	n := len(w.heap) - 1
	h := w.heap[i]
	if i != n {
		w.swap(i, n)
	}
	w.heap[n] = nil
	w.heap = w.heap[:n]
	h.lossIdx = -1
	if i != n {
		if !w.down(i) {
			w.up(i)
		}
	}
	if n == 0 || cap(w.heap) > 1024 && n < cap(w.heap)/4 {
		w.heap = append([]*holding(nil), w.heap...) // give back what a past peak took
	}
}

func (w *lossWatch) swap(i, j int) {
	w.heap[i], w.heap[j] = w.heap[j], w.heap[i]
	w.heap[i].lossIdx = int32(i)
	w.heap[j].lossIdx = int32(j)
}

func (w *lossWatch) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if w.heap[i].lossAt <= w.heap[j].lossAt {
			break
		}
		w.swap(i, j)
		j = i
	}
}

func (w *lossWatch) down(i0 int) bool {
	i, n := i0, len(w.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && w.heap[r].lossAt < w.heap[l].lossAt {
			j = r
		}
		if w.heap[i].lossAt <= w.heap[j].lossAt {
			break
		}
		w.swap(i, j)
		i = j
	}
	return i > i0
}
