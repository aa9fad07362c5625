package telemetry

import (
	"context"
	"log/slog"
)

// ListenerPolling records that the Manager gave up listening for release
// notifications for good (its listening connection goes through a
// transaction-mode pooler, which does not keep a LISTEN with its client):
// waiters in this process then learn of releases in other processes by
// polling alone. One Warn log record with reason, and pglease.listener.polling
// goes up by one. Call it once per Manager.
func (r *Recorder) ListenerPolling(reason string) {
	if r == nil {
		return
	}
	r.listenPolling.Add(context.Background(), 1)
	r.log.LogAttrs(context.Background(), slog.LevelWarn,
		"pglease: not listening for release notifications; waiters poll for other processes' releases",
		slog.String("reason", reason))
}

// ConfigWarning logs one Warn record about a setting that works but
// weakens what the Manager can promise (e.g. a multi-host pool without
// connect_timeout), with the fix in msg.
func (r *Recorder) ConfigWarning(msg string) {
	if r == nil {
		return
	}
	r.log.LogAttrs(context.Background(), slog.LevelWarn, "pglease: "+msg)
}

// ReleaseTriggerMissing records that the lock table has no release
// trigger for the Manager's notify channel: releases by SyncGuard
// processes (which delete the row themselves) then wake this Manager's
// waiters only by polling. One Warn log record saying how to install it,
// and pglease.release_trigger.missing goes up by one. Call it once per
// Manager.
func (r *Recorder) ReleaseTriggerMissing(channel string) {
	if r == nil {
		return
	}
	r.triggerMissing.Add(context.Background(), 1)
	r.log.LogAttrs(context.Background(), slog.LevelWarn,
		"pglease: no release trigger on the lock table for this Manager's notify channel; "+
			"releases by SyncGuard processes wake waiters only by polling (install it with pg.Store.SetupReleaseTrigger)",
		slog.String("channel", channel))
}
