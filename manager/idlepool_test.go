package manager

import (
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestOpenIdlePool: a Manager's own pool closes connections idle for
// 30 s (looked for every 10 s), so that an idle process keeps its
// listening connection and the pool connection its heartbeat reuses, not
// the pool's full size for pgxpool's 30 minutes; a connection string
// that sets either setting keeps it.
func TestOpenIdlePool(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, tc := range []struct {
		params        string
		idle, healthy time.Duration
	}{
		{"", ownIdleTime, ownHealthCheck},
		{sep + "pool_max_conn_idle_time=5m&pool_health_check_period=2m", 5 * time.Minute, 2 * time.Minute},
	} {
		m, err := Open(ctxT(t), url+tc.params, Config{})
		if err != nil {
			t.Fatal(err)
		}
		c := m.k.Pool.Config()
		if c.MaxConnIdleTime != tc.idle || c.HealthCheckPeriod != tc.healthy {
			t.Errorf("Open(%q): MaxConnIdleTime %v, HealthCheckPeriod %v; want %v, %v", tc.params, c.MaxConnIdleTime, c.HealthCheckPeriod, tc.idle, tc.healthy)
		}
		if err := m.Close(ctxT(t)); err != nil {
			t.Error(err)
		}
	}
}
