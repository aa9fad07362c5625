package pglease

import (
	"encoding/hex"
	"unicode/utf16"

	"golang.org/x/text/unicode/norm"
)

// HashKey is SyncGuard's hashKey (common/crypto.ts): a non-cryptographic
// triple 32-bit polynomial hash over the UTF-16 code units of NFC(s),
// returned as 24 lowercase hex digits. pglease identifies keys by it
// wherever it must not show them: it is what LockInfo.KeyHash and
// LockInfo.LockIDHash hold, what `pglease status` prints, and the
// pglease.key.hash of spans and log records when telemetry has no
// KeySecret. Compute it from your own keys to find theirs there. It is NOT SHA-256 (SyncGuard's type comments
// say so wrongly) and it is easy to invert for short inputs: it hides a
// value from casual view, not from an attacker.
func HashKey(s string) string {
	var h1, h2, h3 uint32
	for _, c := range utf16.Encode([]rune(norm.NFC.String(s))) {
		u := uint32(c)
		h1 = 31*h1 + u
		h2 = 127*h2 + 3*u
		h3 = 2047*h3 + 7*u
	}
	var b [12]byte
	for i, h := range [3]uint32{h1, h2, h3} {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(h>>24), byte(h>>16), byte(h>>8), byte(h)
	}
	return hex.EncodeToString(b[:])
}
