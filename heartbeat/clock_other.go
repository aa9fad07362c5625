//go:build !linux

package heartbeat

import "time"

// bootOffset has no count of suspended time outside Linux: the clock
// falls back on the wall clock's gain over the monotonic clock.
func bootOffset() (time.Duration, bool) { return 0, false }
