package retry_test

import (
	"time"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/retry"
)

// A fixed delay: a Multiplier of 1 keeps every attempt Base after the
// last one, and NoJitter makes it exact.
func ExamplePolicy_fixed() {
	cfg := manager.Config{Retry: retry.Policy{Base: 250 * time.Millisecond, Multiplier: 1, Jitter: retry.NoJitter}}
	_ = cfg // manager.New(pool, cfg)
}
