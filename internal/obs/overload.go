package obs

import (
	"context"
	"log/slog"
	"time"
)

// OverloadInfo describes the Manager's shedding state when it changes.
type OverloadInfo struct {
	// RoundTrip is the slow round trip that made the Manager start
	// shedding (entering), or the slowest one while it shed (leaving).
	RoundTrip time.Duration
	// Op is that round trip's operation (OpAcquireMany, OpExtendMany …).
	Op DBOperation
	// Gap is the pause the Manager keeps between two acquire round trips
	// (entering: the first one; leaving: the longest one).
	Gap time.Duration
	// Lasted is how long the Manager shed (leaving only).
	Lasted time.Duration
}

// Overload records that the Manager started (on) or stopped shedding
// acquires because the database answered slowly: pglease.manager.overload
// is 1 while it sheds, and each change is one log record, Warn when it
// starts, Info when it stops. Safe from any goroutine; the Manager calls
// it on changes only.
func (r *Recorder) Overload(on bool, info OverloadInfo) {
	if r == nil {
		return
	}
	ctx := context.Background()
	if on {
		r.loop.overload.Store(1)
		r.log.LogAttrs(ctx, slog.LevelWarn,
			"pglease: the database is overloaded; acquires are held back so that held leases stay renewed",
			slog.Float64("round_trip", info.RoundTrip.Seconds()), slog.String("operation", string(info.Op)),
			slog.Float64("acquire_gap", info.Gap.Seconds()))
		return
	}
	r.loop.overload.Store(0)
	r.log.LogAttrs(ctx, slog.LevelInfo,
		"pglease: the database answers in time again; acquires are no longer held back",
		slog.Float64("lasted", info.Lasted.Seconds()), slog.Float64("slowest_round_trip", info.RoundTrip.Seconds()),
		slog.String("operation", string(info.Op)), slog.Float64("longest_acquire_gap", info.Gap.Seconds()))
}
