package manager

import (
	"time"

	"github.com/jackc/pgx/v5"
)

// testSignal is a River-style test signal: a no-op unless a test called
// init, then a buffered channel the loop (or a DB goroutine) posts to
// without ever blocking. Signals beyond the buffer are dropped, so tests
// that count signals consume them as they go.
type testSignal[T any] struct{ ch chan T }

func (s *testSignal[T]) init() { s.ch = make(chan T, 4096) }

func (s *testSignal[T]) signal(v T) {
	if s == nil || s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}

// signals are the loop's test signals (all no-ops in production). Values
// carrying a key carry the NFC key; they exist only in tests.
type signals struct {
	batchSent           testSignal[batchInfo]    // a DB goroutine is about to send a batch
	queued              testSignal[string]       // a caller joined the key's queue
	granted             testSignal[string]       // a waiter was granted the key
	abandoned           testSignal[string]       // a queued waiter left before its grant
	takenBack           testSignal[string]       // a grant was taken back from a caller who had left
	orphaned            testSignal[string]       // an attempt succeeded with no waiter left; released
	extended            testSignal[int]          // an extend batch came back; n locks extended
	extendFailed        testSignal[error]        // an extend batch failed as a whole (retried)
	lost                testSignal[string]       // a held lock was declared lost
	released            testSignal[string]       // a release of the key's lock came back
	woken               testSignal[string]       // a notification, or the key's registration as waited for (waiters.go), started an attempt for the key
	retrying            testSignal[string]       // the key's attempt failed or was contended; its next one is scheduled
	listening           testSignal[struct{}]     // the listener (re)subscribed
	stuck               testSignal[batchKind]    // a batch got no answer for stuckAfter: caps no longer count it; its attempts are hedged
	listenerProbeFailed testSignal[struct{}]     // the listener's probe failed; it reconnects
	polling             testSignal[struct{}]     // the listener stopped for good (transaction-mode pooler)
	releaseRetry        testSignal[string]       // a release with an unknown outcome was scheduled again (its lockId)
	extendAsked         testSignal[string]       // the loop took a Lock.Extend call for the key
	triggerChecked      testSignal[bool]         // the listener checked for the release trigger: installed?
	extendTimed         testSignal[extendTiming] // one lock's extend succeeded: when it was due and sent
	registered          testSignal[int]          // run got the keys the listener registered as waited for (how many)
	revoked             testSignal[string]       // a held lock was ended as revoked
	revokeKept          testSignal[string]       // a revoke that matched no held lock was remembered (its lockId hash)
	releaseRequested    testSignal[string]       // a held lock's ReleaseRequested was closed
	watchRead           testSignal[int]          // a snapshot read for watches came back (how many keys)
	shedding            testSignal[bool]         // the Manager started (true) or stopped (false) holding back acquires (overload.go)
	turn                testSignal[bool]         // a fair-queue notice came on this process's queue channel (granted?)
	ticket              testSignal[int]          // a waiter's place in its key's fair queue changed (the place)
	leftGranted         testSignal[string]       // a leaving waiter's ticket had been granted; the leave released it
}

func (s *signals) init() {
	s.batchSent.init()
	s.queued.init()
	s.granted.init()
	s.abandoned.init()
	s.takenBack.init()
	s.orphaned.init()
	s.extended.init()
	s.extendFailed.init()
	s.lost.init()
	s.released.init()
	s.woken.init()
	s.retrying.init()
	s.listening.init()
	s.stuck.init()
	s.listenerProbeFailed.init()
	s.polling.init()
	s.releaseRetry.init()
	s.registered.init()
	s.extendAsked.init()
	s.triggerChecked.init()
	s.extendTimed.init()
	s.revoked.init()
	s.revokeKept.init()
	s.releaseRequested.init()
	s.watchRead.init()
	s.shedding.init()
	s.turn.init()
	s.ticket.init()
	s.leftGranted.init()
}

// batchKind names a kind of batched statement.
type batchKind string

const (
	kindAcquire batchKind = "acquire"
	kindRelease batchKind = "release"
	kindExtend  batchKind = "extend"
	kindHandOff batchKind = "handoff" // a release and the next local waiter's acquire in one statement
	kindShared  batchKind = "shared"  // shared holds (readers, permits)
	kindSets    batchKind = "sets"    // all-or-nothing sets
)

type batchInfo struct {
	kind batchKind
	n    int
}

// testHooks let tests stop a DB goroutine at a chosen point. Nil in
// production.
// extendTiming is one successful extend of key: the previous lease's
// start (acquire or last extend attempt), when the heartbeat had the
// extend due, and when its attempt started.
type extendTiming struct {
	key                   string
	prevStart, due, start time.Time
}

type testHooks struct {
	// jitter, if set, draws a release retry's jitter in [0, n) instead
	// of math/rand (a simulator's seeded draws replay).
	jitter func(n time.Duration) time.Duration
	// beforeBatch runs in the DB goroutine just before the statement is
	// sent (after the loop counted the batch as in flight).
	beforeBatch func(kind batchKind, n int)
	// listenConfig may change the listener's connection config (e.g.
	// route it through a fault proxy) before each connect.
	listenConfig func(*pgx.ConnConfig)
	// listenProbe, if set, replaces the listener's probe interval and
	// timeout.
	listenProbe time.Duration
	// listenIdleTimeout, if set, replaces the listening session's
	// idle_session_timeout (connx.DefaultLiveness).
	listenIdleTimeout time.Duration
	// timerFired, if set, runs when a loss timer or the loop's wake-up
	// timer fires, before it acts, with how late it fired; a test makes
	// the runtime's delay in running timers after SIGCONT certain.
	timerFired func(late time.Duration)
	// stuckAfter, if set, replaces stuckAfter (flight.go).
	stuckAfter time.Duration
	// afterAcquire, if set, runs in the DB goroutine of an acquire batch
	// after its statement was answered, before the answer is posted.
	afterAcquire func()
	// waiterLinger, if set, replaces waiterLinger (waiters.go); negative:
	// a registration ends with its key's state.
	waiterLinger time.Duration
	// slowRoundTrip and shedCalm, if set, replace slowRoundTrip and
	// shedCalm (overload.go).
	slowRoundTrip, shedCalm time.Duration
	// clock, if set, replaces heartbeat.Now as the Manager's clock
	// (Manager.now): a test moves it to suspend the machine.
	clock func() time.Time
}
