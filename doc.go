// Package pglease holds the types shared by every pglease package: the one
// error type (*Error with a Code) and its sentinels, the fencing token
// (Fence), the Handle every held lock satisfies, and HashKey, the key hash
// that telemetry, logs and lock listings identify keys by.
//
// It imports no other pglease package, so pg/, manager/, telemetry/ and
// user code can all depend on it. Most programs start in package manager;
// package pg gives direct, single-round-trip access to the lease-lock
// tables and to PostgreSQL advisory locks (pg/advisory).
//
// # Errors
//
// Every error returned by pglease is, or wraps, an *Error, except the
// error of a function of yours that pglease runs and passes back unchanged
// (manager.Manager.Do's and election.Run's fn). Test for a condition with
// errors.Is against the sentinels (ErrInvalidArgument, ErrClosed,
// ErrLockLost, …), which compare by Code, or extract the *Error with
// errors.As. Retryable reports whether trying the same call
// again may succeed. Error texts never contain a raw lock key or lockId.
package pglease
