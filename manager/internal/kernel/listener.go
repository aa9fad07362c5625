package kernel

import (
	"time"

	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager/internal/notifier"
)

// The listener is a service of its own (package notifier): one goroutine
// that owns the listening connection — LISTEN on the notify channel, a
// probe every second by the clock (the server's idle_session_timeout
// never ends a live listener), reconnects with backoff and a resync after
// each — and holds on its session the subscriptions the loop asks for.
// The loop's end is st.lis (a notifier.Link): the loop's parts subscribe
// there by topic and get what the service hears through Deliver, on the
// loop:
//
//   - notifier.Wake, the kernel's release wake-ups (waiters.go): a key's
//     subscription is its waiter lock; a release of it wakes its waiters;
//   - notifier.Watch, watches (watch.go): a key's subscription is its
//     watch lock; its changes become watch events;
//   - notifier.Revoke and notifier.ReleaseRequest, revocation (revoke.go):
//     channel-wide, no subscription per key.
//
// A resync (the service reconnected: notifications were lost) goes to
// every topic's subscriber, as does the service's end for good (a
// transaction-mode pooler). Revoke and RequestRelease post their own
// notices to the loop on the same channel (notifyCh), so that this
// process's holders learn at once.

// listenerLink is the loop's end of the listening service.
type listenerLink = notifier.Link

// notice is what comes on notifyCh: from the listening service, or from
// Revoke and RequestRelease (notifier.Of).
type notice = notifier.Notice

// startListener subscribes the loop's parts to their topics and, unless
// notifications are off (Config.DisableNotify), starts the listening
// service.
func (st *LoopState) startListener() {
	st.lis.Handle(notifier.Wake, notifier.Handler{
		Notice:     func(n notifier.Notice) { st.handleWake(n.Hash) },
		Registered: st.handleRegistered,
		Resync:     st.resyncWaiters,
	})
	st.lis.Handle(notifier.Watch, notifier.Handler{
		Notice:     func(n notifier.Notice) { st.handleWatchNotice(n.Note) },
		Registered: st.handleWatchesRegistered,
		Resync:     st.watchResync,
		Ended:      st.closeWatches, // nothing reports their changes any more
	})
	st.lis.Handle(notifier.Revoke, notifier.Handler{
		Notice: func(n notifier.Notice) { st.handleRevoked(n.Note) },
	})
	st.lis.Handle(notifier.ReleaseRequest, notifier.Handler{
		Notice: func(n notifier.Notice) { st.handleReleaseRequest(n.Note) },
	})
	st.lis.Handle(notifier.Turn, notifier.Handler{
		Notice: func(n notifier.Notice) {
			st.sig().Turn.signal(n.Turn.Granted)
			st.handleTurn(n.Turn) // fair.go
		},
		Resync: st.fairResync,
	})
	m := st.m
	if m.cfg.DisableNotify {
		return
	}
	cfg := notifier.Config{
		Conn:             m.listenCfg,
		Channel:          m.cfg.NotifyChannel,
		QueueChannel:     m.qch,
		DefaultChannel:   DefaultNotifyChannel,
		StatementTimeout: m.cfg.StatementTimeout,
		Store:            store.Config(m.StoreCfg),
		Rec:              m.Rec,
		Liveness:         connx.DefaultLiveness,
		ProbeEvery:       notifier.ProbeInterval,
		ProbeTimeout:     notifier.ProbeTimeout,
		ConfigureConn:    m.Test.ListenConfig,
	}
	if m.Test.ListenIdleTimeout > 0 {
		cfg.Liveness.IdleTimeout = m.Test.ListenIdleTimeout
	}
	cfg.IdleProbeEvery = max(cfg.ProbeEvery, min(notifier.IdleProbeInterval, cfg.Liveness.IdleTimeout/3))
	if m.Test.ListenProbe > 0 {
		cfg.ProbeEvery, cfg.ProbeTimeout, cfg.IdleProbeEvery = m.Test.ListenProbe, m.Test.ListenProbe, m.Test.ListenProbe
	}
	if sig := m.Sig; sig != nil {
		cfg.Polling = func() { sig.Polling.signal(struct{}{}) }
		cfg.TriggerChecked = func(ok bool) { sig.TriggerChecked.signal(ok) }
		cfg.ProbeFailed = func() { sig.ListenerProbeFailed.signal(struct{}{}) }
	}
	st.lis.Start(cfg, m.notifyCh)
}

// listenerIdleAfter is how long the loop waits for nothing before the
// listener may probe at its idle pace: a caller that waits again soon (a
// worker's next cycle) finds the listener as it left it, and the
// service is not woken for every wait that begins and ends.
const listenerIdleAfter = 10 * time.Second

// markListener tells the listener whether anything here waits for a
// notice: a caller waiting for a key or a set, a ticket of the fair
// queue (or a stray one, whose grant a turn notice brings), a watch. The
// listener probes every ProbeInterval while something does, and every
// IdleProbeInterval once nothing has for listenerIdleAfter (the loop's
// timer comes back for that, nextListenerIdle). Run after every event.
func (st *LoopState) markListener() {
	waits := st.waiting > 0 || len(st.fq.byLock) > 0 || len(st.fq.setTix) > 0 || len(st.fq.strays) > 0 || len(st.watch.keys) > 0
	switch {
	case waits && !st.lisActive:
		st.lisActive, st.lisIdleAt = true, time.Time{}
		st.lis.SetActive(true)
	case waits:
		st.lisIdleAt = time.Time{}
	case !st.lisActive:
	case st.lisIdleAt.IsZero():
		st.lisIdleAt = st.m.Now().Add(listenerIdleAfter)
	case !st.m.Now().Before(st.lisIdleAt):
		st.lisActive, st.lisIdleAt = false, time.Time{}
		st.lis.SetActive(false)
	}
}

// nextListenerIdle is when markListener may let the listener go idle
// (zero: nothing to do).
func (st *LoopState) nextListenerIdle() time.Time { return st.lisIdleAt }
