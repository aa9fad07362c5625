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
func (r *recorder) ListenerPolling(reason string) {
	if r == nil {
		return
	}
	r.listenPolling.Add(context.Background(), 1)
	r.listenUp.Store(1) // pglease.listener.up 0: not listening, for good
	r.log.LogAttrs(context.Background(), slog.LevelWarn,
		"pglease: not listening for release notifications; waiters poll for other processes' releases",
		slog.String("reason", reason))
}

// ConfigWarning logs one Warn record about a setting that works but
// weakens what the Manager can promise (e.g. a multi-host pool without
// connect_timeout), with the fix in msg.
func (r *recorder) ConfigWarning(msg string) {
	if r == nil {
		return
	}
	r.log.LogAttrs(context.Background(), slog.LevelWarn, "pglease: "+msg)
}

// ReleaseTrigger records whether the lock table has the release trigger
// for the Manager's notify channel: pglease.release_trigger.installed is
// 1 for this Manager when it has, 0 when it has not (until Close). Without
// the trigger, releases by SyncGuard processes sharing the tables (which
// delete the row themselves, without NOTIFY) wake this Manager's waiters
// only by polling; a fleet of pglease Managers alone does not need it, so
// a missing trigger is one Debug log record saying how to install it, and
// one Info record later only if this Manager meets a SyncGuard holder
// (ForeignHolder). Call it once per Manager.
func (r *recorder) ReleaseTrigger(installed bool, channel string) {
	if r == nil {
		return
	}
	ctx := context.Background()
	if !installed {
		r.triggerInstalled.Add(ctx, 0) // the series exists, at 0
		r.missingTrigger.Store(&channel)
		r.log.LogAttrs(ctx, slog.LevelDebug,
			"pglease: no release trigger on the lock table for this Manager's notify channel; "+
				"releases by SyncGuard processes sharing the tables, if any, wake waiters here by polling only "+
				"(install it with migrate.Migrator.SetupReleaseTrigger)",
			slog.String("channel", channel))
		return
	}
	if r.trigger.CompareAndSwap(triggerUnknown, triggerCounted) {
		r.triggerInstalled.Add(ctx, 1)
	}
}

// States of recorder.trigger: whether this Manager counts in
// pglease.release_trigger.installed, which Close undoes.
const (
	triggerUnknown int32 = iota
	triggerCounted
	triggerClosed
)

// ForeignHolder records that an attempt of this Manager found a key held
// by a holder without a holder identity (a SyncGuard process). When the
// lock table has no release trigger for the Manager's channel
// (ReleaseTrigger said so), the first one logs one Info record: that
// holder's releases reach this Manager's waiters by polling only. Loop.
func (r *recorder) ForeignHolder() {
	if r == nil {
		return
	}
	ch := r.missingTrigger.Load()
	if ch == nil || !r.foreignLogged.CompareAndSwap(false, true) {
		return
	}
	r.log.LogAttrs(context.Background(), slog.LevelInfo,
		"pglease: a SyncGuard process (a holder without a pglease holder identity) holds keys this Manager waits for, "+
			"and the lock table has no release trigger for this Manager's notify channel: its releases wake waiters here by polling only "+
			"(install it with migrate.Migrator.SetupReleaseTrigger)",
		slog.String("channel", *ch))
}

// ListenerUp records whether the Manager's listening session is connected
// and subscribed (true) or not (false: connecting again, or given up for
// polling): pglease.listener.up is 1 or 0 from the first call on (a
// Manager that never listens reports no point). Listener goroutine.
func (r *recorder) ListenerUp(up bool) {
	if r == nil {
		return
	}
	v := int64(1) // known, down
	if up {
		v = 2
	}
	r.listenUp.Store(v)
}
