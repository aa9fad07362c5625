package pglease_test

import (
	"strings"
	"testing"

	"github.com/pglease/pglease"
)

// Golden vectors from syncguard-facts.md §2.4, produced by running
// SyncGuard 2.5.2 and reproduced independently.
func TestHashKeyGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"", "000000000000000000000000"},
		{"k1", "00000d2600009fd20017666a"},
		{"resource:123", "e90a28c676a29a3291e2874a"},
		{"café", "002e7a21248b3503a22cdb87"},       // NFC input
		{"cafe\u0301", "002e7a21248b3503a22cdb87"}, // NFD input, same hash
		{"😀", "001b0d6301446cc92f4d8055"},          // astral: two UTF-16 surrogates
		{strings.Repeat("x", 512), "53ef0000dab400001a400000"},
		{"fence:k1", "03e43d0f8f19c0ad94f99ce9"},
	} {
		if got := pglease.HashKey(tc.in); got != tc.want {
			t.Errorf("HashKey(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
