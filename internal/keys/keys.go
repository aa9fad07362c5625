// Package keys holds the SyncGuard-compatible rules for lock keys,
// lockIds, TTLs and fences that every pglease package enforces: key
// normalization and limits, storage and fence keys, lockId generation and
// syntax, the TTL bound, the fence thresholds, and SyncGuard's time
// tolerance. It is internal: users meet these rules only through the
// errors (InvalidArgument) of the public functions that enforce them, and
// through the words of their documentation.
package keys

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/rangetable"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Key limits and time constants shared with SyncGuard 2.5.2
// (common/constants.ts, common/time-predicates.ts).
const (
	// MaxKeyBytes is the largest lock key, in UTF-8 bytes after NFC
	// normalization (SyncGuard's MAX_KEY_LENGTH_BYTES).
	MaxKeyBytes = 512
	// MaxRawKeyBytes caps a key's raw length before NFC normalization, so
	// a hostile 10 MiB key is rejected without normalizing it. NFC can
	// grow or shrink a string, but a key that is valid after NFC
	// (≤ 512 bytes) is far below this cap before it in any practical case
	// (a decomposed key shrinks by at most a small factor).
	MaxRawKeyBytes = 16 << 10
	// TimeToleranceMs is SyncGuard's TIME_TOLERANCE_MS: a lease record
	// stays live for acquirers until expires_at_ms + 1000 on the server
	// clock.
	TimeToleranceMs = 1000
	// TimeTolerance is TimeToleranceMs as a time.Duration.
	TimeTolerance = TimeToleranceMs * time.Millisecond
	// MaxSafeIntegerMs is 2^53−1, JavaScript's Number.MAX_SAFE_INTEGER:
	// the largest expires_at_ms a Node reader of the same table can
	// represent exactly.
	MaxSafeIntegerMs = 1<<53 - 1
	// lockIDLen is the length of a lockId: 16 random bytes in unpadded
	// base64url.
	lockIDLen = 22
)

// Storage-key limits of SyncGuard's PostgreSQL backend (BACKEND_LIMITS
// and RESERVE_BYTES), for MakeStorageKey and FenceKey.
const (
	PostgresLimitBytes   = 1700
	PostgresReserveBytes = 0
)

const opKey = "pglease.NormalizeKey"

// UnicodeVersion is the Unicode version of the NFC tables pglease
// normalizes keys with (golang.org/x/text/unicode/norm's Version, which
// depends on the x/text version and the Go release it is built with).
// NormalizeKey refuses keys containing code points unassigned in it.
const UnicodeVersion = norm.Version

// assigned is the set of code points assigned in UnicodeVersion.
var assigned = rangetable.Assigned(norm.Version)

// unassignedRune returns the first code point of s (valid UTF-8) that is
// unassigned in UnicodeVersion. Without a table for that version (never
// with a consistent x/text), every non-ASCII code point counts as
// unassigned: refusing is safe, accepting is not.
func unassignedRune(s string) (rune, bool) {
	for _, r := range s {
		if r < utf8.RuneSelf {
			continue // ASCII: all assigned
		}
		if assigned == nil || !unicode.Is(assigned, r) {
			return r, true
		}
	}
	return 0, false
}

// NormalizeKey validates a lock key and returns its NFC form, the form
// SyncGuard stores (normalizeAndValidateKey). In order: an empty key, a
// key longer than MaxRawKeyBytes, invalid UTF-8, a key containing NUL, or
// a key containing a code point unassigned in UnicodeVersion is
// InvalidArgument (checked before normalizing); then the key is
// NFC-normalized and must be at most MaxKeyBytes UTF-8 bytes. Error texts
// never contain the key.
//
// Why unassigned code points are refused: NFC never changes for assigned
// characters from one Unicode version to the next, but a code point
// unassigned in the version one program normalizes with may be a
// combining character in a newer one. Node 20's ICU (Unicode 17), for
// instance, composes "𐗉" to "𐗉" and reorders
// "x̖ࢗ", where Unicode 15 tables leave both unchanged: SyncGuard
// and pglease would store different rows for the same key and both get
// the lock. Refusing such keys means no two fleets can disagree about a
// key pglease accepts.
func NormalizeKey(key string) (string, error) {
	switch {
	case key == "":
		return "", pgerr.New(pglease.CodeInvalidArgument, opKey, "key must not be empty", nil)
	case len(key) > MaxRawKeyBytes:
		return "", pgerr.New(pglease.CodeInvalidArgument, opKey, "key exceeds the raw length cap before normalization", nil)
	case !utf8.ValidString(key):
		return "", pgerr.New(pglease.CodeInvalidArgument, opKey, "key is not valid UTF-8", nil)
	case strings.IndexByte(key, 0) >= 0:
		return "", pgerr.New(pglease.CodeInvalidArgument, opKey, "key contains a NUL byte", nil)
	}
	if _, ok := unassignedRune(key); ok { // the code point is not echoed either
		return "", pgerr.New(pglease.CodeInvalidArgument, opKey, "key contains a code point unassigned in Unicode "+norm.Version+
			" (the version of pglease's NFC tables): processes with newer tables, such as SyncGuard on Node, may normalize it differently and lock another key", nil)
	}
	k := norm.NFC.String(key)
	if len(k) > MaxKeyBytes {
		return "", pgerr.New(pglease.CodeInvalidArgument, opKey, "key exceeds 512 bytes after NFC normalization", nil)
	}
	return k, nil
}

const opStorageKey = "pglease.MakeStorageKey"

// MakeStorageKey is SyncGuard's makeStorageKey (common/crypto.ts): it
// returns prefix+":"+NFC(key) (or NFC(key) when prefix is empty after
// stripping its trailing colons) when that fits in limitBytes−reserveBytes
// UTF-8 bytes, and otherwise the same prefix followed by the unpadded
// base64url of the first 16 bytes of SHA-256(prefix+":"+NFC(key)). An empty
// key, or a prefix that leaves no room, is InvalidArgument. The prefix is
// not normalized.
func MakeStorageKey(prefix, key string, limitBytes, reserveBytes int) (string, error) {
	if key == "" {
		return "", pgerr.New(pglease.CodeInvalidArgument, opStorageKey, "key must not be empty", nil)
	}
	key = norm.NFC.String(key)
	prefix = strings.TrimRight(prefix, ":")
	sep := 0
	if prefix != "" {
		sep = 1
	}
	if len(prefix)+sep+reserveBytes > limitBytes {
		return "", pgerr.New(pglease.CodeInvalidArgument, opStorageKey, "prefix leaves no room for the key", nil)
	}
	prefixed := key
	if prefix != "" {
		prefixed = prefix + ":" + key
	}
	if len(prefixed)+reserveBytes <= limitBytes {
		return prefixed, nil
	}
	sum := sha256.Sum256([]byte(prefixed))
	out := base64.RawURLEncoding.EncodeToString(sum[:16])
	if prefix != "" {
		out = prefix + ":" + out
	}
	if len(out)+reserveBytes > limitBytes {
		return "", pgerr.New(pglease.CodeInvalidArgument, opStorageKey, "hashed storage key exceeds the limit", nil)
	}
	return out, nil
}

// FenceKey is SyncGuard's two-step fence-key derivation
// (docs/specs/interface.md "Two-Step Fence Key Derivation"):
// MakeStorageKey(prefix, "fence:"+MakeStorageKey(prefix, key, …), …).
// For PostgreSQL (prefix "", PostgresLimitBytes, PostgresReserveBytes) and
// keys of at most MaxKeyBytes this is always "fence:"+NFC(key).
func FenceKey(prefix, key string, limitBytes, reserveBytes int) (string, error) {
	base, err := MakeStorageKey(prefix, key, limitBytes, reserveBytes)
	if err != nil {
		return "", err
	}
	return MakeStorageKey(prefix, "fence:"+base, limitBytes, reserveBytes)
}

// NewLockID returns a fresh lockId: 16 bytes in unpadded base64url, 22
// characters, the syntax of SyncGuard's generateLockId. A lockId is a
// bearer secret: whoever has it can extend or release the lock. It also
// comes with a guard proof (LockProof) that the lock table does not hold:
// the 16 bytes are a 6-byte counter c (unique in this process, from a
// random start) and the first 10 bytes of SHA-256(p), where p =
// HMAC-SHA256(k, c) and k is a random key of this process that never
// leaves it. Whoever reads the lockId (from the lock table) learns c but
// not p, and finding a p from the 10 bytes is a preimage of an 80-bit
// hash. It panics only if the system's random source fails, as
// crypto/rand.Read does.
func NewLockID() string {
	proofInit()
	c := proofCtr.Add(1)
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], c<<16) // the low 48 bits of c, big-endian, in b[:6]
	p := proofOf(b[:6])
	h := sha256.Sum256(p)
	copy(b[6:], h[:10])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// LockProof returns the guard proof of a lockId that NewLockID generated
// in this process (ok false for any other lockId): 76 hex digits, c and
// p of NewLockID, from which the server derives the lockId
// (c || SHA-256(p)[:10]) but no reader of the lockId derives the proof.
// The strict database guard (migrate.Migrator.GuardStrict) accepts a
// transaction's writes only with it. It is a secret like the lockId.
func LockProof(id string) (string, bool) {
	if len(id) != lockIDLen {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(b) != 16 {
		return "", false
	}
	proofInit()
	p := proofOf(b[:6])
	h := sha256.Sum256(p)
	if !hmac.Equal(h[:10], b[6:]) {
		return "", false
	}
	return hex.EncodeToString(append(b[:6:6], p...)), true
}

var (
	proofOnce sync.Once
	proofKey  [32]byte      // k: this process's key for guard proofs
	proofCtr  atomic.Uint64 // c's source: starts at random, counts up
)

func proofInit() {
	proofOnce.Do(func() {
		var seed [8]byte
		if _, err := rand.Read(proofKey[:]); err != nil {
			panic("pglease: crypto/rand failed: " + err.Error())
		}
		if _, err := rand.Read(seed[:]); err != nil {
			panic("pglease: crypto/rand failed: " + err.Error())
		}
		proofCtr.Store(binary.BigEndian.Uint64(seed[:]) >> 16)
	})
}

// proofMACs keeps keyed HMAC states for proofOf: a Reset state skips
// hashing the key's pads again, which was half of a lockId's cost, and
// every attempt makes a lockId on the Manager's loop. New runs only after
// proofInit has set the key.
var proofMACs = sync.Pool{New: func() any { return hmac.New(sha256.New, proofKey[:]) }}

// proofOf returns HMAC-SHA256(proofKey, c).
func proofOf(c []byte) []byte {
	m := proofMACs.Get().(hash.Hash)
	m.Reset()
	m.Write(c)
	p := m.Sum(make([]byte, 0, sha256.Size))
	proofMACs.Put(m)
	return p
}

// ValidateLockID reports whether id has lockId syntax,
// ^[A-Za-z0-9_-]{22}$ (SyncGuard's validateLockId; like SyncGuard it
// does not check that the last character is canonical). The error is
// InvalidArgument and never contains id.
func ValidateLockID(id string) error {
	if len(id) != lockIDLen {
		return pgerr.New(pglease.CodeInvalidArgument, "pglease.ValidateLockID", "lockId must be 22 base64url characters", nil)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return pgerr.New(pglease.CodeInvalidArgument, "pglease.ValidateLockID", "lockId must be 22 base64url characters", nil)
		}
	}
	return nil
}

// ValidateTTL checks a lease TTL: it must be positive, a whole number of
// milliseconds (SyncGuard stores integer ttlMs), and small enough that
// expires_at_ms = now + ttl stays at most MaxSafeIntegerMs (2^53−1), so
// Node readers of the same table read it exactly. "now" is the local
// clock at the time of the check; the server computes the real expiry
// from its own clock, so this bound leaves a margin of one day for clock
// differences. Errors are InvalidArgument.
func ValidateTTL(ttl time.Duration) error {
	const op = "pglease.ValidateTTL"
	switch {
	case ttl <= 0:
		return pgerr.New(pglease.CodeInvalidArgument, op, "ttl must be positive", nil)
	case ttl%time.Millisecond != 0:
		return pgerr.New(pglease.CodeInvalidArgument, op, "ttl must be a whole number of milliseconds", nil)
	case ttl > MaxTTL():
		return pgerr.New(pglease.CodeInvalidArgument, op, "ttl too large: above MaxTTL (expiry would exceed 2^53-1 ms)", nil)
	}
	return nil
}

// MaxTTL returns the largest TTL ValidateTTL accepts now: 2^53−1 ms −
// local now − one day (margin for server clock skew), or the largest
// whole-millisecond time.Duration (about 292 years) if that is smaller,
// as it is for the next 285,000 years.
func MaxTTL() time.Duration {
	ms := int64(MaxSafeIntegerMs) - time.Now().UnixMilli() - int64(24*time.Hour/time.Millisecond)
	return time.Duration(min(ms, int64(math.MaxInt64/time.Millisecond))) * time.Millisecond
}
