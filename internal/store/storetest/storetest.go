// Package storetest states the lease store's semantics as one test suite,
// Exercise, run against every implementation of the method set the
// Manager's kernel calls: the real store on PostgreSQL (package store's
// tests) and the in-memory model (package model's). Where the two
// differ, the real store is right and the model is fixed. The suite is
// modelled on River's riverdrivertest.Exercise.
//
// Time: the suite reads the store's clock with Harness.Now and lets time
// pass with Harness.Advance, which for the real store waits on the
// server's clock and for the model moves the injected one. Assertions
// about time hold whatever Advance overshoots by (a loaded machine), or
// are checked only when the clock readings around a call decide them.
// Notifications are checked through Harness.Listen: each step is closed by
// a release request of a marker key, so that the payloads before the
// marker are the step's, and their absence is checked without waiting.
//
// This package is test infrastructure: unstable, for this module's tests.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
)

// Store is the method set of *store.Store that the Manager's kernel
// calls: what the model implements and the suite exercises.
type Store interface {
	AcquireMany(ctx context.Context, reqs []store.AcquireRequest) ([]store.AcquireResult, error)
	AcquireSets(ctx context.Context, sets [][]store.AcquireRequest) ([][]store.AcquireResult, error)
	AcquireSharedMany(ctx context.Context, reqs []store.SharedRequest) ([]store.AcquireResult, error)
	ExtendMany(ctx context.Context, reqs []store.ExtendRequest) ([]store.ExtendResult, error)
	Guard(ctx context.Context, tx store.DB, lockID string) (store.GuardResult, error)
	HandOff(ctx context.Context, reqs []store.HandOffRequest) ([]store.HandOffResult, error)
	Holder() string
	LookupByKey(ctx context.Context, key string) (*store.LockInfo, error)
	MarkChecked()
	ReleaseWaited(ctx context.Context, reqs []store.ReleaseRequest) ([]bool, error)
	RequestRelease(ctx context.Context, ks []string, holds []string) error
	Revoke(ctx context.Context, reqs []store.RevokeRequest) ([]store.RevokeResult, error)
	Snapshot(ctx context.Context, ks []string) ([]store.KeyState, error)
}

var _ Store = (*store.Store)(nil)

// Harness is one fresh, empty store for one test.
type Harness struct {
	// Store is the store under test, with holder identity HolderA and a
	// notify channel configured.
	Store Store
	// Other is a second Store on the same data (another process of the
	// fleet), with holder identity HolderB.
	Other Store
	// Now reads the store's clock (the server's, for the real store).
	Now func(t testing.TB) time.Time
	// Advance returns once at least d has passed on the store's clock
	// since it was called.
	Advance func(t testing.TB, d time.Duration)
	// Tx returns a transaction for Guard, ended when the test ends.
	Tx func(t testing.TB) store.DB
	// SetFence, if not nil, sets key's fence counter to f (as an operator
	// could, or a long life): for the tests at the fence limit, which are
	// skipped without it.
	SetFence func(t testing.TB, key string, f pglease.Fence)
	// Listen, if not nil, starts listening to Store's notify channel. The
	// notification tests are skipped without it.
	Listen func(t testing.TB) Listener
}

// Listener is a session listening to the Store's notify channel.
type Listener struct {
	// Next returns the next payload received, failing the test when none
	// comes.
	Next func() string
	// Wait makes the session wait for key (take its waiter lock,
	// store.RegisterWaiters), Watch watch it (its watch lock,
	// store.RegisterWatchers).
	Wait, Watch func(key string)
}

// The holder identities of Harness.Store and Harness.Other.
const (
	HolderA = "storetest-a"
	HolderB = "storetest-b"
)

// Option tunes Exercise.
type Option func(*options)

type options struct {
	wrap func(t *testing.T, body func(t *testing.T))
}

// Wrap runs each test's body (its harness made, then its case) through
// wrap, which must call body once with a *testing.T: a model's tests pass
// synctest.Test, so that the suite runs in a bubble with a fake clock
// (Harness.Now time.Now, Advance time.Sleep).
func Wrap(wrap func(t *testing.T, body func(t *testing.T))) Option {
	return func(o *options) { o.wrap = wrap }
}

// Exercise runs the conformance suite. newHarness is called once per
// test, and must return a fresh store (no key of the suite granted).
// Tests run in parallel.
func Exercise(t *testing.T, newHarness func(t *testing.T) *Harness, opts ...Option) {
	o := options{wrap: func(t *testing.T, body func(*testing.T)) { body(t) }}
	for _, f := range opts {
		f(&o)
	}
	groups := []struct {
		name  string
		tests []test
	}{
		{"AcquireMany", acquireTests},
		{"ExtendMany", extendTests},
		{"ReleaseWaited", releaseTests},
		{"LockDelay", delayTests},
		{"AcquireSharedMany", sharedTests},
		{"WriterPreference", writerTests},
		{"AcquireSets", setTests},
		{"HandOff", handOffTests},
		{"Revoke", revokeTests},
		{"RequestRelease", requestTests},
		{"Holder", holderTests},
		{"LookupByKey", lookupTests},
		{"Snapshot", snapshotTests},
		{"Guard", guardTests},
		{"MarkChecked", markTests},
		{"FenceLimit", fenceLimitTests},
		{"Notifications", notifyTests},
		{"Watches", watchTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					o.wrap(t, func(t *testing.T) { tc.run(t, &env{Harness: newHarness(t), t: t}) })
				})
			}
		})
	}
}

// test is one case of the suite.
type test struct {
	name string
	run  func(t *testing.T, e *env)
}
