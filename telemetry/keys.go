package telemetry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"sync"

	"golang.org/x/text/unicode/norm"

	"github.com/pglease/pglease"
)

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
