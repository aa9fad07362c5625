// Package pgleasetest helps test code that uses pglease: your code, not
// pglease itself (docs/testing.md).
//
//   - NewFake is an in-memory pglease.Locker with the Manager's rules (one
//     holder per key, FIFO waiters, strictly increasing fences, a lease's
//     Context ending with the cause of its end, the same error codes on
//     the same bad input), for unit tests without PostgreSQL.
//   - Start gives one test a Manager on a PostgreSQL of its own (a
//     throwaway server found on the machine, or DATABASE_URL), with
//     pglease's schema set up, and a pool for the test's own tables;
//     t.Cleanup removes it all.
//   - Lose, Revoke, CutConnections and StopFor make the faults code must
//     survive: a lost lease, a revoked one, the Manager's connections cut,
//     the server down for a while.
//   - Conformance is the suite NewFake's Locker and a Manager's
//     ((*manager.Manager).Locker) both pass; run it on a Locker of your
//     own.
//
// Code under test takes a pglease.Locker rather than a *manager.Manager,
// so that its tests can give it either.
package pgleasetest
