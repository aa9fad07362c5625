package heartbeat_test

import (
	"testing"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestMain gives the examples a database of their own (DATABASE_URL, or a
// throwaway server).
func TestMain(m *testing.M) { pgtest.Main(m) }
