package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgerr"
)

// ReleaseTriggerInstalled reports whether the release trigger (package
// pg/migrate's SetupReleaseTrigger) is installed and enabled on the
// Store's lock table for channel. Without it, releases made by SyncGuard
// processes (which delete the row themselves) notify nobody, and pglease
// waiters learn of them only by polling. A missing lock table answers
// false. Read-only: one query on pg_trigger. The channel must match
// Config.NotifyChannel's rule; a bad one is InvalidArgument before any
// I/O.
func (s *Store) ReleaseTriggerInstalled(ctx context.Context, channel string) (bool, error) {
	const op = "pg.ReleaseTriggerInstalled"
	if err := CheckChannel(op, channel); err != nil {
		return false, err
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return false, err
	}
	var ok bool
	err := s.run(ctx, op, false, releaseTriggerInstalledSQL, []any{s.n.Lock, ReleaseTriggerName, channel}, func(r pgx.Rows) error {
		return r.Scan(&ok)
	})
	return ok, err
}

// releaseTriggerInstalledSQL: $1 the lock table (quoted, maybe qualified),
// $2 the trigger's name, $3 the channel. tgtype 9 = ROW | DELETE (AFTER);
// tgenabled 'D' is disabled; tgargs = the channel, NUL-terminated.
const releaseTriggerInstalledSQL = `SELECT EXISTS (SELECT 1 FROM pg_trigger t
  WHERE t.tgrelid = to_regclass($1) AND t.tgname = $2 AND t.tgtype = 9 AND t.tgenabled <> 'D'
    AND t.tgargs = convert_to($3, 'UTF8') || '\x00'::bytea)`
