package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pglease/pglease"
)

func TestErrorIsAsByCode(t *testing.T) {
	t.Parallel()
	cause := errors.New("boom")
	err := fmt.Errorf("wrapped: %w", newErr(pglease.CodeServiceUnavailable, "pg.Acquire", "connection lost", cause))
	if !errors.Is(err, pglease.ErrServiceUnavailable) {
		t.Fatal("errors.Is by code failed")
	}
	if errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatal("errors.Is matched another code")
	}
	if !errors.Is(err, cause) {
		t.Fatal("cause not reachable")
	}
	var e *pglease.Error
	if !errors.As(err, &e) || e.Op != "pg.Acquire" || e.Code != pglease.CodeServiceUnavailable {
		t.Fatalf("errors.As: %+v", e)
	}
	if got, want := e.Error(), "pglease: pg.Acquire: ServiceUnavailable: connection lost: boom"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if !pglease.Retryable(err) || pglease.Retryable(newErr(pglease.CodeInvalidArgument, "", "", nil)) {
		t.Fatal("Retryable wrong")
	}
	if pglease.Retryable(context.Canceled) || pglease.CodeOf(nil) != 0 {
		t.Fatal("plain errors are not retryable / have no code")
	}
}

func ExampleError() {
	err := fmt.Errorf("job 42: %w", &pglease.Error{Code: pglease.CodeAcquisitionTimeout, Op: "manager.Acquire", Msg: "wait bound passed"})
	fmt.Println(errors.Is(err, pglease.ErrAcquisitionTimeout), pglease.Retryable(err))
	var e *pglease.Error
	if errors.As(err, &e) {
		fmt.Println(e.Code)
	}
	// Output:
	// true true
	// AcquisitionTimeout
}

// TestErrorOnePrefix: an *Error wrapping *Errors reads with one "pglease: "
// prefix, and a nested Op or Code is written only when it differs.
func TestErrorOnePrefix(t *testing.T) {
	t.Parallel()
	eof := errors.New("EOF")
	lost := newErr(pglease.CodeServiceUnavailable, "pg.AcquireMany", "connection lost", eof)
	cases := []struct {
		err  error
		want string
	}{
		{newErr(pglease.CodeAcquisitionTimeout, "manager.Acquire", "gave up", lost),
			"pglease: manager.Acquire: AcquisitionTimeout: gave up: pg.AcquireMany: ServiceUnavailable: connection lost: EOF"},
		{newErr(pglease.CodeLockLost, "manager.Release", "the lock had been lost before it was released",
			newErr(pglease.CodeLockLost, "manager.Lock", "trust window passed", nil)),
			"pglease: manager.Release: LockLost: the lock had been lost before it was released: manager.Lock: trust window passed"},
		{newErr(pglease.CodeAmbiguous, "pg.AcquireMany", "outcome unknown", lost),
			"pglease: pg.AcquireMany: Ambiguous: outcome unknown: ServiceUnavailable: connection lost: EOF"},
		{newErr(pglease.CodeAcquisitionTimeout, "manager.Acquire", "gave up",
			newErr(pglease.CodeAcquisitionTimeout, "manager.Acquire", "", nil)),
			"pglease: manager.Acquire: AcquisitionTimeout: gave up: AcquisitionTimeout"},
		{newErr(pglease.CodeAborted, "manager.Acquire", "", fmt.Errorf("%w after 3 attempts", lost)),
			"pglease: manager.Acquire: Aborted: pg.AcquireMany: ServiceUnavailable: connection lost: EOF after 3 attempts"},
		{newErr(pglease.CodeInternal, "", "", nil), "pglease: Internal"},
	}
	for _, c := range cases {
		got := c.err.Error()
		if got != c.want {
			t.Errorf("Error() =\n  %q\nwant\n  %q", got, c.want)
		}
		if n := strings.Count(got, "pglease:"); n != 1 {
			t.Errorf("%q has %d prefixes", got, n)
		}
		if !errors.Is(c.err, pglease.ErrServiceUnavailable) && strings.Contains(c.want, "ServiceUnavailable") {
			t.Errorf("%q: the nested code is no longer reachable", got)
		}
	}
}

// TestReleasedSentinel: ErrReleased is a *pglease.Error with
// its own code, so errors.Is and errors.As work on a released lock's
// cause like on every other pglease error.
func TestReleasedSentinel(t *testing.T) {
	t.Parallel()
	var target error = pglease.ErrReleased
	var e *pglease.Error
	if !errors.As(target, &e) || e.Code != pglease.CodeReleased || e.Code.String() != "Released" {
		t.Fatalf("ErrReleased = %#v", target)
	}
	cause := fmt.Errorf("wrapped: %w", newErr(pglease.CodeReleased, "manager.Release", "lock released", nil))
	if !errors.Is(cause, pglease.ErrReleased) || errors.Is(cause, pglease.ErrLockLost) || errors.Is(cause, pglease.ErrClosed) {
		t.Fatal("errors.Is by code wrong for Released")
	}
	if pglease.Retryable(cause) {
		t.Fatal("Released is not retryable")
	}
}

// newErr builds an *Error field by field, as the library does internally.
func newErr(code pglease.Code, op, msg string, cause error) *pglease.Error {
	return &pglease.Error{Code: code, Op: op, Msg: msg, Err: cause}
}

// TestRevokedSentinel: ErrRevoked has its own code and name, matches by
// code only, and is not retryable (the holder must stop).
func TestRevokedSentinel(t *testing.T) {
	t.Parallel()
	var e *pglease.Error
	if !errors.As(error(pglease.ErrRevoked), &e) || e.Code != pglease.CodeRevoked || e.Code.String() != "Revoked" {
		t.Fatalf("ErrRevoked = %#v", pglease.ErrRevoked)
	}
	cause := fmt.Errorf("wrapped: %w", newErr(pglease.CodeRevoked, "manager.Lock", "revoked", nil))
	if !errors.Is(cause, pglease.ErrRevoked) || errors.Is(cause, pglease.ErrLockLost) || errors.Is(cause, pglease.ErrReleased) {
		t.Fatal("errors.Is by code wrong for Revoked")
	}
	if pglease.Retryable(cause) {
		t.Fatal("Revoked is not retryable")
	}
}
