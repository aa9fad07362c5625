package keys_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/rangetable"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
)

// §2.2 golden vectors of makeStorageKey.
func TestMakeStorageKeyGolden(t *testing.T) {
	t.Parallel()
	x1700 := strings.Repeat("x", 1700)
	for _, tc := range []struct {
		prefix, key    string
		limit, reserve int
		want           string
	}{
		{"", strings.Repeat("x", 1701), 1700, 0, "bfWkEf_eL9ZYrB28wnAnnA"},
		{"", x1700, 1700, 0, x1700},
		{"syncguard", strings.Repeat("x", 1000), 1000, 26, "syncguard:fSB2XUqRHWtaYW43Z8nglA"},
		{"syncguard:", strings.Repeat("x", 1000), 1000, 26, "syncguard:fSB2XUqRHWtaYW43Z8nglA"},
		{"syncguard::", strings.Repeat("x", 1000), 1000, 26, "syncguard:fSB2XUqRHWtaYW43Z8nglA"},
		{"", "fence:bfWkEf_eL9ZYrB28wnAnnA", 1700, 0, "fence:bfWkEf_eL9ZYrB28wnAnnA"},
		{"p", strings.Repeat("e\u0301", 60), 100, 0, "p:OPjlD9HF4F-UBZ61KVrdaA"},
		{"", "k1", keys.PostgresLimitBytes, keys.PostgresReserveBytes, "k1"},
		{"", "cafe\u0301", 1700, 0, "café"}, // key is NFC-normalized
		{"p", "k", 3, 0, "p:k"},             // equality with the limit is allowed
	} {
		got, err := keys.MakeStorageKey(tc.prefix, tc.key, tc.limit, tc.reserve)
		if err != nil || got != tc.want {
			t.Errorf("MakeStorageKey(%q, %d-byte key, %d, %d) = %q, %v; want %q", tc.prefix, len(tc.key), tc.limit, tc.reserve, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		prefix, key    string
		limit, reserve int
	}{
		{"", "", 1700, 0},                     // empty key
		{"abc", "k", 3, 0},                    // prefix + ':' leaves no room
		{"", "k", 10, 11},                     // reserve larger than the limit
		{"p", strings.Repeat("x", 50), 20, 0}, // hashed form (24 B) still too long
	} {
		if _, err := keys.MakeStorageKey(tc.prefix, tc.key, tc.limit, tc.reserve); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("MakeStorageKey(%q, …, %d, %d) err = %v, want InvalidArgument", tc.prefix, tc.limit, tc.reserve, err)
		}
	}
}

// §2.3: for PostgreSQL the fence key is "fence:"+NFC(key).
func TestFenceKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ key, want string }{
		{"k1", "fence:k1"},
		{"cafe\u0301", "fence:café"},
		{strings.Repeat("é", 256), "fence:" + strings.Repeat("é", 256)},
		// A 1701-byte key is first hashed, then prefixed (two steps).
		{strings.Repeat("x", 1701), "fence:bfWkEf_eL9ZYrB28wnAnnA"},
	} {
		got, err := keys.FenceKey("", tc.key, keys.PostgresLimitBytes, keys.PostgresReserveBytes)
		if err != nil || got != tc.want {
			t.Errorf("FenceKey(%d-byte key) = %q, %v; want %q", len(tc.key), got, err, tc.want)
		}
	}
}

// §2.1 vectors plus the RELIABILITY.md §5 key rows.
func TestNormalizeKey(t *testing.T) {
	t.Parallel()
	ok := []struct{ in, want string }{
		{strings.Repeat("x", 512), strings.Repeat("x", 512)},
		{strings.Repeat("é", 256), strings.Repeat("é", 256)},
		{strings.Repeat("e\u0301", 200), strings.Repeat("é", 200)}, // 600 B raw, 400 B NFC
		{"cafe\u0301", "café"},
		{"'; DROP TABLE syncguard_locks;--", "'; DROP TABLE syncguard_locks;--"},
		{"😀", "😀"},
	}
	for _, tc := range ok {
		got, err := keys.NormalizeKey(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("NormalizeKey(%d bytes) = %d bytes, %v; want %d bytes", len(tc.in), len(got), err, len(tc.want))
		}
	}
	bad := []string{
		"",
		strings.Repeat("x", 513),
		strings.Repeat("é", 256) + "a",
		"\xff\xfe",
		"a\x80b", // lone continuation byte
		"a\x00b",
		strings.Repeat("k", 10<<20), // 10 MiB
		strings.Repeat("x", keys.MaxRawKeyBytes+1),
	}
	for _, in := range bad {
		_, err := keys.NormalizeKey(in)
		if !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("NormalizeKey(%d bytes) err = %v, want InvalidArgument", len(in), err)
		}
		if err != nil && len(in) > 0 && strings.Contains(err.Error(), in) {
			t.Errorf("error echoes the key: %v", err)
		}
	}
}

// A hostile 10 MiB key is rejected without normalizing it (no allocation).
func TestNormalizeKeyHugeNoAlloc(t *testing.T) {
	huge := strings.Repeat("e\u0301", 5<<20)
	allocs := testing.AllocsPerRun(10, func() { _, _ = keys.NormalizeKey(huge) })
	if allocs > 1 {
		t.Fatalf("NormalizeKey(10 MiB) allocated %v times, want ≤ 1 (the error)", allocs)
	}
}

var lockIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

// TestLockProof: a lockId this process generated has a proof from which
// the lockId follows (c || SHA-256(p)[:10], what the strict guard
// computes), and no other lockId has one.
func TestLockProof(t *testing.T) {
	t.Parallel()
	for i := 0; i < 100; i++ {
		id := keys.NewLockID()
		proof, ok := keys.LockProof(id)
		if !ok || len(proof) != 76 {
			t.Fatalf("LockProof(generated) = %d digits, %v", len(proof), ok)
		}
		b, err := hex.DecodeString(proof)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b[6:])
		if got := base64.RawURLEncoding.EncodeToString(append(b[:6:6], h[:10]...)); got != id {
			t.Fatal("the lockId does not follow from its proof")
		}
		other := []byte(id)
		other[10] ^= 1
		if _, ok := keys.LockProof(string(other)); ok {
			t.Fatal("a changed lockId has a proof")
		}
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	if _, ok := keys.LockProof(base64.RawURLEncoding.EncodeToString(b[:])); ok {
		t.Fatal("a random lockId has a proof")
	}
	for _, id := range []string{"", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAA+"} {
		if _, ok := keys.LockProof(id); ok {
			t.Fatalf("LockProof(%q) ok", id)
		}
	}
}

// §2.5: 16 bytes, base64url, 22 chars, last char one of A Q g w (the
// bytes are a counter and a hash rather than random: see NewLockID).
func TestNewLockID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := keys.NewLockID()
		if !lockIDRe.MatchString(id) {
			t.Fatalf("lockId %q does not match %s", id, lockIDRe)
		}
		if !strings.ContainsRune("AQgw", rune(id[21])) {
			t.Fatalf("lockId %q: last char carries more than 2 bits", id)
		}
		if err := keys.ValidateLockID(id); err != nil {
			t.Fatalf("ValidateLockID(generated) = %v", err)
		}
		if seen[id] {
			t.Fatal("duplicate lockId")
		}
		seen[id] = true
	}
}

func TestValidateLockID(t *testing.T) {
	t.Parallel()
	// Non-canonical but well-formed ids pass, as in SyncGuard.
	for _, id := range []string{"AAAAAAAAAAAAAAAAAAAAAB", "abcdefghijklmnopqrst_-", "0123456789012345678901"} {
		if err := keys.ValidateLockID(id); err != nil {
			t.Errorf("ValidateLockID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAA+",
		"AAAAAAAAAAAAAAAAAAAAA/", "AAAAAAAAAAAAAAAAAAAAA=", "AAAAAAAAAAA AAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAé"[:22],
		"'; DROP TABLE x;--AAAA"} {
		err := keys.ValidateLockID(id)
		if !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("ValidateLockID(%q) = %v, want InvalidArgument", id, err)
			continue
		}
		if id != "" && strings.Contains(err.Error(), id) {
			t.Errorf("error echoes the lockId: %v", err)
		}
	}
}

func TestValidateTTL(t *testing.T) {
	t.Parallel()
	// 200 years fits 2^53-1 ms; MaxTTL overflowed int64 and refused it.
	for _, ttl := range []time.Duration{time.Millisecond, 30 * time.Second, 100 * 365 * 24 * time.Hour, 200 * 365 * 24 * time.Hour} {
		if err := keys.ValidateTTL(ttl); err != nil {
			t.Errorf("ValidateTTL(%v) = %v", ttl, err)
		}
	}
	maxTTL := keys.MaxTTL()
	if maxTTL < 290*365*24*time.Hour || maxTTL%time.Millisecond != 0 {
		t.Errorf("MaxTTL() = %v, want the largest whole-ms Duration (~292 years)", maxTTL)
	}
	if err := keys.ValidateTTL(maxTTL); err != nil {
		t.Errorf("ValidateTTL(MaxTTL()) = %v", err)
	}
	for _, ttl := range []time.Duration{0, -time.Millisecond, 1500 * time.Microsecond, time.Nanosecond,
		maxTTL + time.Millisecond, 1<<63 - 1} {
		if err := keys.ValidateTTL(ttl); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("ValidateTTL(%v) = %v, want InvalidArgument", ttl, err)
		}
	}
	// The bound: now + MaxTTL stays below 2^53-1 ms.
	if got := time.Now().UnixMilli() + maxTTL.Milliseconds(); got > keys.MaxSafeIntegerMs {
		t.Errorf("now + MaxTTL = %d > 2^53-1", got)
	}
}

// FuzzNormalizeKey checks NormalizeKey's and HashKey's invariants on any
// input: accepted keys are valid UTF-8, NUL-free, ≤ 512 bytes, NFC-stable;
// errors never echo the input; HashKey is 24 hex digits and NFC-invariant.
// `go test -fuzz FuzzNormalizeKey .` explores; make test runs the seeds.
func FuzzNormalizeKey(f *testing.F) {
	for _, s := range []string{"", "k1", "cafe\u0301", "café", "😀", "\xff\xfe", "a\x00b", strings.Repeat("é", 256) + "a",
		"'; DROP TABLE syncguard_locks;--", "\u1e9b\u0323", "\ud7ff"} {
		f.Add(s)
	}
	hexRe := regexp.MustCompile(`^[0-9a-f]{24}$`)
	f.Fuzz(func(t *testing.T, in string) {
		h := pglease.HashKey(in)
		if !hexRe.MatchString(h) {
			t.Fatalf("HashKey = %q", h)
		}
		k, err := keys.NormalizeKey(in)
		if err != nil {
			if !errors.Is(err, pglease.ErrInvalidArgument) {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if len(in) >= 4 && strings.Contains(err.Error(), in) {
				t.Fatalf("error echoes input: %v", err)
			}
			return
		}
		if k == "" || len(k) > keys.MaxKeyBytes || !utf8.ValidString(k) || strings.IndexByte(k, 0) >= 0 {
			t.Fatalf("accepted bad key %q", k)
		}
		if k2, err := keys.NormalizeKey(k); err != nil || k2 != k {
			t.Fatalf("NormalizeKey not idempotent: %q -> %q, %v", k, k2, err)
		}
		if pglease.HashKey(k) != h {
			t.Fatalf("HashKey differs between input and its NFC form")
		}
	})
}

// TestNormalizeKeyUnassignedCodePoints: keys with code points
// unassigned in the Unicode version of pglease's NFC tables are refused
// (InvalidArgument, the key not echoed), since a newer normalizer may
// compose or reorder them (these keys: Node 20's ICU, Unicode 17,
// turns "\U000105D2\u0307" into "\U000105C9" and "x\u0897\u0316" into
// "x\u0316\u0897"). Which code points are unassigned depends on the
// version in force (x/text and the Go release): the expectations are
// computed from it, and the keys assigned in it are accepted.
func TestNormalizeKeyUnassignedCodePoints(t *testing.T) {
	t.Parallel()
	if keys.UnicodeVersion != norm.Version {
		t.Fatalf("UnicodeVersion %s, norm.Version %s", keys.UnicodeVersion, norm.Version)
	}
	assigned := rangetable.Assigned(norm.Version)
	if assigned == nil {
		t.Fatalf("no table of assigned code points for Unicode %s", norm.Version)
	}
	cases := []string{
		"\U000105D2\u0307", // Todhri (Unicode 16) + combining dot above
		"x\u0897\u0316",    // Arabic pepet (Unicode 16) + a combining mark of another class
		"job:\U000105C9",   // the composed form Node stores for the first
		"\U0010FFFF",       // a noncharacter: unassigned in every version
		"\u0378",           // never assigned (Greek block gap)
	}
	refused := 0
	for _, k := range cases {
		unassigned := false
		for _, r := range k {
			if !unicode.Is(assigned, r) {
				unassigned = true
			}
		}
		_, err := keys.NormalizeKey(k)
		switch {
		case unassigned && !errors.Is(err, pglease.ErrInvalidArgument):
			t.Errorf("NormalizeKey(%+q) = %v: it has a code point unassigned in Unicode %s", k, err, norm.Version)
		case !unassigned && err != nil:
			t.Errorf("NormalizeKey(%+q) = %v: every code point is assigned in Unicode %s", k, err, norm.Version)
		}
		if unassigned {
			refused++
			if err != nil && (strings.Contains(err.Error(), k) || !strings.Contains(err.Error(), norm.Version)) {
				t.Errorf("error %q echoes the key or does not name the Unicode version", err)
			}
		}
	}
	if norm.Version == "15.0.0" && refused != len(cases) {
		t.Errorf("with Unicode 15 tables all %d keys must be refused, %d were", len(cases), refused)
	}
	// Assigned characters of every age are accepted: NFC is stable for them.
	for _, k := range []string{"café", "cafe\u0301", "日本語", "😀", "\uE000" /* private use */} {
		if _, err := keys.NormalizeKey(k); err != nil {
			t.Errorf("NormalizeKey(%+q) = %v", k, err)
		}
	}
}

// BenchmarkNewLockID: a lockId and its hidden proof, as every attempt
// makes one on the Manager's loop.
func BenchmarkNewLockID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = keys.NewLockID()
	}
}
