package manager

import (
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// TestConnectionsNamedByHolder: a Manager's connections carry its holder
// identity as application_name (the pool of Open, and the listening
// session that holds the waiter and watch locks `pglease status` lists),
// so an operator sees which process is behind each backend; an
// application_name the connection string sets is kept.
func TestConnectionsNamedByHolder(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	ctx := ctxT(t)
	names := func(m *Manager) map[string]int {
		t.Helper()
		if err := m.SetupSchema(ctx); err != nil { // a pool connection
			t.Fatal(err)
		}
		rows, err := m.k.Pool.Query(ctx, "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out[s]++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	const id = "appname-test[4242]@host-x"
	m, err := Open(ctx, url, Config{Config: pg.Config{Holder: id}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	// The listening session connects when the Manager starts.
	deadline := time.Now().Add(10 * time.Second)
	for names(m)[id] < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := names(m); got[id] < 2 {
		t.Errorf("sessions named %q: %d, want the pool's and the listener's (≥ 2); all: %v", id, got[id], got)
	}
	m2, err := Open(ctx, url+sep+"application_name=mine-appname-test", Config{Config: pg.Config{Holder: id + "-2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close(ctx)
	for names(m2)["mine-appname-test"] < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := names(m2); got[id+"-2"] != 0 || got["mine-appname-test"] < 2 {
		t.Errorf("the connection string's application_name was overridden: %v", got)
	}
}
