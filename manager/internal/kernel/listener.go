package kernel

import (
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
		Ended:      st.waitersUnlistened,
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
	if m.Test.ListenProbe > 0 {
		cfg.ProbeEvery, cfg.ProbeTimeout = m.Test.ListenProbe, m.Test.ListenProbe
	}
	if sig := m.Sig; sig != nil {
		cfg.Polling = func() { sig.Polling.signal(struct{}{}) }
		cfg.TriggerChecked = func(ok bool) { sig.TriggerChecked.signal(ok) }
		cfg.ProbeFailed = func() { sig.ListenerProbeFailed.signal(struct{}{}) }
	}
	st.lis.Start(cfg, m.notifyCh)
}
