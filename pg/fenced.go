package pg

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// MaxFencedColumns caps the columns one fenced write may set.
const MaxFencedColumns = 100

// FenceGuard writes rows of one table only for the holder of the newest
// lease: each guarded row stores the fence of the last accepted write in
// a BIGINT column, and a write carrying a lower fence is refused, in the
// same statement, by the database itself. It builds the statements users
// would otherwise hand-write:
//
//	UPDATE t SET c1 = $3, …, fence = $2
//	 WHERE key = $1 AND (fence IS NULL OR fence <= $2)
//
// A write is accepted when the row's stored fence is NULL or less than
// or equal to the writer's fence ("≤", so one lease may write the same
// row several times), and the stored fence becomes the writer's. A holder
// that lost its lease (paused, partitioned, slow) and writes after the
// next holder's first write is refused, however late it notices the
// loss. Fences are per lock key: guard a row only with fences of one
// lock key, and have each new holder write (claim) the row before it
// relies on it, so that every older holder is shut out from then on.
//
// # Repeated fences
//
// "≤" cannot tell a retry of the same grant from a second grant that got
// the same fence, which happens only when the lock database lost
// acknowledged grants (failover to an asynchronous replica, a restore
// from backup): both would be accepted. A guard made WithGrantColumn also
// stores which grant wrote the fence, as GrantID (a SHA-256 digest of the
// grant's lockId, never the lockId itself), and its UpdateGrant and
// UpsertGrant accept an equal fence only from the grant that wrote it: a
// repeat from another grant is an error matching both
// pglease.ErrFenceRegression and ErrFenceRepeated, and changes nothing.
// Rows written before the column existed (grant NULL) accept an equal
// fence once, from any grant, as before, and record it.
//
// Table and column names are validated (identifiers,
// ^[A-Za-z_][A-Za-z0-9_]{0,62}$, the table optionally schema-qualified)
// and quoted; values are always bound as parameters, never spliced into
// the SQL. A FenceGuard is immutable and safe for concurrent use.
type FenceGuard struct {
	table    string // quoted, possibly schema-qualified
	keyCol   string // quoted
	fenceCol string // quoted
	grantCol string // quoted; "" without a grant column
	keyName  string // unquoted, for comparisons
	fenceNm  string // unquoted
	grantNm  string // unquoted; "" without a grant column
}

// ErrFenceRepeated is the cause of the error UpdateGrant and UpsertGrant
// return when the row's fence equals the writer's but was written by
// another grant: the lock service handed out the same fence twice. The
// returned *pglease.Error has Code CodeFenceRegression.
var ErrFenceRepeated = errors.New("fence repeated: another grant already wrote this fence " +
	"(the lock database lost acknowledged grants: failover to an asynchronous replica or a restore?)")

// GrantIDLen is the length of a GrantID: 64 lowercase hex digits.
const GrantIDLen = 2 * sha256.Size

// GrantID returns the identity of the lease grant whose lockId is lockID,
// as a FenceGuard with a grant column stores it: the hex SHA-256 of a
// fixed prefix and the lockId. The lockId is a bearer secret (it extends
// and releases the lease); its GrantID grants nothing and cannot be turned
// back into it (a lockId holds 128 random bits), so it may be stored in
// resource tables and shown in logs. It returns "" when lockID is not a
// lockId; the guard refuses "" with InvalidArgument. manager.Lock.GrantID
// returns the same value for a held lock.
func GrantID(lockID string) string {
	if keys.ValidateLockID(lockID) != nil {
		return ""
	}
	sum := sha256.Sum256([]byte("pglease grant v1\x00" + lockID))
	return hex.EncodeToString(sum[:])
}

func validGrantID(g string) bool {
	if len(g) != GrantIDLen {
		return false
	}
	for i := 0; i < len(g); i++ {
		if c := g[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// isNilDB reports whether db is nil or holds a nil pointer (a nil
// *pgxpool.Pool or *pgx.Conn would otherwise panic at first use).
func isNilDB(db DB) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// Set is one column assignment of a fenced write: Column (an identifier,
// validated and quoted) gets Value (bound as a parameter).
type Set struct {
	Column string
	Value  any
}

// NewFenceGuard returns a guard for table, whose rows are identified by
// keyColumn and carry their fence in fenceColumn (BIGINT, NULL meaning
// "never written under a lease"). Upsert needs a unique constraint on
// keyColumn alone. Bad names are InvalidArgument; no I/O.
func NewFenceGuard(table, keyColumn, fenceColumn string) (*FenceGuard, error) {
	const op = "pg.NewFenceGuard"
	schema, ident, err := parseTable(op, "table", table)
	if err != nil {
		return nil, err
	}
	if !identRe.MatchString(keyColumn) {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "key column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	if !identRe.MatchString(fenceColumn) {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "fence column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	if keyColumn == fenceColumn {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "key and fence columns must differ", nil)
	}
	return &FenceGuard{
		table:    quote(schema, ident),
		keyCol:   pgx.Identifier{keyColumn}.Sanitize(),
		fenceCol: pgx.Identifier{fenceColumn}.Sanitize(),
		keyName:  keyColumn,
		fenceNm:  fenceColumn,
	}, nil
}

// WithGrantColumn returns a copy of g that also keeps, in column (TEXT,
// NULL allowed; add it with ALTER TABLE … ADD COLUMN column text), the
// GrantID of the grant that wrote each row's fence, so that a repeated
// fence is told from a retry of the same grant (see FenceGuard). Its
// writes go through UpdateGrant and UpsertGrant; Update and Upsert refuse
// to run on it (they would erase the grant). Bad names are
// InvalidArgument; no I/O.
func (g *FenceGuard) WithGrantColumn(column string) (*FenceGuard, error) {
	const op = "pg.FenceGuard.WithGrantColumn"
	switch {
	case g == nil || g.table == "":
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "nil or zero FenceGuard (use NewFenceGuard)", nil)
	case !identRe.MatchString(column):
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "grant column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	case column == g.keyName || column == g.fenceNm:
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "the grant column must differ from the key and fence columns", nil)
	}
	c := *g
	c.grantCol, c.grantNm = pgx.Identifier{column}.Sanitize(), column
	return &c, nil
}

// check validates a write before any I/O and returns the quoted set
// columns and their values. grant is the writer's GrantID for the *Grant
// methods, nil for Update/Upsert.
func (g *FenceGuard) check(op string, ctx context.Context, db DB, key any, fence pglease.Fence, grant *string, sets []Set) ([]string, []any, error) {
	bad := func(msg string) ([]string, []any, error) {
		return nil, nil, pgerr.New(pglease.CodeInvalidArgument, op, msg, nil)
	}
	if g == nil || g.table == "" {
		return bad("nil or zero FenceGuard (use NewFenceGuard)")
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, nil, err
	}
	switch {
	case grant == nil && g.grantCol != "":
		return bad("this guard keeps grants (WithGrantColumn): use UpdateGrant/UpsertGrant")
	case grant != nil && g.grantCol == "":
		return bad("this guard has no grant column: make it with WithGrantColumn, or use Update/Upsert")
	case grant != nil && !validGrantID(*grant):
		return bad("grant must be a GrantID (64 hex digits; pg.GrantID(lockID) or manager.Lock.GrantID), never the lockId itself")
	case isNilDB(db):
		return bad("nil DB")
	case key == nil:
		return bad("nil key")
	case fence <= 0 || fence > keys.FenceMax:
		return bad("fence must be between 1 and keys.FenceMax")
	case len(sets) > MaxFencedColumns:
		return bad("too many columns")
	}
	cols := make([]string, 0, len(sets))
	vals := make([]any, 0, len(sets))
	seen := make(map[string]bool, len(sets))
	for _, s := range sets {
		switch {
		case !identRe.MatchString(s.Column):
			return bad("column names must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$")
		case s.Column == g.keyName || s.Column == g.fenceNm || s.Column == g.grantNm:
			return bad("the key, fence and grant columns cannot be set")
		case seen[s.Column]:
			return bad("duplicate column")
		}
		seen[s.Column] = true
		cols = append(cols, pgx.Identifier{s.Column}.Sanitize())
		vals = append(vals, s.Value)
	}
	return cols, vals, nil
}

// Update sets the given columns (possibly none: then only the fence is
// stored) of the row whose key column equals key, if the row's stored
// fence is NULL or ≤ fence; the stored fence becomes fence. accepted is
// false when the write was refused, because a newer lease has written
// the row or because no row has that key (use Upsert to create it). One
// statement; pass a pgx.Tx as db to make it part of a transaction.
//
// Errors: bad input is InvalidArgument before any I/O (a nil or zero
// guard, a nil or nil-pointer DB, a nil key, a fence out of range, a guard
// made WithGrantColumn); a connection failure after the statement may have
// reached the server is Ambiguous (the write may have been applied);
// server errors go through the usual SQLSTATE mapping (a value of the
// wrong type, for instance).
func (g *FenceGuard) Update(ctx context.Context, db DB, key any, fence pglease.Fence, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.Update"
	return g.update(ctx, op, db, key, fence, nil, sets)
}

// UpdateGrant is Update for a guard made WithGrantColumn: grant is the
// writer's GrantID. The row is written when its stored fence is NULL or
// lower than fence, or equal to it and written by the same grant (a
// retry) or by no recorded grant; the stored fence and grant become the
// writer's. accepted is false, as with Update, when a newer lease has
// written the row or no row has key. An equal fence written by another
// grant is an error (CodeFenceRegression, cause ErrFenceRepeated) and
// changes nothing. A refused write costs a second statement, which reads
// the row to tell these apart.
func (g *FenceGuard) UpdateGrant(ctx context.Context, db DB, key any, fence pglease.Fence, grant string, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.UpdateGrant"
	return g.update(ctx, op, db, key, fence, &grant, sets)
}

// accepts returns the SQL condition under which a row t may take a write
// with fence $2 (and grant $3) given as the expression f (and gr).
func (g *FenceGuard) accepts(f, gr string) string {
	if g.grantCol == "" {
		return "t." + g.fenceCol + " IS NULL OR t." + g.fenceCol + " <= " + f
	}
	return "t." + g.fenceCol + " IS NULL OR t." + g.fenceCol + " < " + f +
		" OR (t." + g.fenceCol + " = " + f + " AND (t." + g.grantCol + " IS NULL OR t." + g.grantCol + " = " + gr + "))"
}

func (g *FenceGuard) update(ctx context.Context, op string, db DB, key any, fence pglease.Fence, grant *string, sets []Set) (bool, error) {
	cols, vals, err := g.check(op, ctx, db, key, fence, grant, sets)
	if err != nil {
		return false, err
	}
	args := []any{key, int64(fence)}
	first := 3 // first parameter of the set columns
	if grant != nil {
		args = append(args, *grant)
		first = 4
	}
	var b strings.Builder
	b.WriteString("UPDATE " + g.table + " AS t SET ")
	for i, c := range cols {
		b.WriteString(c + " = $" + strconv.Itoa(i+first) + ", ")
	}
	if grant != nil {
		b.WriteString(g.grantCol + " = $3::text, ")
	}
	b.WriteString(g.fenceCol + " = $2::bigint WHERE t." + g.keyCol + " = $1 AND (" +
		g.accepts("$2::bigint", "$3::text") + ") RETURNING true")
	return g.exec(ctx, op, db, b.String(), append(args, vals...), grant != nil)
}

// Upsert is Update that creates the row when no row has key yet
// (INSERT … ON CONFLICT (key column) DO UPDATE … WHERE stored fence is
// NULL or ≤ fence). It needs a unique constraint or index on the key
// column alone. accepted is false only when a newer lease has written
// the row. Columns not in sets get their defaults on insert and keep
// their values on update.
func (g *FenceGuard) Upsert(ctx context.Context, db DB, key any, fence pglease.Fence, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.Upsert"
	return g.upsert(ctx, op, db, key, fence, nil, sets)
}

// UpsertGrant is Upsert for a guard made WithGrantColumn, with
// UpdateGrant's rule for an existing row: an equal fence is accepted only
// from the grant that wrote it (or when no grant was recorded), and from
// another grant is an error (CodeFenceRegression, cause ErrFenceRepeated).
func (g *FenceGuard) UpsertGrant(ctx context.Context, db DB, key any, fence pglease.Fence, grant string, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.UpsertGrant"
	return g.upsert(ctx, op, db, key, fence, &grant, sets)
}

func (g *FenceGuard) upsert(ctx context.Context, op string, db DB, key any, fence pglease.Fence, grant *string, sets []Set) (bool, error) {
	cols, vals, err := g.check(op, ctx, db, key, fence, grant, sets)
	if err != nil {
		return false, err
	}
	args := []any{key, int64(fence)}
	first := 3
	if grant != nil {
		args = append(args, *grant)
		first = 4
		cols = append([]string{g.grantCol}, cols...)
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + g.table + " AS t (" + g.keyCol + ", " + g.fenceCol)
	for _, c := range cols {
		b.WriteString(", " + c)
	}
	b.WriteString(") VALUES ($1, $2::bigint")
	if grant != nil {
		b.WriteString(", $3::text")
	}
	for i := range vals {
		b.WriteString(", $" + strconv.Itoa(i+first))
	}
	b.WriteString(") ON CONFLICT (" + g.keyCol + ") DO UPDATE SET " + g.fenceCol + " = EXCLUDED." + g.fenceCol)
	for _, c := range cols {
		b.WriteString(", " + c + " = EXCLUDED." + c)
	}
	b.WriteString(" WHERE " + g.accepts("EXCLUDED."+g.fenceCol, "EXCLUDED."+g.grantCol) + " RETURNING true")
	return g.exec(ctx, op, db, b.String(), append(args, vals...), grant != nil)
}

// exec runs one fenced write; a returned row means accepted. Like
// Store.run, a pool connection is taken first so that failing to get one
// is known not to have sent anything. With classify (grant writes), a
// refused write is followed, on the same connection, by a read of the
// row that tells a repeated fence (error) from an older one (false);
// under READ COMMITTED that read sees the row as it is after the write's
// own wait, so a repeat that won a race is still reported.
func (g *FenceGuard) exec(ctx context.Context, op string, db DB, sql string, args []any, classify bool) (bool, error) {
	if pool, ok := db.(*pgxpool.Pool); ok {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return false, pgerr.Map(ctx, op, err)
		}
		defer conn.Release()
		db = conn
	}
	accepted := false
	err := func() error {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			accepted = true
		}
		return rows.Err()
	}()
	if err == nil {
		if accepted || !classify {
			return accepted, nil
		}
		var repeated bool
		err := db.QueryRow(ctx, "SELECT COALESCE(bool_or(t."+g.fenceCol+" = $2::bigint AND t."+g.grantCol+" IS NOT NULL AND t."+
			g.grantCol+" <> $3::text), false) FROM "+g.table+" AS t WHERE t."+g.keyCol+" = $1", args[0], args[1], args[2]).Scan(&repeated)
		if err != nil {
			return false, pgerr.Map(ctx, op, err)
		}
		if repeated {
			return false, pgerr.New(pglease.CodeFenceRegression, op, "refused", ErrFenceRepeated)
		}
		return false, nil
	}
	mapped := pgerr.Map(ctx, op, err)
	if sent(err) && pglease.CodeOf(mapped) != pglease.CodeInvalidArgument {
		return false, pgerr.New(pglease.CodeAmbiguous, op, "outcome unknown: the write may have been applied", mapped)
	}
	return false, mapped
}
