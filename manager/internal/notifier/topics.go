// Package notifier is the Manager's listening service: one goroutine
// that owns the listening connection (LISTEN on the notify channel,
// probes on a clock, reconnects with backoff) and delivers what it hears
// to the Manager's loop, by topic, to the subscribers the loop registered
// (River's internal/notifier is the model). The loop's end is a Link: the
// loop's parts subscribe there — the kernel's release wake-ups (Wake),
// watches (Watch), revocation (Revoke, ReleaseRequest) — and none of them
// reaches into the service's state.
//
// A subscription to a key of a keyed topic (Wake, Watch) is a session
// lock the service holds on its connection for the loop: the server
// notifies a key's releases only while some session holds its waiter
// lock, and a key's changes only while some session holds its watch lock
// (store.RegisterWaiters, store.RegisterWatchers). The loop and the
// service share no memory: the loop records each change of the
// subscriptions it wants in the Link's outbox, and hands the whole outbox
// over when the service takes it (Mailbox, offered in the loop's select),
// so changes that come while the service is busy coalesce into the next
// handover and the loop never waits for the service. The service posts
// back Notices on one channel, which the loop reads and hands to
// Link.Deliver.
package notifier

import (
	"github.com/pglease/pglease/internal/store"
)

// Topic is what a notice is about, and, for a keyed topic, what a
// subscription to a key holds.
type Topic uint8

const (
	// Wake: a release of a key this process waits for (Notice.Hash). A
	// subscription holds the key's waiter lock (store.WaiterLockClass).
	Wake Topic = iota
	// Watch: a change of a watched key (Notice.Note, store.NotifyWatch).
	// A subscription holds the key's watch lock (store.WatchLockClass).
	Watch
	// Revoke: a revoke of a hold (Notice.Note, store.NotifyRevoke), for
	// every process on the channel.
	Revoke
	// ReleaseRequest: a request to release holds (Notice.Note,
	// store.NotifyReleaseRequest), for every process on the channel.
	ReleaseRequest
	// Turn: a fair-queue notification on this process's own queue
	// channel (Notice.Turn, store.ParseTurn): a release served one of its
	// tickets, or told it its turn. Channel-wide, no subscription per key.
	Turn

	numTopics
)

// Active is a subscription, not a topic of notices (it has no handler):
// Sub{Active, ""} while something of the loop's waits for a notice (a
// caller waiting for a key, a ticket in the fair queue, a watch). The
// service then probes its connection every ProbeEvery; without it, every
// IdleProbeEvery (a holder told nothing by a dead listener still learns
// of a revoke from its next extend).
const Active = numTopics

// keyed reports whether a subscription of t is per key (a session lock).
func (t Topic) keyed() bool { return t == Wake || t == Watch }

// Sub is one subscription of a keyed topic: the session lock of a key.
type Sub struct {
	Topic Topic
	Key   string // NFC key
}

// Notice is what the service posts to the loop (and what Revoke and
// RequestRelease post to their own loop): a notification of Topic, or,
// with Resync or Registered set, news of the service itself, which
// Deliver hands to every topic's subscriber.
type Notice struct {
	Topic Topic
	Hash  string             // Wake: the released key's hash
	Note  store.Notification // Watch, Revoke, ReleaseRequest
	Turn  store.Turn         // Turn
	// Resync: the service (re)subscribed: notifications sent while it
	// was not listening are lost.
	Resync bool
	// Registered: the subscriptions the service just took.
	Registered []Sub
}

// topicOf is the topic of a notification's kind.
func topicOf(k store.NotificationKind) (Topic, bool) {
	switch k {
	case store.NotifyWake:
		return Wake, true
	case store.NotifyWatch:
		return Watch, true
	case store.NotifyRevoke:
		return Revoke, true
	case store.NotifyReleaseRequest:
		return ReleaseRequest, true
	}
	return 0, false
}

// Parse turns a payload into its notice (off the loop); ok is false for a
// payload that is not pglease's (another program on the channel).
func Parse(payload string) (n Notice, ok bool) {
	note, ok := store.ParseNotification(payload)
	if !ok {
		return Notice{}, false
	}
	t, ok := topicOf(note.Kind)
	if !ok {
		return Notice{}, false
	}
	if t == Wake {
		return Notice{Topic: Wake, Hash: note.KeyHash}, true
	}
	return Notice{Topic: t, Note: note}, true
}

// ParseTurn turns a payload of the queue channel into its notice; ok is
// false for a payload that is not a queue notification.
func ParseTurn(payload string) (n Notice, ok bool) {
	t, ok := store.ParseTurn(payload)
	if !ok {
		return Notice{}, false
	}
	return Notice{Topic: Turn, Turn: t}, true
}

// Of is the notice of a notification this process sends itself (Revoke,
// RequestRelease tell their own holders at once, without the channel).
func Of(note store.Notification) Notice {
	t, _ := topicOf(note.Kind)
	return Notice{Topic: t, Note: note}
}
