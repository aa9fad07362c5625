package pg

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
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
// Table and column names are validated (identifiers,
// ^[A-Za-z_][A-Za-z0-9_]{0,62}$, the table optionally schema-qualified)
// and quoted; values are always bound as parameters, never spliced into
// the SQL. A FenceGuard is immutable and safe for concurrent use.
type FenceGuard struct {
	table    string // quoted, possibly schema-qualified
	keyCol   string // quoted
	fenceCol string // quoted
	keyName  string // unquoted, for comparisons
	fenceNm  string // unquoted
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
		return nil, pglease.NewError(pglease.CodeInvalidArgument, op, "key column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	if !identRe.MatchString(fenceColumn) {
		return nil, pglease.NewError(pglease.CodeInvalidArgument, op, "fence column must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$", nil)
	}
	if keyColumn == fenceColumn {
		return nil, pglease.NewError(pglease.CodeInvalidArgument, op, "key and fence columns must differ", nil)
	}
	return &FenceGuard{
		table:    quote(schema, ident),
		keyCol:   pgx.Identifier{keyColumn}.Sanitize(),
		fenceCol: pgx.Identifier{fenceColumn}.Sanitize(),
		keyName:  keyColumn,
		fenceNm:  fenceColumn,
	}, nil
}

// check validates a write before any I/O and returns the quoted set
// columns and their values.
func (g *FenceGuard) check(op string, ctx context.Context, db DB, key any, fence pglease.Fence, sets []Set) ([]string, []any, error) {
	if err := pglease.CheckContext(op, ctx); err != nil {
		return nil, nil, err
	}
	bad := func(msg string) ([]string, []any, error) {
		return nil, nil, pglease.NewError(pglease.CodeInvalidArgument, op, msg, nil)
	}
	switch {
	case g == nil || g.table == "":
		return bad("nil or zero FenceGuard (use NewFenceGuard)")
	case db == nil:
		return bad("nil DB")
	case key == nil:
		return bad("nil key")
	case fence <= 0 || fence > pglease.FenceMax:
		return bad("fence must be between 1 and pglease.FenceMax")
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
		case s.Column == g.keyName || s.Column == g.fenceNm:
			return bad("the key and fence columns cannot be set")
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
// Errors: bad input is InvalidArgument before any I/O; a connection
// failure after the statement may have reached the server is Ambiguous
// (the write may have been applied); server errors go through the usual
// SQLSTATE mapping (a value of the wrong type, for instance).
func (g *FenceGuard) Update(ctx context.Context, db DB, key any, fence pglease.Fence, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.Update"
	cols, vals, err := g.check(op, ctx, db, key, fence, sets)
	if err != nil {
		return false, err
	}
	var b strings.Builder
	b.WriteString("UPDATE " + g.table + " AS t SET ")
	for i, c := range cols {
		b.WriteString(c + " = $" + strconv.Itoa(i+3) + ", ")
	}
	b.WriteString(g.fenceCol + " = $2::bigint WHERE t." + g.keyCol + " = $1 AND (t." + g.fenceCol +
		" IS NULL OR t." + g.fenceCol + " <= $2::bigint) RETURNING true")
	return g.exec(ctx, op, db, b.String(), append([]any{key, int64(fence)}, vals...))
}

// Upsert is Update that creates the row when no row has key yet
// (INSERT … ON CONFLICT (key column) DO UPDATE … WHERE stored fence is
// NULL or ≤ fence). It needs a unique constraint or index on the key
// column alone. accepted is false only when a newer lease has written
// the row. Columns not in sets get their defaults on insert and keep
// their values on update.
func (g *FenceGuard) Upsert(ctx context.Context, db DB, key any, fence pglease.Fence, sets ...Set) (accepted bool, err error) {
	const op = "pg.FenceGuard.Upsert"
	cols, vals, err := g.check(op, ctx, db, key, fence, sets)
	if err != nil {
		return false, err
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + g.table + " AS t (" + g.keyCol + ", " + g.fenceCol)
	for _, c := range cols {
		b.WriteString(", " + c)
	}
	b.WriteString(") VALUES ($1, $2::bigint")
	for i := range cols {
		b.WriteString(", $" + strconv.Itoa(i+3))
	}
	b.WriteString(") ON CONFLICT (" + g.keyCol + ") DO UPDATE SET " + g.fenceCol + " = EXCLUDED." + g.fenceCol)
	for _, c := range cols {
		b.WriteString(", " + c + " = EXCLUDED." + c)
	}
	b.WriteString(" WHERE t." + g.fenceCol + " IS NULL OR t." + g.fenceCol + " <= EXCLUDED." + g.fenceCol + " RETURNING true")
	return g.exec(ctx, op, db, b.String(), append([]any{key, int64(fence)}, vals...))
}

// exec runs one fenced write; a returned row means accepted. Like
// Store.run, a pool connection is taken first so that failing to get one
// is known not to have sent anything.
func (g *FenceGuard) exec(ctx context.Context, op string, db DB, sql string, args []any) (bool, error) {
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
		return accepted, nil
	}
	mapped := pgerr.Map(ctx, op, err)
	if sent(err) && pglease.CodeOf(mapped) != pglease.CodeInvalidArgument {
		return false, pglease.NewError(pglease.CodeAmbiguous, op, "outcome unknown: the write may have been applied", mapped)
	}
	return false, mapped
}
