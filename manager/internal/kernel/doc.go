// Package kernel is the Manager's lock machinery, below its public face
// (package manager): one actor goroutine, run (loop.go), that owns the
// lock state (LoopState: keys and their FIFO queues, set waiters, held
// locks, watched keys, the lanes of batched statements, retries), DB
// workers that run its batches and post the outcomes back, the loss
// timer, and the loop's subscriptions to the listening service
// (manager/internal/notifier).
//
// The Manager validates a call, builds a request (AcquireReq,
// ReleaseReq, ExtendReq, a watch), hands it to the Kernel and wraps the
// answer: a grant is a *Hold, which the Manager's Lock wraps. The kernel
// reaches the database only through Store (kstore.go), the calls of
// *store.Store it makes, so that an in-memory model store can stand in
// for PostgreSQL: the seeded simulator (sim_test.go) drives loop states
// one event at a time on it and checks the invariants (invariants.go)
// after every event; a failing seed replays with
//
//	go test -run 'TestSimulate$' ./manager/internal/kernel/ -sim.seed=N -v
//
// The names this package exports are its API for package manager and
// its tests (an internal package: none of them is public API). The
// package documentation of manager describes the design: the state
// diagram of a lock, the trust window, who owns what, how it fails, and
// which file holds which part.
package kernel
