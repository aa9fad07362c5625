package obs

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"log/slog"
	"sync"

	"golang.org/x/text/unicode/norm"

	"github.com/pglease/pglease"
)

// KeyID is how telemetry identifies a lock key: a hash of the key, and the
// raw key only when the Recorder was built with Config.RawKeys.
//
// Build it once per request with Recorder.Key, outside the Manager loop (in
// the caller's goroutine), and pass it to StartAcquire. The zero KeyID is
// valid and identifies nothing (a nil Recorder returns it).
//
// KeyID's String, GoString and LogValue never print the raw key, even when
// it is kept for Config.RawKeys: the raw key reaches telemetry only as the
// separate attribute pglease.key.
type KeyID struct {
	hash string // HMAC (32 hex) or SyncGuard hashKey (24 hex)
	raw  string // only with Config.RawKeys
}

// Hash returns the key's hash: 32 lowercase hex digits (HMAC-SHA-256 keyed
// with the Config.KeySecret secret, truncated to 128 bits) or, without a
// secret, 24 lowercase hex digits (SyncGuard's hashKey, not secret).
func (k KeyID) Hash() string { return k.hash }

// String returns the hash.
func (k KeyID) String() string { return k.hash }

// LogValue makes slog print the hash only.
func (k KeyID) LogValue() slog.Value { return slog.StringValue(k.hash) }

// GoString returns the hash in Go syntax, so %#v cannot reveal the raw key.
func (k KeyID) GoString() string { return `obs.KeyID("` + k.hash + `")` }

// hmacSize is the number of HMAC-SHA-256 bytes kept: 16 bytes, 128 bits,
// printed as 32 hex digits.
const hmacSize = 16

// keyHasher turns keys into hashes. With a secret it is HMAC-SHA-256; the
// hmac states are pooled because hmac.New allocates.
type keyHasher struct {
	secret []byte
	pool   sync.Pool // of hash.Hash, only with a secret
}

func newKeyHasher(secret []byte) *keyHasher {
	h := &keyHasher{}
	if len(secret) > 0 {
		h.secret = append([]byte(nil), secret...)
		h.pool.New = func() any { return hmac.New(sha256.New, h.secret) }
	}
	return h
}

// hash returns the key's hash. Without a secret it is pglease.HashKey,
// SyncGuard's hashKey (NFC, then three 32-bit polynomial hashes over the
// UTF-16 code units, 24 hex digits): NOT a cryptographic hash. Anyone can
// compute it, and a low-entropy key (an order number, an e-mail address)
// can be recovered from it by trying candidates. It identifies keys; it
// does not hide them. Config.KeySecret hides them.
func (h *keyHasher) hash(key string) string {
	if h.secret == nil {
		return pglease.HashKey(key)
	}
	key = norm.NFC.String(key)
	m := h.pool.Get().(hash.Hash)
	m.Reset()
	m.Write([]byte(key))
	var sum [sha256.Size]byte
	out := m.Sum(sum[:0])
	h.pool.Put(m)
	return hex.EncodeToString(out[:hmacSize])
}
