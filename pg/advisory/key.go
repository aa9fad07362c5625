package advisory

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// space is one of PostgreSQL's two advisory key spaces. A lock taken with
// one bigint argument and a lock taken with two int4 arguments never
// conflict, even when their bits are equal: pg_locks tells them apart by
// objsubid (1 for bigint, 2 for the int4 pair). Key.Int64 and Key.Pair
// tell a key's space.
type space uint8

const (
	spaceInt64 space = 1 // pg_advisory_lock(bigint), objsubid = 1 in pg_locks
	spacePair  space = 2 // pg_advisory_lock(int4, int4), objsubid = 2 in pg_locks
)

// Key identifies one advisory lock. Build it with Int64, Pair or one of
// the derivations (SHA256Key, NamespacedKey, FNV1a32); the zero Key is
// invalid and every function taking a Key rejects it with
// InvalidArgument. Keys are comparable and usable as map keys.
//
// A Key holds only the numeric id, never the input a derivation hashed.
type Key struct {
	space space
	// id is the bigint for spaceInt64; for spacePair it is
	// int64(a)<<32 | int64(uint32(b)).
	id int64
}

// Int64 returns the key of pg_advisory_lock(id bigint).
func Int64(id int64) Key { return Key{space: spaceInt64, id: id} }

// Pair returns the key of pg_advisory_lock(a int4, b int4). It is a
// different lock from every Int64 key.
func Pair(a, b int32) Key { return Key{space: spacePair, id: int64(a)<<32 | int64(uint32(b))} }

// valid reports whether k was built by Int64, Pair or a derivation (the
// zero Key is the only invalid one).
func (k Key) valid() bool { return k.space == spaceInt64 || k.space == spacePair }

// Int64 returns the bigint id and true for a key of the bigint space (made
// by Int64 or a derivation that gives a bigint).
func (k Key) Int64() (int64, bool) { return k.id, k.space == spaceInt64 }

// Pair returns the two int4 ids and true for a key of the (int4, int4)
// space (made by Pair or a derivation that gives a pair).
func (k Key) Pair() (a, b int32, ok bool) {
	return int32(k.id >> 32), int32(uint32(k.id)), k.space == spacePair
}

// String shows the space and id: "int64:42", "pair:1,2", or "invalid".
// Ids are not secrets, but an id derived from an e-mail address can be
// brute-forced back to it if the address has low entropy: treat logged
// ids of such keys with the care the input deserves.
func (k Key) String() string {
	switch k.space {
	case spaceInt64:
		return "int64:" + strconv.FormatInt(k.id, 10)
	case spacePair:
		a, b, _ := k.Pair()
		return "pair:" + strconv.FormatInt(int64(a), 10) + "," + strconv.FormatInt(int64(b), 10)
	}
	return "invalid"
}

// compare orders keys by space (int64 before pair), then by id (signed;
// for pairs the first, then the second int4). Session.LockAll,
// XactLockAll and TryXactLockAll take keys in this order.
func (k Key) compare(o Key) int {
	if c := cmp.Compare(k.space, o.space); c != 0 {
		return c
	}
	if k.space == spacePair {
		a1, b1, _ := k.Pair()
		a2, b2, _ := o.Pair()
		if c := cmp.Compare(a1, a2); c != 0 {
			return c
		}
		return cmp.Compare(b1, b2)
	}
	return cmp.Compare(k.id, o.id)
}

// pgLocksIDs returns the classid, objid and objsubid under which pg_locks
// shows k.
func (k Key) pgLocksIDs() (classid, objid uint32, objsubid int16) {
	return uint32(uint64(k.id) >> 32), uint32(k.id), int16(k.space)
}

// keyFromPgLocks reassembles a Key from a pg_locks row of locktype
// 'advisory'. ok is false for an objsubid that is neither 1 nor 2.
func keyFromPgLocks(classid, objid uint32, objsubid int16) (Key, bool) {
	switch objsubid {
	case 1:
		return Int64(int64(uint64(classid)<<32 | uint64(objid))), true
	case 2:
		return Pair(int32(classid), int32(objid)), true
	}
	return Key{}, false
}

// maxInputBytes caps the input of the derivations (16 KiB), checked
// before any hashing so a huge input costs nothing.
const maxInputBytes = 16 << 10

// checkInput rejects what PostgreSQL text cannot hold (invalid UTF-8,
// NUL) and oversized input. The message never echoes the input.
func checkInput(op, what, s string) error {
	if len(s) > maxInputBytes {
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" longer than 16 KiB", nil)
	}
	if !utf8.ValidString(s) {
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" is not valid UTF-8", nil)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return pgerr.New(pglease.CodeInvalidArgument, op, what+" contains NUL", nil)
	}
	return nil
}

// normalize is PostgreSQL's lower(trim(s)) under collation "C": trim()
// with no character list strips only U+0020 SPACE from both ends (not
// tabs or newlines), and lower() under "C" maps only A–Z.
func normalize(s string) string {
	s = strings.Trim(s, " ")
	var b []byte
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			if b == nil {
				b = []byte(s)
			}
			b[i] = c + ('a' - 'A')
		}
	}
	if b == nil {
		return s
	}
	return string(b)
}

func sha256Prefix(s string) int64 {
	sum := sha256.Sum256([]byte(s))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// SHA256Key derives the key of the design's SQL function
// email_to_lock_id(input): the first 8 bytes of
// SHA-256(lower(trim(input))), big-endian, as a signed bigint, in the
// int64 space.
//
// Normalisation matches PostgreSQL with collation "C" (or "POSIX"): trim
// strips only spaces (U+0020), and lower maps only ASCII A–Z, so "É"
// stays "É". In a database whose default collation is a libc or ICU
// locale (en_US.UTF-8, und-x-icu, …) lower() also maps non-ASCII
// capitals and the SQL function gives a different id for such inputs:
// there, either lower-case the input yourself before calling both, or
// keep to ASCII. Inputs that are ASCII, or that have no non-ASCII
// capitals, give the same id under every collation.
//
// Empty input (after trimming), input over 16 KiB, invalid UTF-8
// and NUL are InvalidArgument; the error never contains the input.
func SHA256Key(input string) (Key, error) {
	const op = "advisory.SHA256Key"
	if err := checkInput(op, "input", input); err != nil {
		return Key{}, err
	}
	n := normalize(input)
	if n == "" {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "empty input", nil)
	}
	return Int64(sha256Prefix(n)), nil
}

// NamespacedKey derives the key of the design's SQL function
// generate_lock_id(namespace, key): the first 8 bytes of
// SHA-256(namespace || ':' || lower(trim(key))) as a signed bigint, in the
// int64 space. The namespace is used as given (not trimmed or lowered),
// as in the SQL; key is normalised as in SHA256Key (collation "C").
//
// The namespace must be non-empty and must not contain ':' (otherwise
// ("a:b", "c") and ("a", "b:c") would be the same lock); the key must be
// non-empty after trimming. Both obey the input rules of SHA256Key.
func NamespacedKey(namespace, key string) (Key, error) {
	const op = "advisory.NamespacedKey"
	if err := checkInput(op, "namespace", namespace); err != nil {
		return Key{}, err
	}
	if err := checkInput(op, "key", key); err != nil {
		return Key{}, err
	}
	if namespace == "" {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "empty namespace", nil)
	}
	if strings.IndexByte(namespace, ':') >= 0 {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "namespace contains ':'", nil)
	}
	n := normalize(key)
	if n == "" {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "empty key", nil)
	}
	return Int64(sha256Prefix(namespace + ":" + n)), nil
}

// fnv1a32Sum is the registry's TypeScript hashString: 32-bit FNV-1a over
// the UTF-16 code units of s (what String.prototype.charCodeAt returns,
// so a character outside the BMP counts as its two surrogates), returned
// as a signed int32 (hash | 0). s must be valid UTF-8 (FNV1a32 checks);
// an invalid byte hashes as U+FFFD here.
func fnv1a32Sum(s string) int32 {
	const (
		offset = 2166136261
		prime  = 16777619
	)
	h := uint32(offset)
	for _, r := range s {
		if r >= 0x10000 {
			hi, lo := utf16.EncodeRune(r)
			h = (h ^ uint32(hi)) * prime
			h = (h ^ uint32(lo)) * prime
			continue
		}
		h = (h ^ uint32(r)) * prime
	}
	return int32(h)
}

// FNV1a32 derives the key the registry's TypeScript code locks: fnv1a32Sum
// of input, passed to pg_advisory_xact_lock(bigint), so the int32 is
// sign-extended into the int64 space. Empty input, input over
// 16 KiB, invalid UTF-8 and NUL are InvalidArgument.
//
// FNV-1a-32 collides at about 77,000 distinct inputs (birthday bound):
// use it for compatibility with existing TypeScript code, SHA256Key or
// NamespacedKey otherwise.
func FNV1a32(input string) (Key, error) {
	const op = "advisory.FNV1a32"
	if err := checkInput(op, "input", input); err != nil {
		return Key{}, err
	}
	if input == "" {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "empty input", nil)
	}
	return Int64(int64(fnv1a32Sum(input))), nil
}
