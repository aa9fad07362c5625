package connx

import (
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// warned holds the connections whose server sent a WARNING since the last
// TakeWarning (NoteWarnings installs the OnNotice that records them).
var warned sync.Map // *pgconn.PgConn → struct{}

// NoteWarnings makes cfg's connections record the server's WARNING
// notices for TakeWarning, keeping an OnNotice already set (it runs
// first). pgx drops notices otherwise, and one of them is the only sign
// of a commit that did not get the durability it asked for: a wait for a
// synchronous standby that was cancelled ("canceling wait for synchronous
// replication …") commits locally only, and the statement succeeds.
func NoteWarnings(cfg *pgconn.Config) {
	prev := cfg.OnNotice
	cfg.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if prev != nil {
			prev(c, n)
		}
		if n.SeverityUnlocalized == "WARNING" || (n.SeverityUnlocalized == "" && n.Severity == "WARNING") {
			warned.Store(c, struct{}{})
		}
	}
}

// TakeWarning reports whether conn's server sent a WARNING (recorded by
// NoteWarnings) since the last call, and forgets it.
func TakeWarning(conn *pgconn.PgConn) bool {
	_, ok := warned.LoadAndDelete(conn)
	return ok
}
