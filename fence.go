package pglease

import (
	"strconv"
)

// Fence is a fencing token: per key, every successful acquire returns a
// fence strictly greater than every fence handed out before it (across
// expiry, release, takeover and server restarts, given synchronous
// commit). Give it to the resource you protect and have it refuse writes
// carrying a fence lower than the highest it has seen.
//
// On the wire and in SyncGuard's tables a fence is a 15-digit zero-padded
// decimal string ("000000000000001"), which String returns; such strings
// compare correctly as text.
type Fence int64

// String returns the fence as 15 zero-padded decimal digits, the format
// SyncGuard stores (formatFence).
func (f Fence) String() string {
	s := strconv.FormatInt(int64(f), 10)
	if f < 0 || len(s) >= 15 {
		return s
	}
	const zeros = "000000000000000"
	return zeros[:15-len(s)] + s
}
