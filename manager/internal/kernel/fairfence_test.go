package kernel

import (
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
)

// A permit's grant reported by an attempt may have been made before the
// attempt, by another process's release serving the queue, while this
// Manager had not heard of it yet and had seen a later permit's fence
// meanwhile. Its fence is then below the attempt's floor, and still
// above every fence seen when a statement last found the ticket queued:
// it is no regression. A ticket that no statement found queued yet is
// held to the attempt's floor.
func TestFairPermitFenceAgainstItsTicketsFloor(t *testing.T) {
	var st LoopState
	for _, tc := range []struct {
		name   string
		queued bool          // a statement found the ticket queued before
		qfloor pglease.Fence // the highest fence seen when that statement was sent
		fence  pglease.Fence
		want   bool
	}{
		{"granted before the attempt, above the ticket's floor", true, 5, 10, true},
		{"at the ticket's floor", true, 10, 10, false},
		{"below the ticket's floor", true, 12, 10, false},
		{"never found queued: the attempt's floor", false, 0, 10, false},
		{"never found queued, above the attempt's floor", false, 0, 12, true},
	} {
		ks := &KeyState{Key: "k", Fence: 11, HasFence: true}
		req := &AcquireReq{Key: "k", Shared: true, Limit: 2, qfloor: tc.qfloor}
		if tc.queued {
			req.qsent = time.Now()
		}
		k := &fairKind{reqs: []*AcquireReq{req}, hasFloor: true, floor: 11}
		a := &Attempt{Ks: ks, Kind: k}
		if got := k.FenceOK(&st, a, 0, 1, []store.AcquireResult{{OK: true, Fence: tc.fence}}); got != tc.want {
			t.Errorf("%s: FenceOK = %v, want %v", tc.name, got, tc.want)
		}
	}
}
