package keys

import (
	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Fence thresholds (SyncGuard's FENCE_THRESHOLDS).
const (
	// FenceMax is the largest fence ever granted: an acquire that would
	// produce a higher one fails with Internal and grants nothing.
	FenceMax pglease.Fence = 900000000000000
	// FenceWarn is the level above which a grant is reported as
	// approaching FenceMax.
	FenceWarn pglease.Fence = 90000000000000
)

// ParseFence parses a fence in SyncGuard's format: exactly 15 decimal
// digits. Anything else is InvalidArgument (the text is not echoed).
func ParseFence(s string) (pglease.Fence, error) {
	if len(s) != 15 {
		return 0, pgerr.New(pglease.CodeInvalidArgument, "pglease.ParseFence", "fence must be 15 decimal digits", nil)
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, pgerr.New(pglease.CodeInvalidArgument, "pglease.ParseFence", "fence must be 15 decimal digits", nil)
		}
		n = n*10 + int64(c-'0')
	}
	return pglease.Fence(n), nil
}
