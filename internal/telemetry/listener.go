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
