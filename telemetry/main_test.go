package telemetry_test

import (
	"testing"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestMain gives the Example a database of its own.
func TestMain(m *testing.M) { pgtest.Main(m) }
