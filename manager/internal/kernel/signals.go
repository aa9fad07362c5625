package kernel

import (
	"time"

	"github.com/jackc/pgx/v5"
)

// TestSignal is a River-style test signal: a no-op unless a test called
// init, then a buffered channel the loop (or a DB goroutine) posts to
// without ever blocking. Signals beyond the buffer are dropped, so tests
// that count signals consume them as they go.
type TestSignal[T any] struct{ Ch chan T }

func (s *TestSignal[T]) Init() { s.Ch = make(chan T, 4096) }

func (s *TestSignal[T]) signal(v T) {
	if s == nil || s.Ch == nil {
		return
	}
	select {
	case s.Ch <- v:
	default:
	}
}

// Signals are the loop's test signals (all no-ops in production). Values
// carrying a key carry the NFC key; they exist only in tests.
type Signals struct {
	BatchSent           TestSignal[BatchInfo]    // a DB goroutine is about to send a batch
	Queued              TestSignal[string]       // a caller joined the key's queue
	Granted             TestSignal[string]       // a waiter was granted the key
	Abandoned           TestSignal[string]       // a queued waiter left before its grant
	TakenBack           TestSignal[string]       // a grant was taken back from a caller who had left
	Orphaned            TestSignal[string]       // an attempt succeeded with no waiter left; released
	Extended            TestSignal[int]          // an extend batch came back; n locks extended
	ExtendFailed        TestSignal[error]        // an extend batch failed as a whole (retried)
	Lost                TestSignal[string]       // a held lock was declared lost
	Released            TestSignal[string]       // a release of the key's lock came back
	Woken               TestSignal[string]       // a notification, or the key's registration as waited for (waiters.go), started an attempt for the key
	Retrying            TestSignal[string]       // the key's attempt failed or was contended; its next one is scheduled
	Listening           TestSignal[struct{}]     // the listener (re)subscribed
	Stuck               TestSignal[BatchKind]    // a batch got no answer for stuckAfter: caps no longer count it; its attempts are hedged
	ListenerProbeFailed TestSignal[struct{}]     // the listener's probe failed; it reconnects
	Polling             TestSignal[struct{}]     // the listener stopped for good (transaction-mode pooler)
	ReleaseRetry        TestSignal[string]       // a release with an unknown outcome was scheduled again (its lockId)
	ExtendAsked         TestSignal[string]       // the loop took a Lock.Extend call for the key
	TriggerChecked      TestSignal[bool]         // the listener checked for the release trigger: installed?
	ExtendTimed         TestSignal[ExtendTiming] // one lock's extend succeeded: when it was due and sent
	Registered          TestSignal[int]          // run got the keys the listener registered as waited for (how many)
	revoked             TestSignal[string]       // a held lock was ended as revoked
	RevokeKept          TestSignal[string]       // a revoke that matched no held lock was remembered (its lockId hash)
	releaseRequested    TestSignal[string]       // a held lock's ReleaseRequested was closed
	WatchRead           TestSignal[int]          // a snapshot read for watches came back (how many keys)
	Shedding            TestSignal[bool]         // the Manager started (true) or stopped (false) holding back acquires (overload.go)
	Turn                TestSignal[bool]         // a fair-queue notice came on this process's queue channel (granted?)
	ticket              TestSignal[int]          // a waiter's place in its key's fair queue changed (the place)
	LeftGranted         TestSignal[string]       // a leaving waiter's ticket had been granted; the leave released it
}

func (s *Signals) Init() {
	s.BatchSent.Init()
	s.Queued.Init()
	s.Granted.Init()
	s.Abandoned.Init()
	s.TakenBack.Init()
	s.Orphaned.Init()
	s.Extended.Init()
	s.ExtendFailed.Init()
	s.Lost.Init()
	s.Released.Init()
	s.Woken.Init()
	s.Retrying.Init()
	s.Listening.Init()
	s.Stuck.Init()
	s.ListenerProbeFailed.Init()
	s.Polling.Init()
	s.ReleaseRetry.Init()
	s.Registered.Init()
	s.ExtendAsked.Init()
	s.TriggerChecked.Init()
	s.ExtendTimed.Init()
	s.revoked.Init()
	s.RevokeKept.Init()
	s.releaseRequested.Init()
	s.WatchRead.Init()
	s.Shedding.Init()
	s.Turn.Init()
	s.ticket.Init()
	s.LeftGranted.Init()
}

// BatchKind names a kind of batched statement.
type BatchKind string

const (
	KindAcquire BatchKind = "acquire"
	KindRelease BatchKind = "release"
	KindExtend  BatchKind = "extend"
	KindHandOff BatchKind = "handoff" // a release and the next local waiter's acquire in one statement
	KindShared  BatchKind = "shared"  // shared holds (readers, permits)
	KindSets    BatchKind = "sets"    // all-or-nothing sets
)

type BatchInfo struct {
	Kind BatchKind
	N    int
}

// testHooks let tests stop a DB goroutine at a chosen point. Nil in
// production.
// extendTiming is one successful extend of key: the previous lease's
// start (acquire or last extend attempt), when the heartbeat had the
// extend due, and when its attempt started.
type ExtendTiming struct {
	Key                   string
	PrevStart, Due, Start time.Time
}

type TestHooks struct {
	// jitter, if set, draws a release retry's jitter in [0, n) instead
	// of math/rand (a simulator's seeded draws replay).
	jitter func(n time.Duration) time.Duration
	// BeforeBatch runs in the DB goroutine just before the statement is
	// sent (after the loop counted the batch as in flight).
	BeforeBatch func(kind BatchKind, n int)
	// ListenConfig may change the listener's connection config (e.g.
	// route it through a fault proxy) before each connect.
	ListenConfig func(*pgx.ConnConfig)
	// ListenProbe, if set, replaces the listener's probe interval and
	// timeout.
	ListenProbe time.Duration
	// ListenIdleTimeout, if set, replaces the listening session's
	// idle_session_timeout (connx.DefaultLiveness).
	ListenIdleTimeout time.Duration
	// TimerFired, if set, runs when a loss timer or the loop's wake-up
	// timer fires, before it acts, with how late it fired; a test makes
	// the runtime's delay in running timers after SIGCONT certain.
	TimerFired func(late time.Duration)
	// StuckAfter, if set, replaces stuckAfter (flight.go).
	StuckAfter time.Duration
	// AfterAcquire, if set, runs in the DB goroutine of an acquire batch
	// after its statement was answered, before the answer is posted.
	AfterAcquire func()
	// slowRoundTrip and shedCalm, if set, replace slowRoundTrip and
	// shedCalm (overload.go).
	slowRoundTrip, ShedCalm time.Duration
	// Clock, if set, replaces heartbeat.Now as the Manager's clock
	// (Manager.now): a test moves it to suspend the machine.
	Clock func() time.Time
}
