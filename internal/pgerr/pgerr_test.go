package pgerr

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/pglease/pglease"
)

func TestMapBySQLSTATE(t *testing.T) {
	t.Parallel()
	cases := map[string]pglease.Code{
		"08006": pglease.CodeServiceUnavailable,
		"57P01": pglease.CodeServiceUnavailable,
		"40001": pglease.CodeServiceUnavailable,
		"40P01": pglease.CodeServiceUnavailable,
		"25006": pglease.CodeServiceUnavailable,
		"28P01": pglease.CodeAuthFailed,
		"28000": pglease.CodeAuthFailed,
		"3D000": pglease.CodeInvalidArgument, // database does not exist: no retry fixes it
		"42501": pglease.CodeAuthFailed,
		"42P01": pglease.CodeInvalidArgument,
		"22021": pglease.CodeInvalidArgument,
		"53200": pglease.CodeResourceExhausted,
		"53300": pglease.CodeResourceExhausted,
		"57014": pglease.CodeNetworkTimeout,
		"55P03": pglease.CodeNetworkTimeout,
		"23505": pglease.CodeInternal,
		"42P05": pglease.CodeInvalidArgument, // pgx statement cache behind a transaction pooler
		"26000": pglease.CodeInvalidArgument,
		"XX000": pglease.CodeInternal,
	}
	for state, want := range cases {
		err := Map(context.Background(), "op", &pgconn.PgError{Code: state, Message: "m", Severity: "ERROR"})
		if got := pglease.CodeOf(err); got != want {
			t.Errorf("SQLSTATE %s → %v, want %v", state, got, want)
		}
	}
}

func TestMapDropsDetail(t *testing.T) {
	t.Parallel()
	secret := "AAAAAAAAAAAAAAAAAAAAAQ"
	err := Map(context.Background(), "pg.Acquire", &pgconn.PgError{Code: "23505", Severity: "ERROR",
		Message: `duplicate key value violates unique constraint "idx_syncguard_locks_lock_id"`,
		Detail:  "Key (lock_id)=(" + secret + ") already exists.", Where: secret, Hint: secret})
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error text leaks Detail: %v", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		t.Fatal("the original PgError (with Detail) must not be reachable through Unwrap")
	}
	var st interface{ SQLState() string }
	if !errors.As(err, &st) || st.SQLState() != "23505" {
		t.Fatal("SQLSTATE must stay reachable")
	}
}

func TestMapContextAndConnection(t *testing.T) {
	t.Parallel()
	if Map(context.Background(), "op", nil) != nil {
		t.Fatal("nil must map to nil")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Map(ctx, "op", errors.New("anything"))
	if !errors.Is(err, pglease.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("ended ctx: got %v", err)
	}
	if got := pglease.CodeOf(Map(context.Background(), "op", io.ErrUnexpectedEOF)); got != pglease.CodeServiceUnavailable {
		t.Fatalf("unexpected EOF → %v", got)
	}
	if got := pglease.CodeOf(Map(context.Background(), "op", errors.New("scan failed"))); got != pglease.CodeInternal {
		t.Fatalf("unknown error → %v", got)
	}
	le := New(pglease.CodeLockLost, "x", "", nil)
	if Map(context.Background(), "op", le) != error(le) {
		t.Fatal("an existing *pglease.Error must pass through")
	}
}

// TestMapSchemaSaysHowToCreateIt: on pglease's own statements, a missing
// table, function or schema says how to create them; Map (other tables)
// does not.
func TestMapSchemaSaysHowToCreateIt(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"42P01", "42883", "3F000"} {
		pe := &pgconn.PgError{Code: state, Message: "m", Severity: "ERROR"}
		err := MapSchema(context.Background(), "pg.Acquire", pe)
		if pglease.CodeOf(err) != pglease.CodeInvalidArgument || !strings.Contains(err.Error(), "run SetupSchema or apply pg/migrate/sql/schema.sql") {
			t.Errorf("MapSchema %s: %v", state, err)
		}
		if err := Map(context.Background(), "pg.FenceGuard.Update", pe); strings.Contains(err.Error(), "SetupSchema") {
			t.Errorf("Map %s: %v", state, err)
		}
	}
	if err := MapSchema(context.Background(), "pg.Acquire", &pgconn.PgError{Code: "42501", Severity: "ERROR"}); strings.Contains(err.Error(), "SetupSchema") {
		t.Errorf("42501: %v", err)
	}
	// A permission error says where the grants come from and keeps the
	// server's message (which names the object).
	err := Map(context.Background(), "pg.Acquire", &pgconn.PgError{Code: "42501", Severity: "ERROR", Message: "permission denied for table syncguard_locks_shared"})
	if pglease.CodeOf(err) != pglease.CodeAuthFailed || !strings.Contains(err.Error(), "`pglease sql roles`") ||
		!strings.Contains(err.Error(), "MissingPrivileges") || !strings.Contains(err.Error(), "syncguard_locks_shared") {
		t.Errorf("42501: %v", err)
	}
}

// TestMapOwnStatementTimeout: a context ended by the library's own
// statement deadline (cause ErrStatementTimeout) is a retryable
// NetworkTimeout; a caller's ended context stays Aborted; a closed pool is
// Closed, not a retryable ServiceUnavailable.
func TestMapOwnStatementTimeout(t *testing.T) {
	t.Parallel()
	own, cancel := context.WithTimeoutCause(context.Background(), 0, ErrStatementTimeout)
	defer cancel()
	<-own.Done()
	if err := Map(own, "op", context.DeadlineExceeded); pglease.CodeOf(err) != pglease.CodeNetworkTimeout || !pglease.Retryable(err) {
		t.Errorf("own statement timeout → %v", err)
	}
	callers, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := Map(callers, "op", context.Canceled); pglease.CodeOf(err) != pglease.CodeAborted {
		t.Errorf("caller's context → %v", err)
	}
	if err := Map(context.Background(), "op", puddle.ErrClosedPool); pglease.CodeOf(err) != pglease.CodeClosed || pglease.Retryable(err) {
		t.Errorf("closed pool → %v", err)
	}
}

func TestCheckContext(t *testing.T) {
	t.Parallel()
	if err := CheckContext("op", nil); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("nil ctx: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := CheckContext("op", ctx); !errors.Is(err, pglease.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("ended ctx: %v", err)
	}
	if err := CheckContext("op", context.Background()); err != nil {
		t.Fatal(err)
	}
}
