package keys_test

import (
	"errors"
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
)

func TestParseFence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f    pglease.Fence
		want string
	}{
		{0, "000000000000000"},
		{1, "000000000000001"},
		{keys.FenceWarn, "090000000000000"},
		{keys.FenceMax, "900000000000000"},
		{999999999999999, "999999999999999"},
	} {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("Fence(%d).String() = %q, want %q", int64(tc.f), got, tc.want)
		}
		back, err := keys.ParseFence(tc.want)
		if err != nil || back != tc.f {
			t.Errorf("ParseFence(%q) = %d, %v", tc.want, back, err)
		}
	}
	for _, s := range []string{"", "1", "00000000000001", "0000000000000001", "00000000000000a", "-00000000000001", " 00000000000001"} {
		if _, err := keys.ParseFence(s); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("ParseFence(%q) err = %v, want InvalidArgument", s, err)
		}
	}
}
