package kernel

import (
	"container/heap"
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager/internal/notifier"
)

// Watching a key, without polling.
//
// A watched key's changes are announced by the server: the acquire,
// release, handoff and revoke functions notify "w:" + HashKey(key) + ":"
// + an event letter + ":" + the fence on the notify channel, but only
// while some session holds the key's watch lock (store.WatchLockClass),
// so unwatched keys cost nothing. The loop subscribes the key to topic
// notifier.Watch (listener.go), which has the listener take that lock;
// once the listener took it (a registration), the loop reads the key's state (store.Snapshot on a DB worker,
// one batch in flight for all watched keys) and hands it to the watchers
// as their first event. A change that committed before that read is in
// it; one after sends a notification (it saw the lock). The read never
// waits for a change in flight: such a key is answered busy and read
// again a moment later (its notifications wait meanwhile), so that a key
// held up (a takeover waiting for a transaction that guards the lease)
// does not hold up the other keys' events. The server sends
// notifications in commit order, and fences tell which of them the read
// already covers (watchState.seen), so no change is lost or told twice.
//
// A grant's notification carries only its fence: the loop reads the key
// once more for its holder and expiry, and the Granted event waits for
// that read (notifications meanwhile wait behind it, in order). A grant
// that a later notification already ended is not read for: no read
// could find it any more (a read under way when it came, or one that
// covers its fence, tells its holder if it found it). So a key that
// changes faster than it can be read costs one read per read time, not
// one per grant, and its notifications never pile up behind reads of
// grants long gone. Expiry is
// not announced by anyone: the loop times expires_at + 1 s (the server's
// tolerance) from the read, on its own clock, and then reads the key to
// confirm: extended (same fence, later expiry: timed again), expired
// (Expired), or gone without a notification yet (one may be on its way:
// read again a moment later, then report the end as it finds it). After
// the listener reconnects (notifications were lost meanwhile) every
// watched key is read again and its watchers are told what changed since
// their last event (resyncWatch), nothing when nothing did.
//
// Each watcher has a buffered channel that only the loop sends on, never
// blocking: when the reader lags behind by watchBuffer events, the oldest
// is dropped for the newest, so the last event a reader sees is always
// the latest state the Manager knows.

// Event is a Manager's Event as the kernel sends it (the Manager's Watch
// converts it): one change of a watched key's exclusive lease.
type Event struct {
	Kind      EventKind
	Fence     pglease.Fence
	Holder    string
	ExpiresAt time.Time
}

// EventKind is an Event's kind, with the Manager's EventKind's values.
type EventKind string

// The kinds of an Event (see the Manager's EventKind).
const (
	EventGranted  EventKind = "granted"
	EventReleased EventKind = "released"
	EventExpired  EventKind = "expired"
	EventRevoked  EventKind = "revoked"
	EventResync   EventKind = "resync"
)

// EventSink is where a watcher's events go: a buffered channel that
// never blocks run (full, the oldest event makes room). Only run calls
// it.
type EventSink interface {
	Send(ev Event)
	Close()
}

// eventChan is an EventSink on a channel of the kernel's events.
type eventChan chan Event

// Send hands ev over without blocking: when the buffer is full the
// oldest event makes room.
func (c eventChan) Send(ev Event) {
	select {
	case c <- ev:
		return
	default:
	}
	select {
	case <-c:
	default:
	}
	select {
	case c <- ev:
	default:
	}
}

// Close closes the channel.
func (c eventChan) Close() { close(c) }

// Watch is Manager.Watch: it registers a watcher whose events go to
// sink.
func (m *Kernel) Watch(ctx context.Context, key string, sink EventSink) error {
	const op = "manager.Watch"
	nk, err := m.CheckKeyCall(op, ctx, key)
	if err != nil {
		return err
	}
	if m.cfg.DisableNotify {
		return Invalid(op, "notifications are off (Config.DisableNotify): nothing would report the key's changes")
	}
	w := &watcher{key: nk, hash: pglease.HashKey(nk), sink: sink}
	req := &watchReq{w: w, reply: make(chan error, 1)}
	select {
	case m.watchCh <- req:
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the watch started", ctx.Err())
	case <-m.Closing:
		return ClosedErr(op)
	}
	if err := <-req.reply; err != nil { // the loop answers at once
		return err
	}
	context.AfterFunc(ctx, func() {
		select {
		case m.watchCh <- &watchReq{w: w, remove: true}:
		case <-m.Done:
		}
	})
	return nil
}

// WatchBuffer is the capacity of a watcher's channel.
const WatchBuffer = 16

// maxBacklog bounds the notifications a watched key keeps while a read
// of it is in flight. Beyond it, when the read is for a grant's holder
// or an expiry, that read is given up (its grant is told without a
// holder) and the notifications are applied, none lost; when the read
// gets the key's state anew (a new registration or a reconnect), which
// covers them, they are dropped and the key is read afresh.
const maxBacklog = 64

// watchSettle is how long after a confirming read found a lease gone or
// replaced without a notification the loop reads again before it reports
// the end itself: the notification may be on its way.
const watchSettle = 250 * time.Millisecond

// watchBusyRetry is how soon a key answered busy by a read (a change of
// it in flight) is read again, doubling while it stays busy, up to
// watchSettle.
const watchBusyRetry = 10 * time.Millisecond

// watchReq is a Watch call (remove false) or the end of its context.
type watchReq struct {
	w      *watcher
	remove bool
	reply  chan error // cap 1; add only
}

// watcher is one Watch call's channel. Only run sends on or closes ch.
type watcher struct {
	key, hash string // immutable: NFC key and its hash
	sink      EventSink
	ws        *watchState // owned by run
	fresh     bool        // owned by run: it got its first event
	closed    bool        // owned by run: ch is closed
}

// send hands ev to w without blocking (see EventSink).
func (w *watcher) send(ev Event) { w.sink.Send(ev) }

// watchState is one watched key, shared by its watchers. Owned by run.
type watchState struct {
	key, hash string
	subs      []*watcher
	dropped   bool // no watcher left: forgotten (a read in flight is ignored)

	// announce: the next read's state goes to every watcher (the key was
	// just registered, or the listener reconnected); cleared when a read
	// carrying it is sent (flight.announce).
	announce bool
	// pendingGrant: the last grant's notification was applied and its
	// Granted event waits for a read (holder, expiry).
	pendingGrant bool
	wantRead     bool // in watchLoop.want
	reading      bool // in the read in flight
	// readAnnounce: the read in flight carries announce. staleRead: the
	// read in flight was given up (the backlog overflowed): its outcome
	// is ignored.
	readAnnounce bool
	staleRead    bool
	// settling: a confirming read found the lease gone or replaced
	// without a notification; the next one reports what it finds.
	settling bool
	backlog  []store.Notification // notifications held while blocked
	busy     int                  // reads in a row answered busy

	// The state as known: the last grant's fence, whether its lease is
	// live, whether its row was there at the last read, its holder and
	// expiry (server time); seen is the highest fence covered (by a read
	// or a notification): notifications at or below it are old.
	fence     pglease.Fence
	seen      pglease.Fence
	live      bool
	holder    string
	expiresAt time.Time
	last      Event // the last event sent (new watchers get it first)
	hasLast   bool

	checkGen uint64 // invalidates checks in watchLoop.checks
}

// blocked reports whether notifications must wait: a read is wanted or
// in flight for the key's state.
func (ws *watchState) blocked() bool {
	return ws.announce || ws.pendingGrant || ws.reading
}

// watchLoop is the loop's watch state (LoopState.watch). Owned by run.
type watchLoop struct {
	keys     map[string]*watchState // by NFC key
	byHash   map[string]*watchState // by pglease.HashKey(key)
	want     []*watchState          // reads wanted, in order
	inFlight bool                   // a read batch is in flight
	retryAt  time.Time              // reads failed: when to try again (zero: now)
	failures int
	checks   watchChecks // expiry confirmations due, earliest first
}

// watchFlight is one read batch.
type watchFlight struct {
	states   []*watchState
	announce []bool
}

// watchDone is a read batch's outcome, posted by its DB worker.
type watchDone struct {
	fl  *watchFlight
	res []store.KeyState
	err error
	at  time.Time // local time when the answer came (after the server read its clock)
}

type watchCheck struct {
	at  time.Time
	ws  *watchState
	gen uint64
}

type watchChecks []watchCheck

func (h watchChecks) Len() int           { return len(h) }
func (h watchChecks) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h watchChecks) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *watchChecks) Push(x any)        { *h = append(*h, x.(watchCheck)) }
func (h *watchChecks) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// handleWatch adds or removes a watcher.
func (st *LoopState) handleWatch(req *watchReq) {
	w := req.w
	if req.remove {
		st.unwatch(w)
		return
	}
	switch {
	case st.closing:
		req.reply <- ClosedErr("manager.Watch")
		return
	case !st.lis.Live():
		req.reply <- Invalid("manager.Watch", "the Manager has stopped listening for good (its listening connection goes "+
			"through a transaction-mode pooler; set Config.ListenConnString): nothing would report the key's changes")
		return
	}
	wl := &st.watch
	ws := wl.keys[w.key]
	if ws == nil {
		if wl.keys == nil {
			wl.keys = make(map[string]*watchState)
			wl.byHash = make(map[string]*watchState)
		}
		ws = &watchState{key: w.key, hash: w.hash, announce: true}
		wl.keys[w.key] = ws
		wl.byHash[w.hash] = ws
		// The read comes once the listener holds the watch lock
		// (handleWatchRegistered). But when the key's last watch ended
		// and its lock was not handed back yet, the two wishes merge:
		// the listener keeps the lock and posts no registration, so
		// read now.
		if st.lis.Unsubscribing(notifier.Watch, w.key) {
			st.wantWatchRead(ws)
		}
		st.lis.Subscribe(notifier.Watch, w.key)
	}
	w.ws = ws
	ws.subs = append(ws.subs, w)
	req.reply <- nil
	st.greet(ws)
}

// unwatch ends w (its context ended): its channel is closed, and the key
// forgotten when it was its last watcher.
func (st *LoopState) unwatch(w *watcher) {
	if w.closed {
		return
	}
	w.closed = true
	w.sink.Close()
	ws := w.ws
	for i, s := range ws.subs {
		if s == w {
			ws.subs = append(ws.subs[:i], ws.subs[i+1:]...)
			break
		}
	}
	if len(ws.subs) > 0 {
		return
	}
	ws.dropped = true
	ws.checkGen++
	delete(st.watch.keys, ws.key)
	delete(st.watch.byHash, ws.hash)
	st.lis.Unsubscribe(notifier.Watch, ws.key)
}

// closeWatches closes every watcher's channel (Close, or the listener
// stopped for good).
func (st *LoopState) closeWatches() {
	for _, ws := range st.watch.keys {
		for _, w := range ws.subs {
			if !w.closed {
				w.closed = true
				w.sink.Close()
			}
		}
		ws.subs = nil
		ws.dropped = true
	}
	st.watch.keys, st.watch.byHash, st.watch.want = nil, nil, nil
	st.watch.checks = nil
}

// handleWatchesRegistered: the listener holds the watch locks of keys now
// (handleWatchRegistered for each).
func (st *LoopState) handleWatchesRegistered(keys []string) {
	for _, key := range keys {
		st.handleWatchRegistered(key)
	}
}

// handleWatchRegistered: the listener holds the key's watch lock now, so
// every later change notifies: read the key's state for its watchers.
func (st *LoopState) handleWatchRegistered(key string) {
	if ws := st.watch.keys[key]; ws != nil {
		ws.announce = true
		st.wantWatchRead(ws)
	}
}

// watchResync: the listener reconnected (notifications may have been
// lost): every watched key is read again, and its watchers get its state.
func (st *LoopState) watchResync() {
	for _, ws := range st.watch.keys {
		ws.announce = true
		st.wantWatchRead(ws)
	}
}

func (st *LoopState) wantWatchRead(ws *watchState) {
	if ws.wantRead || ws.dropped {
		return
	}
	ws.wantRead = true
	st.watch.want = append(st.watch.want, ws)
}

// handleWatchNotice applies a watch notification, or keeps it while the
// key's state is being read.
func (st *LoopState) handleWatchNotice(n store.Notification) {
	ws := st.watch.byHash[n.KeyHash]
	if ws == nil {
		return
	}
	switch n.Event {
	case store.WatchGranted, store.WatchReleased, store.WatchRevoked:
	default:
		return // shared holds are not reported
	}
	if !ws.blocked() {
		st.applyWatchNotice(ws, n)
		st.wantGrantRead(ws)
		st.greet(ws)
		return
	}
	if len(ws.backlog) >= maxBacklog {
		if ws.announce || ws.readAnnounce {
			// The read that gets the key's state anew covers these.
			ws.backlog = nil
			ws.announce = true
			st.wantWatchRead(ws)
			return
		}
		// Give up the read in flight (a grant's holder, or an expiry's
		// confirmation) rather than a change: the grant it was for has
		// ended (these notifications came after it), and the state the
		// backlog leads to is read anew when it needs a read.
		ws.reading, ws.staleRead = false, true
	}
	ws.backlog = append(ws.backlog, n)
	if !ws.reading && !ws.announce {
		// Blocked only by a grant waiting for a read not under way (queued,
		// or its key was busy): n ended that grant.
		st.drainWatch(ws, nil)
		st.greet(ws)
	}
}

// wantGrantRead asks for the read of a grant's holder and expiry, when a
// grant waits for one and none is under way.
func (st *LoopState) wantGrantRead(ws *watchState) {
	if ws.pendingGrant && !ws.reading && !ws.announce {
		st.wantWatchRead(ws)
	}
}

// grantEnded reports whether a notification in ws's backlog ends the
// grant waiting for its read (its end, or a later grant).
func (ws *watchState) grantEnded() bool {
	for _, n := range ws.backlog {
		if n.Fence > ws.fence || (n.Fence == ws.fence && n.Event != store.WatchGranted) {
			return true
		}
	}
	return false
}

// tellGrant sends the Granted event of the grant waiting for its read,
// with its holder and expiry when r (the read just made, or nil) found
// it, and then Expired when r found it expired.
func (st *LoopState) tellGrant(ws *watchState, r *store.KeyState) {
	ws.pendingGrant = false
	same := r != nil && r.LockIDHash != "" && r.Fence == ws.fence
	if same {
		ws.holder, ws.expiresAt = r.Holder, r.ExpiresAt
	}
	st.emit(ws, Event{Kind: EventGranted, Fence: ws.fence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
	if same && !r.Held {
		ws.live = false
		st.emit(ws, Event{Kind: EventExpired, Fence: ws.fence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
	}
}

// readCovers reports whether the read r saw the grant of fence f
// committed (the key's fence counter reached it).
func readCovers(r *store.KeyState, f pglease.Fence) bool {
	return r != nil && max(r.Fence, r.Counter) >= f
}

// drainWatch applies the notifications that waited, in order, when no
// read is under way or wanted for the key's state anew; r is the read
// just applied (nil: none). A grant waiting for its read is told at once
// when a later notification ended it, or when r covers it; the last
// grant r does not cover waits for a read, and the notifications after
// it with it. (A grant that waited already, with r nil, has its read
// arranged: queued, or timed after a busy answer.)
func (st *LoopState) drainWatch(ws *watchState, r *store.KeyState) {
	was, wasFence := ws.pendingGrant, ws.fence
	for !ws.reading && !ws.announce {
		if ws.pendingGrant && (ws.grantEnded() || readCovers(r, ws.fence)) {
			st.tellGrant(ws, r)
		}
		if len(ws.backlog) == 0 || ws.blocked() {
			break
		}
		n := ws.backlog[0]
		ws.backlog = ws.backlog[1:]
		st.applyWatchNotice(ws, n)
	}
	if len(ws.backlog) == 0 {
		ws.backlog = nil
	}
	if !was || ws.fence != wasFence || r != nil {
		st.wantGrantRead(ws)
	}
}

// applyWatchNotice applies one notification to a key whose state is
// settled (not blocked).
func (st *LoopState) applyWatchNotice(ws *watchState, n store.Notification) {
	f := n.Fence
	switch n.Event {
	case store.WatchGranted:
		if f <= ws.seen {
			return // the read covered it
		}
		if ws.live {
			// The lease before ended without a notification: it expired
			// (nobody takes a live lease over) or a SyncGuard process
			// released it.
			st.emit(ws, Event{Kind: EventExpired, Fence: ws.fence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
		}
		ws.fence, ws.seen, ws.live, ws.holder, ws.expiresAt = f, f, true, "", time.Time{}
		ws.settling = false
		ws.checkGen++
		ws.pendingGrant = true // its read: wantGrantRead, by the caller
	case store.WatchReleased, store.WatchRevoked:
		kind := EventReleased
		if n.Event == store.WatchRevoked {
			kind = EventRevoked
		}
		switch {
		case f == ws.fence && ws.live:
			st.emit(ws, Event{Kind: kind, Fence: f, Holder: ws.holder, ExpiresAt: ws.expiresAt})
		case f > ws.seen:
			// The end of a grant this Manager never saw granted.
			ws.fence, ws.holder, ws.expiresAt = f, "", time.Time{}
			st.emit(ws, Event{Kind: kind, Fence: f})
		default:
			return // told already (its end found by a read) or older
		}
		ws.seen = max(ws.seen, f)
		ws.live, ws.settling = false, false
		ws.checkGen++
	}
}

// emit sends ev to the key's watchers that have had their first event
// (the others get the state, which ev is then, when greeted).
func (st *LoopState) emit(ws *watchState, ev Event) {
	ws.last, ws.hasLast = ev, true
	for _, w := range ws.subs {
		if w.fresh {
			w.send(ev)
		}
	}
}

// greet sends the key's state to its watchers that have had no event
// yet, once the state is known and settled.
func (st *LoopState) greet(ws *watchState) {
	if ws.blocked() || !ws.hasLast {
		return
	}
	for _, w := range ws.subs {
		if !w.fresh {
			w.fresh = true
			w.send(ws.last)
		}
	}
}

// flushWatchReads sends the wanted reads, one batch at a time.
func (st *LoopState) flushWatchReads() {
	if fl, ks := st.takeWatchReads(); fl != nil {
		m := st.m
		m.spawn(func() { m.sendWatchRead(fl, ks) })
	}
}

// takeWatchReads makes the next read batch of the wanted reads (nil: none
// now), marking its keys reading.
func (st *LoopState) takeWatchReads() (*watchFlight, []string) {
	wl := &st.watch
	if wl.inFlight || len(wl.want) == 0 || st.closing || (!wl.retryAt.IsZero() && st.m.Now().Before(wl.retryAt)) {
		return nil, nil
	}
	n := min(len(wl.want), st.m.cfg.MaxBatch)
	fl := &watchFlight{states: make([]*watchState, 0, n), announce: make([]bool, 0, n)}
	ks := make([]string, 0, n)
	for _, ws := range wl.want[:n] {
		ws.wantRead = false
		if ws.dropped {
			continue
		}
		ws.reading, ws.readAnnounce = true, ws.announce
		fl.states = append(fl.states, ws)
		fl.announce = append(fl.announce, ws.announce)
		ws.announce = false
		ks = append(ks, ws.key)
	}
	wl.want = append(wl.want[:0], wl.want[n:]...)
	if len(ks) == 0 {
		return nil, nil
	}
	wl.inFlight = true
	return fl, ks
}

// sendWatchRead runs on a DB worker, never on the loop.
func (m *Kernel) sendWatchRead(fl *watchFlight, ks []string) {
	ctx, cancel := context.WithTimeoutCause(m.workCtx, m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	ctx, db := m.Rec.StartDB(ctx, obs.OpSnapshot, len(ks), trace.SpanContext{})
	res, err := m.Store.Snapshot(ctx, ks)
	at := m.Now()
	if err == nil {
		db.End(len(res), nil)
	} else {
		db.End(0, err)
	}
	select {
	case m.watchDoneCh <- watchDone{fl: fl, res: res, err: err, at: at}:
	case <-m.Done:
	}
}

// handleWatchRead applies a read batch's outcome.
func (st *LoopState) handleWatchRead(d watchDone) {
	wl := &st.watch
	wl.inFlight = false
	if d.err != nil {
		// Read again later, with backoff; notifications wait meanwhile.
		wl.failures++
		wl.retryAt = d.at.Add(min(100*time.Millisecond<<min(wl.failures, 6), 5*time.Second))
		for i, ws := range d.fl.states {
			if st.staleWatchRead(ws) {
				continue
			}
			ws.reading, ws.readAnnounce = false, false
			ws.announce = ws.announce || d.fl.announce[i]
			st.wantWatchRead(ws)
		}
		return
	}
	wl.failures, wl.retryAt = 0, time.Time{}
	for i, ws := range d.fl.states {
		if ws.dropped || st.staleWatchRead(ws) {
			continue
		}
		ws.reading, ws.readAnnounce = false, false
		if d.res[i].Busy {
			// A change of the key was in flight (a takeover waiting for a
			// transaction that guards the lease can take seconds): read
			// it again a moment later, as it was wanted; the other keys'
			// reads go on meanwhile. The notifications that came
			// meanwhile are applied unless the state is read anew: they
			// may have ended a grant waiting for this read.
			ws.announce = ws.announce || d.fl.announce[i]
			ws.busy++
			st.checkWatch(ws, d.at.Add(min(watchBusyRetry<<min(ws.busy-1, 5), watchSettle)))
			st.drainWatch(ws, nil)
			st.greet(ws)
			continue
		}
		ws.busy = 0
		st.applyWatchRead(ws, d.res[i], d.fl.announce[i], d.at)
	}
	st.sig().WatchRead.signal(len(d.fl.states))
}

// staleWatchRead reports whether ws's read just come back was given up
// (an overflowing backlog was applied meanwhile); then a live lease is
// read again to time its expiry.
func (st *LoopState) staleWatchRead(ws *watchState) bool {
	if !ws.staleRead {
		return false
	}
	ws.staleRead = false
	if ws.live && !ws.blocked() && !ws.dropped {
		st.wantWatchRead(ws)
	}
	return true
}

// stateEvent is the event that tells the state r read.
func stateEvent(r store.KeyState) Event {
	switch {
	case r.LockIDHash == "":
		return Event{Kind: EventReleased}
	case r.Held:
		return Event{Kind: EventGranted, Fence: r.Fence, Holder: r.Holder, ExpiresAt: r.ExpiresAt}
	}
	return Event{Kind: EventExpired, Fence: r.Fence, Holder: r.Holder, ExpiresAt: r.ExpiresAt}
}

// applyWatchRead applies the state r of ws's key, read for announce (a
// new registration or a reconnect: r replaces what was known), for a
// grant's holder and expiry (pendingGrant), or to confirm an expiry; at
// is when the answer came, on this process's clock. Then the
// notifications that waited are applied, and the expiry timed.
func (st *LoopState) applyWatchRead(ws *watchState, r store.KeyState, announce bool, at time.Time) {
	row := r.LockIDHash != ""
	same := row && r.Fence == ws.fence
	switch {
	case announce && ws.hasLast:
		// Read again after the listener reconnected (or took the watch
		// lock again): tell what changed since the last event, if
		// anything (a watcher not yet greeted gets the state below).
		st.resyncWatch(ws, r, row)
		if ws.announce {
			return
		}
	case announce:
		ev := stateEvent(r)
		ws.fence, ws.live, ws.holder, ws.expiresAt = ev.Fence, r.Held && row, ev.Holder, ev.ExpiresAt
		ws.seen = max(r.Fence, r.Counter)
		ws.pendingGrant, ws.settling = false, false
		ws.backlog = ws.backlog[:0:0]
		for _, w := range ws.subs {
			w.fresh = false // all get the state anew
		}
		ws.last, ws.hasLast = ev, true
		if ws.announce {
			// Registered again meanwhile: that read announces.
			return
		}
	case ws.pendingGrant:
		// Told by the drain below: r covers it (the read was made after
		// its notification came).
	case !ws.live:
	case same && r.Held: // extended (or not yet expired): timed again below
		ws.holder, ws.expiresAt, ws.settling = r.Holder, r.ExpiresAt, false
	case same:
		ws.live, ws.settling = false, false
		ws.expiresAt = r.ExpiresAt
		st.emit(ws, Event{Kind: EventExpired, Fence: ws.fence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
	case !ws.settling:
		// Gone or replaced, and no notification yet: it may be on its way.
		ws.settling = true
		st.checkWatch(ws, at.Add(watchSettle))
	default:
		// Still nothing told: report the end as found (a SyncGuard
		// process's release or takeover notifies nothing).
		ws.settling, ws.live = false, false
		if !row {
			st.emit(ws, Event{Kind: EventReleased, Fence: ws.fence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
		} else {
			st.emit(ws, Event{Kind: EventExpired, Fence: ws.fence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
			if r.Fence > ws.seen {
				ws.fence, ws.seen, ws.holder, ws.expiresAt, ws.live = r.Fence, r.Fence, r.Holder, r.ExpiresAt, r.Held
				if r.Held {
					st.emit(ws, Event{Kind: EventGranted, Fence: r.Fence, Holder: r.Holder, ExpiresAt: r.ExpiresAt})
				}
			}
		}
	}
	// The notifications that waited, in order, until one needs a read.
	st.drainWatch(ws, &r)
	st.greet(ws)
	if ws.blocked() || !ws.live || ws.settling {
		return
	}
	if row && r.Fence == ws.fence {
		// Expired for the server once its clock passes expires_at + 1 s:
		// that far after its reading, on this clock (at is after it, so
		// this is not early).
		st.checkWatch(ws, at.Add(r.ExpiresAt.Add(keys.TimeTolerance).Sub(r.Now)))
	} else {
		st.checkWatch(ws, at.Add(watchSettle)) // expiry unknown: read again
	}
}

// resyncWatch applies the state r, read after notifications may have been
// lost, to a key whose watchers know its last event: they are told what
// changed since, once (see EventResync), and nothing when nothing did.
func (st *LoopState) resyncWatch(ws *watchState, r store.KeyState, row bool) {
	last := max(r.Fence, r.Counter)
	if ws.pendingGrant {
		// A grant applied and not told yet (its read was pending): told
		// first, as that read would have.
		ws.pendingGrant = false
		if row && r.Fence == ws.fence {
			ws.holder, ws.expiresAt = r.Holder, r.ExpiresAt
		}
		st.emit(ws, Event{Kind: EventGranted, Fence: ws.fence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
	}
	prevLive, prevFence := ws.live, ws.fence
	ws.settling = false
	// Notifications kept meanwhile stay: applied after, those the read
	// covered are skipped by their fences.
	switch {
	case row && r.Fence == prevFence && prevFence != 0:
		// The same lease: extended, or expired meanwhile.
		if prevLive && !r.Held {
			ws.live, ws.expiresAt = false, r.ExpiresAt
			st.emit(ws, Event{Kind: EventExpired, Fence: prevFence, Holder: ws.holder, ExpiresAt: r.ExpiresAt})
		} else if prevLive {
			ws.holder, ws.expiresAt = r.Holder, r.ExpiresAt
		}
	case row && r.Fence > ws.seen:
		// New grants came: the one read is told as the watch's first
		// event would be, after the end of the one known live.
		if prevLive {
			st.emit(ws, Event{Kind: EventResync, Fence: prevFence, Holder: ws.holder, ExpiresAt: ws.expiresAt})
		}
		ev := stateEvent(r)
		ws.fence, ws.live, ws.holder, ws.expiresAt = r.Fence, r.Held, r.Holder, r.ExpiresAt
		st.emit(ws, ev)
	case !row && prevLive:
		// Free now: the lease known live (and any grant after it) ended.
		ws.fence, ws.live, ws.holder, ws.expiresAt = max(last, prevFence), false, "", time.Time{}
		st.emit(ws, Event{Kind: EventResync, Fence: ws.fence})
		// A watcher that comes later gets the state: free.
		ws.last = Event{Kind: EventReleased, Fence: ws.fence}
	default:
		// Free before and now, or nothing newer than what was told.
	}
	ws.seen = max(ws.seen, last)
}

// checkWatch schedules a confirming read of ws at t (replacing any).
func (st *LoopState) checkWatch(ws *watchState, t time.Time) {
	ws.checkGen++
	heap.Push(&st.watch.checks, watchCheck{at: t, ws: ws, gen: ws.checkGen})
}

// dueWatch starts the confirming reads that are due.
func (st *LoopState) dueWatch(now time.Time) {
	c := &st.watch.checks
	for c.Len() > 0 && !(*c)[0].at.After(now) {
		e := heap.Pop(c).(watchCheck)
		if e.gen == e.ws.checkGen && !e.ws.dropped {
			st.wantWatchRead(e.ws)
		}
	}
}

// nextWatchWake is when the loop's timer must fire for the watches (zero:
// never): the next check, or a retry of failed reads.
func (st *LoopState) nextWatchWake() time.Time {
	wl := &st.watch
	var next time.Time
	for wl.checks.Len() > 0 {
		e := wl.checks[0]
		if e.gen != e.ws.checkGen || e.ws.dropped {
			heap.Pop(&wl.checks) // stale
			continue
		}
		next = e.at
		break
	}
	if len(wl.want) > 0 && !wl.inFlight && !wl.retryAt.IsZero() && (next.IsZero() || wl.retryAt.Before(next)) {
		next = wl.retryAt
	}
	return next
}
