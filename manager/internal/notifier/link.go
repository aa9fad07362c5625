package notifier

import (
	"context"
)

// Handler is a topic's subscriber on the loop. Every func is optional and
// runs on the loop (Deliver, Ended).
type Handler struct {
	// Notice handles a notification of the topic.
	Notice func(Notice)
	// Registered (keyed topics): the service took the subscriptions of
	// keys (their session locks); every later change of those keys
	// notifies. Called for each registration notice the service posts,
	// with the keys of this topic in it (maybe none).
	Registered func(keys []string)
	// Resync: the service (re)subscribed: notifications sent while it was
	// not listening are lost.
	Resync func()
	// Ended: the service stopped for good (a transaction-mode pooler):
	// nothing is delivered any more, and subscriptions are not taken.
	Ended func()
}

// Mail is one handover from the loop to the service: the latest wish for
// each subscription that changed since the last one (true: hold it;
// false: let it go). Once sent, it belongs to the service.
type Mail map[Sub]bool

// Link is the loop's end of the service: the subscribers of each topic,
// the subscriptions not handed over yet, and the service's lifetime. Owned
// by the loop; its zero value has no service (subscriptions are then not
// taken, and notices the loop sends itself are still delivered).
type Link struct {
	handlers [numTopics]Handler
	mail     chan<- Mail        // unbuffered; nil when no service runs
	outbox   Mail               // changes not handed over yet; nil when none
	done     <-chan struct{}    // closed when the service has ended; nil when none runs
	stop     context.CancelFunc // ends the service (Close)
}

// Handle registers h as topic t's subscriber (replacing any).
func (l *Link) Handle(t Topic, h Handler) { l.handlers[t] = h }

// Start starts the service with cfg; it posts its notices on out.
func (l *Link) Start(cfg Config, out chan<- Notice) {
	ctx, cancel := context.WithCancel(context.Background())
	mail := make(chan Mail)
	done := make(chan struct{})
	l.mail, l.done, l.stop = mail, done, cancel
	s := &service{cfg: cfg, out: out, mail: mail, want: make(map[Sub]struct{}), have: make(map[Sub]struct{})}
	go s.run(ctx, done)
}

// Live reports whether a service runs: subscriptions are taken.
func (l *Link) Live() bool { return l.mail != nil }

// Running reports whether the service's goroutine has not ended yet (it
// may have been stopped).
func (l *Link) Running() bool { return l.done != nil }

// Subscribe asks for key's subscription of the keyed topic t; the next
// handover carries it. The service posts a registration once it holds it.
// A no-op without a service.
func (l *Link) Subscribe(t Topic, key string) { l.want(Sub{t, key}, true) }

// Unsubscribe lets key's subscription of t go; the next handover carries
// it.
func (l *Link) Unsubscribe(t Topic, key string) { l.want(Sub{t, key}, false) }

// Unsubscribing reports whether key's subscription of t was let go and
// that was not handed over yet: subscribed again now, the two wishes merge
// in the outbox, the service keeps the subscription it holds and posts no
// registration for it.
func (l *Link) Unsubscribing(t Topic, key string) bool {
	on, pending := l.outbox[Sub{t, key}]
	return pending && !on
}

// SetActive records whether something of the loop's waits for a notice
// (see Active): the service probes its connection more often then.
func (l *Link) SetActive(on bool) { l.want(Sub{Topic: Active}, on) }

func (l *Link) want(s Sub, on bool) {
	if l.mail == nil || !(s.Topic.keyed() || s.Topic == Active) {
		return
	}
	if l.outbox == nil {
		l.outbox = make(Mail)
	}
	l.outbox[s] = on
}

// Mailbox returns the channel to offer Outbox on in the loop's select:
// nil (never ready) when there is nothing to hand over.
func (l *Link) Mailbox() chan<- Mail {
	if len(l.outbox) == 0 {
		return nil
	}
	return l.mail
}

// Outbox is the mail to hand over (see Mailbox).
func (l *Link) Outbox() Mail { return l.outbox }

// Handed records that the service took the outbox: it is the service's now.
func (l *Link) Handed() { l.outbox = nil }

// Done is closed when the service's goroutine has ended (nil, never
// ready, when none runs).
func (l *Link) Done() <-chan struct{} { return l.done }

// Stop ends the service (Close); Done is closed once it has.
func (l *Link) Stop() {
	if l.stop != nil {
		l.stop()
	}
}

// Ended forgets the service once its goroutine has ended (Done): nothing
// is handed over any more, and every topic's subscriber is told (Ended).
func (l *Link) Ended() {
	handlers := l.handlers
	*l = Link{handlers: handlers}
	for _, h := range handlers {
		if h.Ended != nil {
			h.Ended()
		}
	}
}

// Deliver hands n to its subscribers: a notification to its topic's, a
// resync or a registration to every topic's, in topic order.
func (l *Link) Deliver(n Notice) {
	switch {
	case n.Registered != nil:
		for t, h := range l.handlers {
			if h.Registered == nil || !Topic(t).keyed() {
				continue
			}
			var keys []string
			for _, s := range n.Registered {
				if s.Topic == Topic(t) {
					keys = append(keys, s.Key)
				}
			}
			h.Registered(keys)
		}
	case n.Resync:
		for _, h := range l.handlers {
			if h.Resync != nil {
				h.Resync()
			}
		}
	default:
		if h := l.handlers[n.Topic].Notice; h != nil {
			h(n)
		}
	}
}

// Idle makes l live with no service behind it: subscriptions are recorded
// in the outbox and never taken, and nothing is delivered but what the
// loop hands Deliver. For tests of the loop's state alone (the handover's
// timing cannot be forced through the goroutines).
func (l *Link) Idle() { l.mail = make(chan Mail) }
