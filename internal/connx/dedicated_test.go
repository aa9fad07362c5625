package connx_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/connx"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestDedicatedSettingsApplied: the one statement SQL builds applies
// every liveness setting the server knows (and the caller's own) to the
// session, with the values DefaultLiveness states, in the simple
// protocol (it may be followed by another statement in the same round
// trip, as the listener's LISTEN is), and a direct connection is not
// taken for a transaction-mode pooler.
func TestDedicatedSettingsApplied(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := connx.Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	settings := connx.DefaultLiveness.Settings(connx.Setting{Name: "lock_timeout", Value: "1234"})
	if _, err := conn.Exec(ctx, connx.SQL(settings)+";\nLISTEN dedicated_test"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "4",
		"tcp_user_timeout": "25000", "idle_session_timeout": "25000", "client_connection_check_interval": "5000",
		"idle_in_transaction_session_timeout": "0", "statement_timeout": "0", "lock_timeout": "1234",
	}
	if len(settings) != len(want) {
		t.Fatalf("%d settings, want %d", len(settings), len(want))
	}
	rows, err := conn.Query(ctx, "SELECT name, setting FROM pg_settings WHERE name = ANY($1)", names(settings))
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var kv [2]string
		return kv, r.Scan(&kv[0], &kv[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 7 { // servers before 14 lack two of them
		t.Fatalf("only %d of the settings known to the server", len(got))
	}
	for _, kv := range got {
		if want[kv[0]] != kv[1] {
			t.Errorf("%s = %s, want %s", kv[0], kv[1], want[kv[0]])
		}
	}
	var listening bool
	if err := conn.QueryRow(ctx, "SELECT 'dedicated_test' = ANY(ARRAY(SELECT pg_listening_channels()))").Scan(&listening); err != nil || !listening {
		t.Fatalf("LISTEN after the settings: listening %v, %v", listening, err)
	}
	pid, err := connx.BackendPID(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if pooled, err := connx.TransactionPooled(ctx, cfg, conn, pid); err != nil || pooled {
		t.Fatalf("a direct connection: TransactionPooled = %v, %v", pooled, err)
	}
}

func names(s []connx.Setting) []string {
	out := make([]string, len(s))
	for i, kv := range s {
		out[i] = kv.Name
	}
	return out
}

// TestSettingsSQLQuotes: values are SQL literals (a quote is doubled).
func TestSettingsSQLQuotes(t *testing.T) {
	sql := connx.SQL([]connx.Setting{{"application_name", "it's"}})
	if !strings.Contains(sql, "('application_name', 'it''s')") {
		t.Fatalf("not quoted: %s", sql)
	}
}

// TestDefaultLivenessBound: the keepalives alone would take 30 s;
// tcp_user_timeout caps the bound at 25 s.
func TestDefaultLivenessBound(t *testing.T) {
	if got := connx.DefaultLiveness.Bound(); got != 25*time.Second {
		t.Fatalf("Bound = %v, want 25s", got)
	}
}
