// Package pgerr maps errors from pgx and PostgreSQL to *pglease.Error by
// SQLSTATE code constants (never by a server message's text; one pgx
// client error, an argument it cannot encode, has no type but its
// wording), and strips anything
// from a server error that could echo a key or lockId.
package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/pglease/pglease"
)

// CodeFor returns the pglease code for a SQLSTATE.
func CodeFor(sqlstate string) pglease.Code {
	switch sqlstate {
	case pgerrcode.ConnectionException, pgerrcode.ConnectionDoesNotExist, pgerrcode.ConnectionFailure,
		pgerrcode.SQLClientUnableToEstablishSQLConnection, pgerrcode.SQLServerRejectedEstablishmentOfSQLConnection,
		pgerrcode.TransactionResolutionUnknown, pgerrcode.ProtocolViolation,
		pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
		pgerrcode.IdleSessionTimeout, pgerrcode.IdleInTransactionSessionTimeout,
		pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected, pgerrcode.StatementCompletionUnknown,
		pgerrcode.TransactionIntegrityConstraintViolation,
		pgerrcode.ReadOnlySQLTransaction:
		return pglease.CodeServiceUnavailable
	case pgerrcode.InvalidAuthorizationSpecification, pgerrcode.InvalidPassword,
		pgerrcode.InsufficientPrivilege:
		return pglease.CodeAuthFailed
	case pgerrcode.DataException, pgerrcode.StringDataRightTruncationDataException,
		pgerrcode.NumericValueOutOfRange, pgerrcode.InvalidTextRepresentation,
		pgerrcode.CharacterNotInRepertoire, pgerrcode.UntranslatableCharacter,
		pgerrcode.NotNullViolation, pgerrcode.ForeignKeyViolation, pgerrcode.CheckViolation,
		pgerrcode.UndefinedTable, pgerrcode.UndefinedColumn, pgerrcode.UndefinedFunction,
		pgerrcode.InvalidSchemaName, pgerrcode.SyntaxError,
		// Raised by pglease's SQL functions (the SQL API, the guard's
		// installer) for bad input.
		pgerrcode.InvalidParameterValue,
		// The connection string names a database that does not exist:
		// a configuration error that no retry fixes (like 28000/28P01).
		pgerrcode.InvalidCatalogName,
		pgerrcode.DuplicatePreparedStatement, pgerrcode.InvalidSQLStatementName:
		return pglease.CodeInvalidArgument
	case pgerrcode.InsufficientResources, pgerrcode.DiskFull, pgerrcode.OutOfMemory,
		pgerrcode.TooManyConnections, pgerrcode.ConfigurationLimitExceeded:
		return pglease.CodeResourceExhausted
	case pgerrcode.QueryCanceled, pgerrcode.LockNotAvailable:
		return pglease.CodeNetworkTimeout
	}
	return pglease.CodeInternal
}

// safePgError is a copy of a *pgconn.PgError without the fields that can
// echo user data (Detail, Where, Hint, the internal query): a 23505 on the
// lock_id index says "Key (lock_id)=(…)" in Detail.
type safePgError struct {
	Severity string
	Code     string
	Message  string
}

func (e *safePgError) Error() string {
	return fmt.Sprintf("%s: %s (SQLSTATE %s)", e.Severity, e.Message, e.Code)
}

// SQLState returns the SQLSTATE, as pgconn.PgError does.
func (e *safePgError) SQLState() string { return e.Code }

// PrivilegeMsg is the message of the error Map returns for 42501
// (permission denied): where the runtime role's grants come from and how
// to check a role.
const PrivilegeMsg = "permission denied: the role lacks a privilege; pglease's runtime role needs the grants of roles.sql " +
	"(`pglease sql roles` prints it, migrate.RolesSQL fills it in), and migrate.Migrator.MissingPrivileges lists what a role lacks"

// StmtCacheMsg is the message of the error Map returns for 42P05/26000:
// what is wrong and how to fix it.
const StmtCacheMsg = "prepared statement conflict: pgx's statement cache is in use behind a transaction-mode pooler " +
	"(e.g. PgBouncer pool_mode=transaction), which runs each transaction on another server connection; " +
	"add default_query_exec_mode=exec to the connection string (or set ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec), " +
	"or use PgBouncer >= 1.21 with max_prepared_statements > 0"

// ReadOnlyMsg is the message of the error Map returns for 25006: the
// server refused a write because it is read-only.
const ReadOnlyMsg = "the server is read-only (a standby, a demoted primary, or default_transaction_read_only): " +
	"the connection is dropped; with several hosts and target_session_attrs=read-write the next one finds the writer"

// ReadOnly reports whether err is a server's refusal of a write because
// it is read-only (SQLSTATE 25006, read_only_sql_transaction: a standby,
// "cannot execute … during recovery", or a read-only transaction).
func ReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ReadOnlySQLTransaction
}

// SchemaMissing is the message of an error from a statement on pglease's
// own tables and functions (MapSchema) that the server refused because one
// of them does not exist.
const SchemaMissing = "pglease's tables or functions are missing or out of date: run SetupSchema or apply pg/migrate/sql/schema.sql"

// missingObject reports whether sqlstate says a table, function or schema
// does not exist.
func missingObject(sqlstate string) bool {
	switch sqlstate {
	case pgerrcode.UndefinedTable, pgerrcode.UndefinedFunction, pgerrcode.InvalidSchemaName:
		return true
	}
	return false
}

// ErrStatementTimeout is the cause a caller gives the context of its own
// per-statement deadline (context.WithTimeoutCause), as the Manager does
// for every batch it sends. When such a context ends, Map reports
// CodeNetworkTimeout (a timeout of the library's, retryable: the caller's
// context is alive), not CodeAborted (the caller's context ended).
var ErrStatementTimeout = errors.New("statement timeout")

// MapSchema is Map for statements on pglease's own tables and functions
// (pg.Store operations): an undefined table (42P01), function (42883) or
// schema (3F000) is InvalidArgument with the message SchemaMissing, which
// says how to create them. Errors from statements on other tables (a
// FenceGuard's) or from SetupSchema itself go through Map.
func MapSchema(ctx context.Context, op string, err error) error {
	return mapErr(ctx, op, err, true)
}

// Map converts err, returned by pgx for operation op, into a *pglease.Error.
// ctx is the caller's context: when it has ended, the error is Aborted
// wrapping the context's error. An existing *pglease.Error passes through.
// nil maps to nil.
func Map(ctx context.Context, op string, err error) error {
	return mapErr(ctx, op, err, false)
}

func mapErr(ctx context.Context, op string, err error, ownSchema bool) error {
	if err == nil {
		return nil
	}
	var le *pglease.Error
	if errors.As(err, &le) {
		return err
	}
	if ctx != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrStatementTimeout) {
			// The library's own per-statement deadline, not the caller's
			// context: a timeout a retry may get past.
			return New(pglease.CodeNetworkTimeout, op, "statement timeout passed", cause)
		}
		return New(pglease.CodeAborted, op, "context ended", ctx.Err())
	}
	if errors.Is(err, pgx.ErrTxClosed) {
		// pgx refuses before sending anything.
		return New(pglease.CodeInvalidArgument, op, "the transaction has already ended (committed or rolled back): nothing was sent", err)
	}
	if isEncodeErr(err) {
		// An argument pgx cannot encode for its parameter's type: the
		// statement was not executed. Its text can carry the
		// value, so only the cause's type is kept.
		return New(pglease.CodeInvalidArgument, op, "an argument cannot be encoded for its column's type: nothing was executed", nil)
	}
	if errors.Is(err, puddle.ErrClosedPool) {
		// Not retryable: a closed pool stays closed.
		return New(pglease.CodeClosed, op, "connection pool closed", err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return New(pglease.CodeAborted, op, "context ended", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		safe := &safePgError{Severity: pgErr.Severity, Code: pgErr.Code, Message: pgErr.Message}
		if pgErr.Code == pgerrcode.DuplicatePreparedStatement || pgErr.Code == pgerrcode.InvalidSQLStatementName {
			// pglease names no prepared statements or portals: these come
			// from pgx's statement cache ("stmtcache_…") meeting a
			// transaction-mode pooler that hands each transaction another
			// server connection. Not retryable: the configuration is wrong.
			return New(pglease.CodeInvalidArgument, op, StmtCacheMsg, safe)
		}
		if pgErr.Code == pgerrcode.InsufficientPrivilege {
			return New(pglease.CodeAuthFailed, op, PrivilegeMsg, safe)
		}
		if pgErr.Code == pgerrcode.UniqueViolation {
			// The message names only the constraint; Detail (dropped) holds the value.
			return New(pglease.CodeInternal, op, "unique violation", safe)
		}
		if pgErr.Code == pgerrcode.ReadOnlySQLTransaction {
			return New(pglease.CodeServiceUnavailable, op, ReadOnlyMsg, safe)
		}
		if ownSchema && missingObject(pgErr.Code) {
			return New(CodeFor(pgErr.Code), op, SchemaMissing, safe)
		}
		return New(CodeFor(pgErr.Code), op, "server error", safe)
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		// A ConnectError may wrap a PgError (auth failure) — handled above.
		return New(pglease.CodeServiceUnavailable, op, "cannot connect", err)
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return New(pglease.CodeNetworkTimeout, op, "network timeout", err)
	}
	if pgconn.Timeout(err) {
		return New(pglease.CodeNetworkTimeout, op, "timeout", err)
	}
	if errors.As(err, &netErr) || pgconn.SafeToRetry(err) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return New(pglease.CodeServiceUnavailable, op, "connection lost", err)
	}
	return New(pglease.CodeInternal, op, "unexpected error", err)
}

// isEncodeErr reports whether err is pgx's failure to encode a query
// argument ("failed to encode args[i]: …", pgx v5's only wording for it,
// from its extended-query builder, before the Execute message is sent).
func isEncodeErr(err error) bool {
	return strings.Contains(err.Error(), "failed to encode args[")
}

// CatalogRace reports whether err is PostgreSQL's answer to two sessions
// running the same idempotent DDL at once (CREATE … IF NOT EXISTS, CREATE
// OR REPLACE): the IF NOT EXISTS check passed in both, and the second
// insert into the system catalog collides. Retrying the DDL succeeds (it
// then finds the object). These are: a unique violation on a system
// catalog index (pg_type_typname_nsp_index, pg_class_relname_nsp_index,
// … all named pg_*), duplicate table/object/function/schema, a deadlock
// or serialization failure between the two, and "tuple concurrently
// updated" (XX000) from CREATE OR REPLACE FUNCTION.
func CatalogRace(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgerrcode.UniqueViolation:
		return strings.HasPrefix(pgErr.ConstraintName, "pg_")
	case pgerrcode.DuplicateTable, pgerrcode.DuplicateObject, pgerrcode.DuplicateFunction,
		pgerrcode.DuplicateSchema, pgerrcode.DeadlockDetected, pgerrcode.SerializationFailure:
		return true
	case pgerrcode.InternalError:
		return strings.HasPrefix(pgErr.Message, "tuple concurrently ")
	}
	return false
}

// CatalogRaceMsg is the message of a catalog race that retries did not
// get past (a retryable ServiceUnavailable).
const CatalogRaceMsg = "another session was creating the same schema objects at the same moment; retry"
