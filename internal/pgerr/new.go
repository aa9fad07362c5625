package pgerr

import (
	"context"

	"github.com/pglease/pglease"
)

// New returns a *pglease.Error. cause may be nil. msg must never contain a
// raw lock key or lockId: error texts reach logs.
func New(code pglease.Code, op, msg string, cause error) *pglease.Error {
	return &pglease.Error{Code: code, Op: op, Msg: msg, Err: cause}
}

// CheckContext validates a caller's context before any I/O: a nil context
// is InvalidArgument; a context that has already ended is Aborted wrapping
// ctx.Err() (context.Canceled or context.DeadlineExceeded).
func CheckContext(op string, ctx context.Context) error {
	if ctx == nil {
		return New(pglease.CodeInvalidArgument, op, "nil context", nil)
	}
	if err := ctx.Err(); err != nil {
		return New(pglease.CodeAborted, op, "context ended", err)
	}
	return nil
}
