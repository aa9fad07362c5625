package connx

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestHostsAndTimeout(t *testing.T) {
	for _, tc := range []struct {
		url       string
		hosts     int
		unbounded bool
		bounded   time.Duration
	}{
		{"postgres://u@a:5432/db?sslmode=disable", 1, false, 2 * time.Second},
		{"postgres://u@a:5432/db?sslmode=prefer", 1, false, 2 * time.Second}, // TLS fallback: same host
		{"postgres://u@a:5432,b:5433/db?sslmode=disable&target_session_attrs=read-write", 2, true, 2 * time.Second},
		{"postgres://u@a:5432,b:5433/db?sslmode=disable&connect_timeout=5", 2, false, 5 * time.Second},
		{"host=a,b,c port=1,2,3 user=u sslmode=disable", 3, true, 2 * time.Second},
	} {
		cfg, err := pgx.ParseConfig(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := Hosts(&cfg.Config); got != tc.hosts {
			t.Errorf("%s: Hosts = %d, want %d", tc.url, got, tc.hosts)
		}
		if got := UnboundedMultiHost(&cfg.Config); got != tc.unbounded {
			t.Errorf("%s: UnboundedMultiHost = %v, want %v", tc.url, got, tc.unbounded)
		}
		b := Bounded(cfg, DefaultConnectTimeout)
		if b.ConnectTimeout != tc.bounded {
			t.Errorf("%s: Bounded ConnectTimeout = %v, want %v", tc.url, b.ConnectTimeout, tc.bounded)
		}
		if b == cfg {
			t.Errorf("%s: Bounded did not copy", tc.url)
		}
	}
}
