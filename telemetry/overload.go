package telemetry

import (
	"context"
	"log/slog"

	"github.com/pglease/pglease/internal/obs"
)

// Overload records that the Manager started (on) or stopped shedding
// acquires because the database answered slowly: pglease.manager.overload
// is 1 while it sheds, and each change is one log record, Warn when it
// starts, Info when it stops. Safe from any goroutine; the Manager calls
// it on changes only.
func (r *recorder) Overload(on bool, info obs.OverloadInfo) {
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
