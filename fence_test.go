package pglease_test

import (
	"testing"

	"github.com/pglease/pglease"
)

func TestFenceString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f    pglease.Fence
		want string
	}{
		{0, "000000000000000"},
		{1, "000000000000001"},
		{90000000000000, "090000000000000"},
		{900000000000000, "900000000000000"},
		{999999999999999, "999999999999999"},
	} {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("Fence(%d).String() = %q, want %q", int64(tc.f), got, tc.want)
		}
	}
	// Padded strings compare like the numbers.
	if !(pglease.Fence(9).String() < pglease.Fence(10).String()) {
		t.Error("padded fences do not compare as text")
	}
}
