package advisory

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// designSQL is the design document's email_to_lock_id and
// generate_lock_id, verbatim apart from the schema.
const designSQL = `
CREATE FUNCTION email_to_lock_id(p_email TEXT)
RETURNS BIGINT AS $$
DECLARE
  v_hash BYTEA;
  v_lock_id BIGINT;
BEGIN
  p_email := LOWER(TRIM(p_email));
  v_hash := digest(p_email, 'sha256');
  v_lock_id := (
    (get_byte(v_hash, 0)::BIGINT << 56) |
    (get_byte(v_hash, 1)::BIGINT << 48) |
    (get_byte(v_hash, 2)::BIGINT << 40) |
    (get_byte(v_hash, 3)::BIGINT << 32) |
    (get_byte(v_hash, 4)::BIGINT << 24) |
    (get_byte(v_hash, 5)::BIGINT << 16) |
    (get_byte(v_hash, 6)::BIGINT << 8)  |
    (get_byte(v_hash, 7)::BIGINT)
  );
  IF v_lock_id > 9223372036854775807 THEN
    v_lock_id := v_lock_id - 18446744073709551616;
  END IF;
  RETURN v_lock_id;
END;
$$ LANGUAGE plpgsql IMMUTABLE;

CREATE FUNCTION generate_lock_id(p_namespace TEXT, p_key TEXT)
RETURNS BIGINT AS $$
DECLARE
  v_combined TEXT;
  v_hash BYTEA;
  v_lock_id BIGINT;
BEGIN
  v_combined := p_namespace || ':' || LOWER(TRIM(p_key));
  v_hash := digest(v_combined, 'sha256');
  v_lock_id := (
    (get_byte(v_hash, 0)::BIGINT << 56) |
    (get_byte(v_hash, 1)::BIGINT << 48) |
    (get_byte(v_hash, 2)::BIGINT << 40) |
    (get_byte(v_hash, 3)::BIGINT << 32) |
    (get_byte(v_hash, 4)::BIGINT << 24) |
    (get_byte(v_hash, 5)::BIGINT << 16) |
    (get_byte(v_hash, 6)::BIGINT << 8)  |
    (get_byte(v_hash, 7)::BIGINT)
  );
  RETURN v_lock_id;
END;
$$ LANGUAGE plpgsql IMMUTABLE;`

// designConn returns a connection whose search_path holds pgcrypto and
// the design's functions.
func designConn(t *testing.T) *pgx.Conn {
	t.Helper()
	schema := pgtest.Schema(t)
	c := superConn(t)
	ctx := ctxT(t, 30*time.Second)
	for _, q := range []string{
		"SET search_path = " + schema,
		"CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA " + schema,
		designSQL,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%.40s: %v", q, err)
		}
	}
	return c
}

// randomText returns valid UTF-8 text without NUL, mixing ASCII
// (upper case and spaces included) with characters from every plane.
func randomText(r *rand.Rand) string {
	var b strings.Builder
	n := 1 + r.IntN(24)
	for range n {
		switch r.IntN(6) {
		case 0:
			b.WriteByte(byte('A' + r.IntN(26)))
		case 1:
			b.WriteByte(byte('a' + r.IntN(26)))
		case 2:
			b.WriteByte(" @.\t_-+"[r.IntN(7)])
		case 3:
			b.WriteRune(rune(0x80 + r.IntN(0x800-0x80))) // Latin-1, Greek, Cyrillic …
		case 4:
			b.WriteRune(rune(0x800 + r.IntN(0xD800-0x800))) // rest of the BMP before surrogates
		default:
			b.WriteRune(rune(0x10000 + r.IntN(0x10FFFF-0x10000))) // astral
		}
	}
	return b.String()
}

// derivationInputs mixes hand-picked inputs where trim/lower rules
// matter with random ones.
func derivationInputs() []string {
	in := []string{
		"user@example.com", "USER@EXAMPLE.COM", "  User@Example.Com  ", "\tuser@example.com", "user@example.com\n",
		"ÉCOLE@Example.COM", "école@example.com", "  Ünïcödé@Straße.DE ", "ΣΑΣ@x.gr", "İstanbul@x.tr", "ǅ", "ＡＢＣ",
		"日本語@例え.jp", "\U0001F600@emoji.example", "a b", "'; DROP TABLE x;--", "x",
		strings.Repeat("Ab", 2000),
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		s := randomText(r)
		if strings.Trim(s, " ") != "" {
			in = append(in, s)
		}
	}
	return in
}

func TestDerivationsMatchDesignSQL(t *testing.T) {
	t.Parallel()
	c := designConn(t)
	ctx := ctxT(t, 30*time.Second)
	inputs := derivationInputs()

	t.Run("SHA256Key=email_to_lock_id", func(t *testing.T) {
		rows, err := c.Query(ctx, "SELECT email_to_lock_id(x) FROM unnest($1::text[]) WITH ORDINALITY AS u(x, i) ORDER BY i", inputs)
		if err != nil {
			t.Fatal(err)
		}
		want, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		for i, in := range inputs {
			k, err := SHA256Key(in)
			if err != nil {
				t.Fatalf("input %d: %v", i, err)
			}
			if got, _ := k.Int64(); got != want[i] {
				t.Errorf("input %d %q: Go %d, SQL %d", i, in, got, want[i])
			}
		}
	})

	t.Run("NamespacedKey=generate_lock_id", func(t *testing.T) {
		namespaces := []string{"cleanup", "registration", "Cleanup", "名前空間", "ns with space", "\U0001F512"}
		var nss, keys []string
		for i, in := range inputs {
			nss = append(nss, namespaces[i%len(namespaces)])
			keys = append(keys, in)
		}
		rows, err := c.Query(ctx, `SELECT generate_lock_id(n, k) FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(n, k, i) ORDER BY i`, nss, keys)
		if err != nil {
			t.Fatal(err)
		}
		want, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		for i := range keys {
			k, err := NamespacedKey(nss[i], keys[i])
			if err != nil {
				t.Fatalf("input %d: %v", i, err)
			}
			if got, _ := k.Int64(); got != want[i] {
				t.Errorf("input %d (%q, %q): Go %d, SQL %d", i, nss[i], keys[i], got, want[i])
			}
		}
	})

	// The harness cluster is initdb --locale=C, so lower() maps only
	// A–Z, as SHA256Key does. Under a Unicode collation lower() also
	// maps É: the ids differ, as SHA256Key's doc says, and pre-lowering
	// the input makes them agree again.
	t.Run("collation", func(t *testing.T) {
		var coll string
		err := c.QueryRow(ctx, `SELECT collname FROM pg_collation
			WHERE collname IN ('und-x-icu', 'C.utf8', 'C.UTF-8', 'en_US.utf8') ORDER BY collname DESC LIMIT 1`).Scan(&coll)
		if err == pgx.ErrNoRows {
			t.Skip("no Unicode collation on this server")
		} else if err != nil {
			t.Fatal(err)
		}
		var dbColl string
		if err := c.QueryRow(ctx, "SELECT datcollate FROM pg_database WHERE datname = current_database()").Scan(&dbColl); err != nil {
			t.Fatal(err)
		}
		if dbColl != "C" && dbColl != "POSIX" {
			t.Skipf("database collation is %q, not C", dbColl)
		}
		sqlUnder := func(in string) int64 {
			var b []byte
			q := fmt.Sprintf(`SELECT digest(lower(trim($1) COLLATE %s), 'sha256')`, pgx.Identifier{coll}.Sanitize())
			if err := c.QueryRow(ctx, q, in).Scan(&b); err != nil {
				t.Fatal(err)
			}
			return int64(binary.BigEndian.Uint64(b[:8]))
		}
		id := func(in string) int64 {
			k, err := SHA256Key(in)
			if err != nil {
				t.Fatal(err)
			}
			v, _ := k.Int64()
			return v
		}
		if sqlUnder("USER@EXAMPLE.COM") != id("USER@EXAMPLE.COM") {
			t.Errorf("ASCII input: ids differ under %s", coll)
		}
		if sqlUnder("ÉCOLE@X.COM") == id("ÉCOLE@X.COM") {
			t.Errorf("non-ASCII capital: ids agree under %s; expected lower() to map É", coll)
		}
		if sqlUnder("ÉCOLE@X.COM") != id("école@x.com") {
			t.Errorf("pre-lowered input: ids differ under %s", coll)
		}
	})
}

// fnvVectors were produced by running the registry document's TypeScript
// hashString verbatim under node (v18), not by this package:
//
//	node -e 'function hashString(input){let hash=2166136261;for(let i=0;i<input.length;i++){
//	  hash^=input.charCodeAt(i);hash=Math.imul(hash,16777619)}return hash|0}
//	for(const s of ["a","42424242","tenant-1:2025-01-15","tenant-1:balance:booking-42","café","cafe\u0301",
//	  "日本語","\u{1F600}","a\u{1F600}b","\u{1D518}\u{1D52B}\u{1D526}","Ω:ß:\u{10FFFF}","'"'"'; DROP TABLE x;--"])
//	  console.log(JSON.stringify(s), hashString(s))'
var fnvVectors = []struct {
	in   string
	want int32
}{
	{"a", -468965076},
	{"42424242", 1203236997},
	{"tenant-1:2025-01-15", 761239885},
	{"tenant-1:balance:booking-42", 809058413},
	{"café", 856211068},
	{"cafe\u0301", 1829333483},
	{"日本語", 1409693518},
	{"\U0001F600", -885930824},
	{"a\U0001F600b", -1882553087},
	{"\U0001D518\U0001D52B\U0001D526", 1246269487},
	{"Ω:ß:\U0010FFFF", 1130505517},
	{"'; DROP TABLE x;--", -1531337253},
}

func TestFNV1a32MatchesTypeScript(t *testing.T) {
	t.Parallel()
	for _, v := range fnvVectors {
		k, err := FNV1a32(v.in)
		if err != nil {
			t.Fatalf("%q: %v", v.in, err)
		}
		if got, _ := k.Int64(); got != int64(v.want) {
			t.Errorf("FNV1a32(%q) = %d, TypeScript %d", v.in, got, v.want)
		}
		// Non-ASCII vectors must tell UTF-16 from UTF-8 hashing apart.
		if !isASCII(v.in) {
			h := fnv.New32a()
			h.Write([]byte(v.in))
			if int32(h.Sum32()) == v.want {
				t.Errorf("%q: UTF-8 FNV equals the UTF-16 vector; vector proves nothing", v.in)
			}
		}
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func TestDerivationBadInput(t *testing.T) {
	t.Parallel()
	secret := "victim@example.com\xff"
	cases := map[string]func() (Key, error){
		"sha empty":        func() (Key, error) { return SHA256Key("") },
		"sha spaces":       func() (Key, error) { return SHA256Key("   ") },
		"sha invalid utf8": func() (Key, error) { return SHA256Key(secret) },
		"sha NUL":          func() (Key, error) { return SHA256Key("a\x00b") },
		"sha huge":         func() (Key, error) { return SHA256Key(strings.Repeat("a", maxInputBytes+1)) },
		"ns empty":         func() (Key, error) { return NamespacedKey("", "k") },
		"ns colon":         func() (Key, error) { return NamespacedKey("a:b", "k") },
		"ns key empty":     func() (Key, error) { return NamespacedKey("ns", " ") },
		"ns key invalid":   func() (Key, error) { return NamespacedKey("ns", secret) },
		"fnv empty":        func() (Key, error) { return FNV1a32("") },
		"fnv invalid":      func() (Key, error) { return FNV1a32(secret) },
		"fnv NUL":          func() (Key, error) { return FNV1a32("\x00") },
	}
	for name, f := range cases {
		k, err := f()
		if pglease.CodeOf(err) != pglease.CodeInvalidArgument || k.valid() {
			t.Errorf("%s: key %v, err %v; want InvalidArgument", name, k, err)
		}
		if err != nil && strings.Contains(err.Error(), "victim") {
			t.Errorf("%s: error echoes the input: %v", name, err)
		}
	}
	if _, err := SHA256Key(strings.Repeat("a", maxInputBytes)); err != nil {
		t.Errorf("input of maxInputBytes: %v", err)
	}
}

func TestKeyStringAndOrder(t *testing.T) {
	t.Parallel()
	cases := []struct {
		k    Key
		want string
	}{
		{Int64(42424242), "int64:42424242"},
		{Int64(math.MinInt64), "int64:" + strconv.FormatInt(math.MinInt64, 10)},
		{Pair(-1, 7), "pair:-1,7"},
		{Pair(math.MaxInt32, math.MinInt32), "pair:2147483647,-2147483648"},
		{Key{}, "invalid"},
	}
	for _, c := range cases {
		if got := c.k.String(); got != c.want {
			t.Errorf("String() = %q, want %q", got, c.want)
		}
	}
	a, b, ok := Pair(-5, -6).Pair()
	if !ok || a != -5 || b != -6 {
		t.Errorf("Pair round trip: %d %d %v", a, b, ok)
	}
	if _, ok := Pair(0, 5).Int64(); ok {
		t.Error("a pair key claims the int64 space")
	}
	if Int64(5) == Pair(0, 5) {
		t.Error("Int64(5) == Pair(0, 5): key spaces not kept apart")
	}
	ordered := []Key{Int64(math.MinInt64), Int64(-1), Int64(0), Int64(math.MaxInt64), Pair(-1, -1), Pair(-1, 0), Pair(0, -1), Pair(0, 0)}
	for i := range ordered {
		for j := range ordered {
			if got := ordered[i].compare(ordered[j]); (got < 0) != (i < j) || (got == 0) != (i == j) {
				t.Errorf("Compare(%v, %v) = %d", ordered[i], ordered[j], got)
			}
		}
	}
}

// TestKeySpacesOnServer: Int64(x) and Pair(hi, lo) with the same bits are
// different locks on the server, and pg_locks rows reassemble to the
// keys that were taken (negative ids included).
func TestKeySpacesOnServer(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s1, s2 := openSession(t, pool, testOpts()), openSession(t, pool, testOpts())
	ctx := ctxT(t, 10*time.Second)
	id := rand.Int64() | math.MinInt64 // negative: the high bit exercises sign handling
	k64 := Int64(id)
	kp := Pair(int32(id>>32), int32(id))
	if _, ok, err := s1.TryLock(ctx, k64); !ok || err != nil {
		t.Fatalf("TryLock int64: %v %v", ok, err)
	}
	if _, ok, err := s2.TryLock(ctx, kp); !ok || err != nil {
		t.Fatalf("TryLock pair with the same bits: %v %v (spaces conflated)", ok, err)
	}
	if !heldBy(t, pool, s1.BackendPID(), k64) || !heldBy(t, pool, s2.BackendPID(), kp) {
		t.Fatal("pg_locks does not show the keys as taken")
	}
	if _, ok, _ := s2.TryLock(ctx, k64); ok {
		t.Fatal("second session took a held int64 key")
	}
}
