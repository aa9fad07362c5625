// Package obs is the seam between the code that reports pglease's
// events (the Manager, advisory.Client, the notifier) and the recorder
// that turns them into spans, metrics and log records, which is the
// public package github.com/pglease/pglease/telemetry, as unexported
// types. This package holds what the callers keep and pass: the handles
// (Recorder, Acquisition, DBSpan, Heartbeat, Release, Loop), each a thin
// forward to the recorder, and the values (LockKind, AttemptOutcome,
// LossCause, WaitReason, Queue, DBOperation, KeyID, the Info structs).
// Package telemetry registers its recorder here in its init (Register);
// New builds a Recorder with it, and panics when none is registered for
// the configuration's type (package telemetry not linked: a build
// mistake, never a silent loss of spans). Every program that builds a
// Manager links telemetry, since manager.Config holds a telemetry.Config.
//
// Why not the recorder in telemetry as exported API, or under
// telemetry/internal: the first would add 114 exported names to the
// public API, the second could not be imported by manager (Go's internal
// rule). Why not the recorder here: the names and what is emitted belong
// with the table that documents them (telemetry/doc.go), where
// TestNamesMatchDocTable holds one to the other. The package is named obs
// so that "telemetry." in the Manager means the public package.
//
// A nil *Recorder, a nil *Acquisition, a nil *Loop and the zero DBSpan,
// Heartbeat and Release are valid and record nothing. Each Acquisition
// reaches one end state (granted, failed, not acquired) and a granted
// one is counted out of pglease.lock.held once (released or lost),
// whatever goroutines race to end it. Unknown enum values are clamped.
//
// # Where the Manager calls what
//
//	caller  Acquire/TryAcquire/Do: k := rec.Key(key); ctx, a := rec.StartAcquire(ctx, k, info)
//	loop    on enqueue: a.Queued(QueueInfo{...})
//	loop    per batch: the parent (the one key's head waiter's acquire span, the one release's span) and the
//	        spans it serves (every waiter's, release's, extended lock's acquire span), which its span links to
//	worker  per round trip: dctx, db := rec.StartDB(ctx, OpAcquireMany, n, parent, served...); …; db.End(ok, err)
//	loop    on each attempt result, per waiter served: a.Attempt(db.SpanContext(), outcome, retryIn)
//	loop    on grant, before replying: a.Granted(fence)
//	caller  on any other answer (error, ctx ended, closed): a.Failed(err); Try found it held: a.NotAcquired()
//	        (both no-ops if the loop granted first, e.g. a grant it took back from a caller who left)
//	loop    per extend batch: _, hb := rec.StartHeartbeat(ctx, n); the extend's StartDB has parent hb.SpanContext()
//	        and serves the extended locks' acquire spans;
//	        per lock a.Extended(lag) / a.ExtendFailed(err) / a.Lost(cause, db.SpanContext()); hb.End(ext, lost, err)
//	loop    when it releases a held lock (Lock.Release passes the caller's span context in the request; a
//	        taken-back grant; Close): rctx, rel := a.StartRelease(ctx); rel.Served(db.SpanContext()); rel.End(err)
//	loop    around its select: l := rec.Loop(); l.Idle() before select, l.Busy() after; l.SetDepth(q, n)
//	listen  once per Manager: rec.ReleaseTrigger(installed, channel) (metric; Info record when missing)
//	Close   rec.Close() after the loop stopped (unregisters metric callbacks, takes the Manager out of
//	        pglease.release_trigger.installed)
package obs
