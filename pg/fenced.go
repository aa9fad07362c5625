package pg

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// maxFencedColumns caps the columns one fenced write may set.
const maxFencedColumns = 100

// FenceGuard writes rows of one table only for the holder of the newest
// lease, so that a holder that lost its lease cannot overwrite the work
// of the next one: each guarded row stores the fence of the last accepted write in
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
// stores which grant wrote the fence, as its GrantID (a SHA-256 digest of
// the grant's lockId, never the lockId itself), and accepts an equal
// fence only from the grant that wrote it: a repeat from another grant is
// an error matching both pglease.ErrFenceRegression and ErrFenceRepeated,
// and changes nothing. Each write to such a guard sets the grant column
// like any other column, to the writer's GrantID:
//
//	guard.Update(ctx, tx, key, fence, pg.Set{Column: "grant_id", Value: pg.GrantID(res.LockID)}, …)
//
// (with a Manager: lock.GrantID()). Rows written before the column existed
// (grant NULL) accept an equal fence once, from any grant, as before, and
// record it.
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

// ErrFenceRepeated is the cause of the error a guard made WithGrantColumn
// returns when the row's fence equals the writer's but was written by
// another grant: the lock service handed out the same fence twice (it
// lost acknowledged grants), which operators must hear of, so that it can
// be told from an ordinary late write (errors.Is). The returned
// *pglease.Error has Code CodeFenceRegression.
var ErrFenceRepeated = errors.New("fence repeated: another grant already wrote this fence " +
	"(the lock database lost acknowledged grants: failover to an asynchronous replica or a restore?)")

// grantIDLen is the length of a GrantID: 64 lowercase hex digits.
const grantIDLen = 2 * sha256.Size

// GrantID returns the identity of the lease grant whose lockId is lockID,
// the value a writer sets a FenceGuard's grant column to (see
// FenceGuard): 64 lowercase hex digits, the SHA-256 of a fixed prefix and
// the lockId. The lockId is a bearer secret (it extends and releases the
// lease); its GrantID grants nothing and cannot be turned back into it (a
// lockId holds 128 random bits), so it may be stored in resource tables
// and shown in logs. It returns "" when lockID is not a lockId; the guard
// refuses "" with InvalidArgument. manager.Lock.GrantID returns the same
// value for a held lock.
func GrantID(lockID string) string {
	if keys.ValidateLockID(lockID) != nil {
		return ""
	}
	sum := sha256.Sum256([]byte("pglease grant v1\x00" + lockID))
	return hex.EncodeToString(sum[:])
}

func validGrantID(g string) bool {
	if len(g) != grantIDLen {
		return false
	}
	for i := 0; i < len(g); i++ {
		if c := g[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Set is one column assignment of a fenced write, so that the columns a
// write sets are named in the call: Column (an identifier, validated and
// quoted) gets Value (bound as a parameter).
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
	schema, ident, err := store.ParseTable(op, "table", table)
	if err != nil {
		return nil, err
	}
	if !store.ValidIdent(keyColumn) {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "key column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	if !store.ValidIdent(fenceColumn) {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "fence column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	if keyColumn == fenceColumn {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "key and fence columns must differ", nil)
	}
	return &FenceGuard{
		table:    store.Quote(schema, ident),
		keyCol:   pgx.Identifier{keyColumn}.Sanitize(),
		fenceCol: pgx.Identifier{fenceColumn}.Sanitize(),
		keyName:  keyColumn,
		fenceNm:  fenceColumn,
	}, nil
}

// WithGrantColumn returns a copy of g that also keeps, in column (TEXT,
// NULL allowed; add it with ALTER TABLE … ADD COLUMN column text), the
// GrantID of the grant that wrote each row's fence, so that a repeated
// fence is told from a retry of the same grant (see FenceGuard). Every
// write through it must set column to the writer's GrantID (a Set like
// the others); one that does not is InvalidArgument before any I/O (it
// would erase the grant). Bad names are InvalidArgument; no I/O.
func (g *FenceGuard) WithGrantColumn(column string) (*FenceGuard, error) {
	const op = "pg.FenceGuard.WithGrantColumn"
	switch {
	case g == nil || g.table == "":
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "nil or zero FenceGuard (use NewFenceGuard)", nil)
	case !store.ValidIdent(column):
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "grant column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	case column == g.keyName || column == g.fenceNm:
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "the grant column must differ from the key and fence columns", nil)
	}
	c := *g
	c.grantCol, c.grantNm = pgx.Identifier{column}.Sanitize(), column
	return &c, nil
}

// check validates a write before any I/O and returns the quoted set
// columns and their values, and, for a guard with a grant column, the
// writer's GrantID (the value of the Set of that column, left out of the
// columns: the statements set it themselves).
func (g *FenceGuard) check(op string, ctx context.Context, db DB, key any, fence pglease.Fence, sets []Set) ([]string, []any, *string, error) {
	bad := func(msg string) ([]string, []any, *string, error) {
		return nil, nil, nil, pgerr.New(pglease.CodeInvalidArgument, op, msg, nil)
	}
	if g == nil || g.table == "" {
		return bad("nil or zero FenceGuard (use NewFenceGuard)")
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, nil, nil, err
	}
	limit := maxFencedColumns
	if g.grantCol != "" {
		limit++ // the grant column's Set
	}
	switch {
	case store.IsNilDB(db):
		return bad("nil DB")
	case key == nil:
		return bad("nil key")
	case fence <= 0 || fence > keys.FenceMax:
		return bad("fence must be between 1 and 900000000000000")
	case len(sets) > limit:
		return bad("too many columns")
	}
	cols := make([]string, 0, len(sets))
	vals := make([]any, 0, len(sets))
	seen := make(map[string]bool, len(sets))
	var grant *string
	for _, s := range sets {
		switch {
		case !store.ValidIdent(s.Column):
			return bad("column names must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$")
		case s.Column == g.keyName || s.Column == g.fenceNm:
			return bad("the key and fence columns cannot be set")
		case seen[s.Column]:
			return bad("duplicate column")
		}
		seen[s.Column] = true
		if g.grantNm != "" && s.Column == g.grantNm {
			v, ok := s.Value.(string)
			if !ok || !validGrantID(v) {
				return bad("the grant column must be set to a GrantID (64 hex digits; pg.GrantID(lockID) or manager.Lock.GrantID), never the lockId itself")
			}
			grant = &v
			continue
		}
		cols = append(cols, pgx.Identifier{s.Column}.Sanitize())
		vals = append(vals, s.Value)
	}
	if g.grantCol != "" && grant == nil {
		return bad("this guard keeps grants (WithGrantColumn): set its grant column " + g.grantNm + " to the writer's GrantID")
	}
	return cols, vals, grant, nil
}

// Update sets the given columns (possibly none: then only the fence is
// stored) of the row whose key column equals key, if the row's stored
// fence is NULL or ≤ fence; the stored fence becomes fence. accepted is
// false when the write was refused, because a newer lease has written
// the row or because no row has that key (use Upsert to create it). One
// statement; pass a pgx.Tx as db to make it part of a transaction.
//
// On a guard made WithGrantColumn, sets must set the grant column to the
// writer's GrantID, and the row is written when its stored fence is NULL
// or lower than fence, or equal to it and written by the same grant (a
// retry) or by no recorded grant; the stored fence and grant become the
// writer's. An equal fence written by another grant is an error
// (CodeFenceRegression, cause ErrFenceRepeated) and changes nothing. A
// refused write then costs a second statement, which reads the row to
// tell these apart.
//
// Errors: bad input is InvalidArgument before any I/O (a nil or zero
// guard, a nil or nil-pointer DB, a nil key, a fence out of range, a
// missing or malformed GrantID on a guard made WithGrantColumn); a
// connection failure after the statement may have reached the server is
// Ambiguous (the write may have been applied); server errors go through
// the usual SQLSTATE mapping (a value of the wrong type, for instance).
func (g *FenceGuard) Update(ctx context.Context, db DB, key any, fence pglease.Fence, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.Update"
	cols, vals, grant, err := g.check(op, ctx, db, key, fence, sets)
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

// accepts returns the SQL condition under which a row t may take a write
// with fence $2 (and grant $3) given as the expression f (and gr).
func (g *FenceGuard) accepts(f, gr string) string {
	if g.grantCol == "" {
		return "t." + g.fenceCol + " IS NULL OR t." + g.fenceCol + " <= " + f
	}
	return "t." + g.fenceCol + " IS NULL OR t." + g.fenceCol + " < " + f +
		" OR (t." + g.fenceCol + " = " + f + " AND (t." + g.grantCol + " IS NULL OR t." + g.grantCol + " = " + gr + "))"
}

// Upsert is Update that creates the row when no row has key yet
// (INSERT … ON CONFLICT (key column) DO UPDATE … WHERE stored fence is
// NULL or ≤ fence, or Update's grant rule on a guard made
// WithGrantColumn). It needs a unique constraint or index on the key
// column alone. accepted is false only when a newer lease has written
// the row. Columns not in sets get their defaults on insert and keep
// their values on update.
func (g *FenceGuard) Upsert(ctx context.Context, db DB, key any, fence pglease.Fence, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.Upsert"
	cols, vals, grant, err := g.check(op, ctx, db, key, fence, sets)
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

// exec runs one fenced write; a returned row means accepted. Like the
// Store's statements, a pool connection is taken first so that failing to get one
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
		rows, err := db.Query(ctx, "SELECT COALESCE(bool_or(t."+g.fenceCol+" = $2::bigint AND t."+g.grantCol+" IS NOT NULL AND t."+
			g.grantCol+" <> $3::text), false) FROM "+g.table+" AS t WHERE t."+g.keyCol+" = $1", args[0], args[1], args[2])
		if err == nil {
			repeated, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
		}
		if err != nil {
			return false, pgerr.Map(ctx, op, err)
		}
		if repeated {
			return false, pgerr.New(pglease.CodeFenceRegression, op, "refused", ErrFenceRepeated)
		}
		return false, nil
	}
	mapped := pgerr.Map(ctx, op, err)
	if store.Sent(err) && pglease.CodeOf(mapped) != pglease.CodeInvalidArgument {
		return false, pgerr.New(pglease.CodeAmbiguous, op, "outcome unknown: the write may have been applied", mapped)
	}
	return false, mapped
}
