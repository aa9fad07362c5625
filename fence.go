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

// Fence thresholds (SyncGuard's FENCE_THRESHOLDS).
const (
	// FenceMax is the largest fence ever granted: an acquire that would
	// produce a higher one fails with Internal and grants nothing.
	FenceMax Fence = 900000000000000
	// FenceWarn is the level above which a grant is reported as
	// approaching FenceMax.
	FenceWarn Fence = 90000000000000
)

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

// ParseFence parses a fence in SyncGuard's format: exactly 15 decimal
// digits. Anything else is InvalidArgument (the text is not echoed).
func ParseFence(s string) (Fence, error) {
	if len(s) != 15 {
		return 0, NewError(CodeInvalidArgument, "pglease.ParseFence", "fence must be 15 decimal digits", nil)
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, NewError(CodeInvalidArgument, "pglease.ParseFence", "fence must be 15 decimal digits", nil)
		}
		n = n*10 + int64(c-'0')
	}
	return Fence(n), nil
}
