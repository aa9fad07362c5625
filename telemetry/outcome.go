package telemetry

import (
	"context"
	"errors"

	"github.com/pglease/pglease"
)

// outcome values of attrOutcome.
const (
	outcomeGranted  = "granted"
	outcomeLocked   = "locked" // TryAcquire: held elsewhere
	outcomeTimeout  = "timeout"
	outcomeAborted  = "aborted"
	outcomeClosed   = "closed"
	outcomeError    = "error"
	outcomeOK       = "ok"
	outcomeNotHeld  = "not_held"
	numAcquireOutcs = 6
)

// acquireOutcome indexes the acquire outcome sets.
type acquireOutcome uint8

const (
	aoGranted acquireOutcome = iota
	aoLocked
	aoTimeout
	aoAborted
	aoClosed
	aoError
)

var acquireOutcomeNames = [numAcquireOutcs]string{
	aoGranted: outcomeGranted,
	aoLocked:  outcomeLocked,
	aoTimeout: outcomeTimeout,
	aoAborted: outcomeAborted,
	aoClosed:  outcomeClosed,
	aoError:   outcomeError,
}

func acquireOutcomeOf(err error) acquireOutcome {
	if err == nil {
		return aoGranted
	}
	switch pglease.CodeOf(err) {
	case pglease.CodeAcquisitionTimeout:
		return aoTimeout
	case pglease.CodeAborted:
		return aoAborted
	case pglease.CodeClosed:
		return aoClosed
	case 0:
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return aoAborted
		}
	}
	return aoError
}

// errorType is the value of error.type for err: the pglease Code name
// ("LockLost"), or for other errors a fixed class. It never contains
// err.Error(), which may quote a caller's text.
func errorType(err error) string {
	if err == nil {
		return ""
	}
	if c := pglease.CodeOf(err); c != 0 {
		return c.String()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	}
	return "_OTHER"
}

// sqlState returns the SQLSTATE of the server error in err's chain, or ""
// (pgconn.PgError and pglease's mapped server errors have SQLState).
func sqlState(err error) string {
	var st interface{ SQLState() string }
	if err != nil && errors.As(err, &st) {
		return st.SQLState()
	}
	return ""
}
