// Package advhook lends package manager the parts of advisory.Client that
// are not public API: a Client built with the Manager's telemetry, shutdown
// signal and closed cause; an acquire with the Manager's op name and a
// per-call hold limit (manager.WithHoldLimit); a Close that the Manager's
// loop starts without blocking and waits for later; and, for tests, the
// backend pid of the Client's current session and its queue lengths.
//
// Package advisory registers its functions in its init (Register), so any
// package that imports advisory finds them with Get. The type parameters
// are advisory's own types (C *advisory.Client, K advisory.Key, L
// *advisory.Lock, O *advisory.Options), which this package cannot name:
// advisory imports it.
package advhook

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/obs"
)

// Config is how the Manager's Client differs from one made by
// advisory.NewClient.
type Config struct {
	// Recorder records the Client's spans and metrics (nil: none).
	Recorder *obs.Recorder
	// OpenTimeout bounds each opening of the Client's session (0: the
	// Client's default).
	OpenTimeout time.Duration
	// Closing, when closed, makes the Client refuse new calls as closed
	// before its own Close has begun (the Manager's Close has begun).
	Closing <-chan struct{}
	// ClosedCause is the cause of a held lock's Context when Close ends
	// it, and ClosedMsg the message of calls refused after Close (zero:
	// the Client's own).
	ClosedCause error
	ClosedMsg   string
	// HeldHereMsg ends the message of a wait for a key held through this
	// Client that ended with its context (empty: the Client's own).
	HeldHereMsg string
}

// Call is one acquire through a Client.
type Call struct {
	Op        string        // the error op, e.g. "manager.LockAdvisory"
	Blocking  bool          // Lock, not TryLock
	HoldLimit time.Duration // 0: none
}

// Funcs are advisory's functions for the Manager.
type Funcs[C, K, L, O any] struct {
	// New builds a Client (no I/O); InvalidArgument for bad options.
	New func(pool *pgxpool.Pool, opts O, cfg Config) (C, error)
	// Acquire takes k as call says: a nil lock with a nil error is a
	// TryLock that found k held.
	Acquire func(ctx context.Context, c C, k K, call Call) (L, error)
	// BeginClose starts closing c, its session's close bounded by
	// timeout, and returns at once; wait blocks until the close has
	// finished.
	BeginClose func(c C, timeout time.Duration) (wait func())
	// SessionPID is the backend pid of c's current session, 0 if none
	// (tests).
	SessionPID func(c C) int32
	// Waiters is how many callers of c wait for k behind a caller of c
	// holding it (tests).
	Waiters func(c C, k K) int
}

var funcs any

// Register is called by package advisory's init.
func Register[C, K, L, O any](f Funcs[C, K, L, O]) { funcs = f }

// Get returns what package advisory registered; it panics when called
// with other types than Register was (a programming error).
func Get[C, K, L, O any]() Funcs[C, K, L, O] { return funcs.(Funcs[C, K, L, O]) }
