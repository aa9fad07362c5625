package telemetry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/pglease/pglease/internal/obs"
)

// Vectors from SyncGuard's hashKey (common/crypto.ts), verified against
// the TypeScript implementation (reference/syncguard-facts.md §2.4).
func TestHashKeyVectors(t *testing.T) {
	t.Parallel()
	r := obs.New(Config{}, obs.Database{})
	for _, tc := range []struct{ in, want string }{
		{"", "000000000000000000000000"},
		{"k1", "00000d2600009fd20017666a"},
		{"resource:123", "e90a28c676a29a3291e2874a"},
		{"café", "002e7a21248b3503a22cdb87"},       // NFC input
		{"cafe\u0301", "002e7a21248b3503a22cdb87"}, // NFD input: normalised first
		{"😀", "001b0d6301446cc92f4d8055"},          // astral: two UTF-16 units
		{strings.Repeat("x", 512), "53ef0000dab400001a400000"},
		{"fence:k1", "03e43d0f8f19c0ad94f99ce9"},
	} {
		if got := r.Key(tc.in).Hash(); got != tc.want {
			t.Errorf("Key(%q).Hash() = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestKeySecretHMAC(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	r := obs.New(Config{KeySecret: secret}, obs.Database{})
	secret[0] = 'X' // obs.New copied it
	mac := hmac.New(sha256.New, []byte("0123456789abcdef0123456789abcdef"))
	mac.Write([]byte("café"))
	want := hex.EncodeToString(mac.Sum(nil))[:32]

	for _, in := range []string{"café", "cafe\u0301"} {
		if got := r.Key(in).Hash(); got != want {
			t.Errorf("Key(%q) = %s, want HMAC %s", in, got, want)
		}
	}
	other := obs.New(Config{KeySecret: []byte("another secret, same length!!!!!")}, obs.Database{})
	if a, b := r.Key("payment:1").Hash(), other.Key("payment:1").Hash(); a == b {
		t.Errorf("different secrets gave the same hash %s", a)
	}
	if a, b := r.Key("payment:1").Hash(), r.Key("payment:2").Hash(); a == b {
		t.Errorf("different keys gave the same hash %s", a)
	}
	if got := obs.New(Config{}, obs.Database{}).Key("k1").Hash(); got != "00000d2600009fd20017666a" {
		t.Errorf("empty secret: got %s, want the unkeyed hashKey", got)
	}
}

func TestKeyIDNeverPrintsRawKey(t *testing.T) {
	t.Parallel()
	const raw = "alice@example.com"
	k := obs.New(Config{RawKeys: true}, obs.Database{}).Key(raw)
	if k.Raw() != raw {
		t.Fatalf("RawKeys did not keep the raw key")
	}
	for _, s := range []string{
		fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s %q", k, k, k, k, k), k.String(), k.LogValue().String(),
	} {
		if strings.Contains(s, raw) {
			t.Errorf("formatted obs.KeyID %q contains the raw key", s)
		}
		if !strings.Contains(s, k.Hash()) {
			t.Errorf("formatted obs.KeyID %q lacks the hash", s)
		}
	}
}
