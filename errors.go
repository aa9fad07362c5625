package pglease

import (
	"errors"
	"strings"
)

// Code classifies an Error. Codes mirror SyncGuard's LockError codes where
// SyncGuard has one, so a mixed fleet reports failures alike.
type Code uint8

// The error codes.
const (
	// CodeInternal is an unexpected condition: a bug, a fence counter past
	// the largest fence ever granted (900,000,000,000,000), or a server
	// error with no better mapping.
	CodeInternal Code = iota + 1
	// CodeInvalidArgument is bad input rejected before any I/O (key, lockId,
	// TTL, table name, nil context …), or a server error that says the
	// request itself is malformed (e.g. a missing table) or the
	// configuration wrong (a database that does not exist, 3D000). Not
	// retryable: a waiting acquire fails at once.
	CodeInvalidArgument
	// CodeAborted is a call whose context ended (cancelled or past its
	// deadline) before the outcome was known or before it started.
	CodeAborted
	// CodeClosed is a call on a Manager (or advisory session) that is closed
	// or closing, or on a connection pool that was closed.
	CodeClosed
	// CodeServiceUnavailable is a lost or refused connection, a
	// serialization failure or deadlock, or a read-only server.
	CodeServiceUnavailable
	// CodeNetworkTimeout is a statement or lock wait cancelled by a server
	// timeout (57014 query_canceled, 55P03 lock_not_available), a network
	// timeout, or a statement ended by pglease's own statement timeout
	// (manager.Config.StatementTimeout) while the caller's context was alive.
	CodeNetworkTimeout
	// CodeAuthFailed is a failed authentication (28P01), a role that does
	// not exist or may not log in (28000), or a missing privilege. Not
	// retryable: a waiting acquire fails at once.
	CodeAuthFailed
	// CodeResourceExhausted is a server out of a resource: 53200 out of
	// shared memory (the lock table is full), too many connections, disk
	// full.
	CodeResourceExhausted
	// CodeAcquisitionTimeout is a waiting acquire that gave up: its wait
	// bound (acquire timeout or context deadline) passed while the lock was
	// held by someone else. A wait that ended because the database could
	// not be reached has the code of that failure instead
	// (CodeServiceUnavailable, CodeNetworkTimeout): see manager.Acquire.
	CodeAcquisitionTimeout
	// CodeLockLost means a held lock is no longer held: it expired, its
	// extend failed past the trust window, or its session ended.
	CodeLockLost
	// CodeAmbiguous is an operation whose outcome is unknown: the commit
	// may or may not have happened (connection lost after it was sent).
	// An ambiguous acquire is never reported as success.
	CodeAmbiguous
	// CodeFenceRegression is a fence lower than one this process already
	// saw for the same key: the database lost acknowledged writes
	// (failover to an asynchronous replica, restore from backup).
	CodeFenceRegression
	// CodeHoldLimitExceeded means a held lock reached the hold limit its
	// holder was given (the most time it may be held, so that a stuck
	// holder cannot keep it forever): the handle's Context ends with it,
	// telling the holder to stop. Unlike CodeLockLost, the lock is still
	// held: it ends when the holder releases it (or, for a lease, when it
	// expires), never earlier.
	CodeHoldLimitExceeded
	// CodeReleased means a lock handle ended because its holder released
	// it: it is the cause of the handle's Context after Release, and the
	// answer of a call that needs a held lock (Extend) afterwards. It is
	// the end a holder asked for, not a failure: Release itself returns
	// nil then.
	CodeReleased
	// CodeRevoked means a held lease (exclusive, reader or permit) was
	// revoked: an operator or another process deleted it on the server
	// (manager.Manager.Revoke, the SQL function {lock}_revoke, pglease
	// release), whoever held it. It is
	// the cause of the revoked handle's Context, and what Release and
	// Extend answer afterwards. Unlike CodeLockLost, nothing went wrong
	// with the holder: someone took the lock away on purpose, and the
	// key may be held by another holder at once (or after its lock
	// delay). Not retryable: the holder must stop.
	CodeRevoked
)

var codeNames = [...]string{
	CodeInternal:           "Internal",
	CodeInvalidArgument:    "InvalidArgument",
	CodeAborted:            "Aborted",
	CodeClosed:             "Closed",
	CodeServiceUnavailable: "ServiceUnavailable",
	CodeNetworkTimeout:     "NetworkTimeout",
	CodeAuthFailed:         "AuthFailed",
	CodeResourceExhausted:  "ResourceExhausted",
	CodeAcquisitionTimeout: "AcquisitionTimeout",
	CodeLockLost:           "LockLost",
	CodeAmbiguous:          "Ambiguous",
	CodeFenceRegression:    "FenceRegression",
	CodeHoldLimitExceeded:  "HoldLimitExceeded",
	CodeReleased:           "Released",
	CodeRevoked:            "Revoked",
}

// String returns the code's name, e.g. "InvalidArgument".
func (c Code) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return "Unknown"
}

// Error is the one error type of pglease. Op names the operation
// ("pg.Acquire", "manager.Acquire", …); Msg says what went wrong in words
// that never contain a raw key or lockId; Err is the cause, if any.
type Error struct {
	Code Code
	Op   string
	Msg  string
	Err  error
}

// Error formats as "pglease: Op: Code: Msg: cause", with one "pglease: "
// prefix however deeply *Errors wrap each other: a cause that is itself an
// *Error is written without the prefix, and without its Op and Code when
// they repeat the outer ones; a cause of another type whose text starts
// with the prefix (fmt.Errorf("%w …", err)) loses that prefix:
//
//	pglease: manager.Release: LockLost: the lock had been lost before it was released: manager.Lock: trust window passed
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(prefix)
	e.write(&b, "", 0)
	return b.String()
}

const prefix = "pglease: "

// write appends "Op: Code: Msg: cause" to b, leaving out an Op or Code
// equal to the enclosing error's.
func (e *Error) write(b *strings.Builder, outerOp string, outerCode Code) {
	sep := false
	part := func(s string) {
		if sep {
			b.WriteString(": ")
		}
		b.WriteString(s)
		sep = true
	}
	if e.Op != "" && e.Op != outerOp {
		part(e.Op)
	}
	if e.Code != outerCode || e.Msg == "" {
		part(e.Code.String())
	}
	if e.Msg != "" {
		part(e.Msg)
	}
	if e.Err == nil {
		return
	}
	if inner, ok := e.Err.(*Error); ok && inner != nil {
		b.WriteString(": ")
		inner.write(b, e.Op, e.Code)
		return
	}
	// Another error type: its text, with the prefix of an *Error it
	// carries at its start (fmt.Errorf("%w: …")) removed.
	part(strings.TrimPrefix(e.Err.Error(), prefix))
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error with the same Code, so the
// sentinels below match any error of their code:
//
//	errors.Is(err, pglease.ErrInvalidArgument)
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels, one per Code, to compare with errors.Is: each matches every
// *Error of its Code, whatever its Op, Msg and cause, so an error of your
// own that should match one is an &Error{Code: …, Op: …, Err: cause}.
var (
	ErrInternal           = &Error{Code: CodeInternal}
	ErrInvalidArgument    = &Error{Code: CodeInvalidArgument}
	ErrAborted            = &Error{Code: CodeAborted}
	ErrClosed             = &Error{Code: CodeClosed}
	ErrServiceUnavailable = &Error{Code: CodeServiceUnavailable}
	ErrNetworkTimeout     = &Error{Code: CodeNetworkTimeout}
	ErrAuthFailed         = &Error{Code: CodeAuthFailed}
	ErrResourceExhausted  = &Error{Code: CodeResourceExhausted}
	ErrAcquisitionTimeout = &Error{Code: CodeAcquisitionTimeout}
	ErrLockLost           = &Error{Code: CodeLockLost}
	ErrAmbiguous          = &Error{Code: CodeAmbiguous}
	ErrFenceRegression    = &Error{Code: CodeFenceRegression}
	ErrHoldLimitExceeded  = &Error{Code: CodeHoldLimitExceeded}
	ErrReleased           = &Error{Code: CodeReleased}
	ErrRevoked            = &Error{Code: CodeRevoked}
)

// CodeOf returns the Code of the first *Error in err's chain, or 0 when
// err is nil or carries no *Error.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// Retryable reports whether the same call may succeed if tried again
// later: the server was unavailable, timed out, out of a resource, or the
// caller's wait ran out. Invalid input, closed managers, lost or revoked
// locks, ambiguous outcomes and internal errors are not retryable (an ambiguous
// acquire must be resolved, not repeated blindly). A bare context error is
// not retryable either: the caller chose to stop.
func Retryable(err error) bool {
	switch CodeOf(err) {
	case CodeServiceUnavailable, CodeNetworkTimeout, CodeResourceExhausted, CodeAcquisitionTimeout:
		return true
	}
	return false
}
