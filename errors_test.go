package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pglease/pglease"
)

func TestErrorIsAsByCode(t *testing.T) {
	t.Parallel()
	cause := errors.New("boom")
	err := fmt.Errorf("wrapped: %w", pglease.NewError(pglease.CodeServiceUnavailable, "pg.Acquire", "connection lost", cause))
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
	if !pglease.Retryable(err) || pglease.Retryable(pglease.NewError(pglease.CodeInvalidArgument, "", "", nil)) {
		t.Fatal("Retryable wrong")
	}
	if pglease.Retryable(context.Canceled) || pglease.CodeOf(nil) != 0 {
		t.Fatal("plain errors are not retryable / have no code")
	}
}

func TestCheckContext(t *testing.T) {
	t.Parallel()
	//lint:ignore SA1012 testing the nil-context guard on purpose
	if err := pglease.CheckContext("op", nil); !errors.Is(err, pglease.ErrInvalidArgument) { //nolint:staticcheck
		t.Fatalf("nil ctx: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := pglease.CheckContext("op", ctx); !errors.Is(err, pglease.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("ended ctx: %v", err)
	}
	if err := pglease.CheckContext("op", context.Background()); err != nil {
		t.Fatal(err)
	}
}

func ExampleError() {
	err := fmt.Errorf("job 42: %w", pglease.NewError(pglease.CodeAcquisitionTimeout, "manager.Acquire", "wait bound passed", nil))
	fmt.Println(errors.Is(err, pglease.ErrAcquisitionTimeout), pglease.Retryable(err))
	var e *pglease.Error
	if errors.As(err, &e) {
		fmt.Println(e.Code)
	}
	// Output:
	// true true
	// AcquisitionTimeout
}
