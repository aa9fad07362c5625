package pglease_test

import (
	"testing"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestMain gives the Examples (ExampleHandle) a database of their own.
func TestMain(m *testing.M) { pgtest.Main(m) }
