package advisory

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

func loadDesigns(t *testing.T) *Registry {
	t.Helper()
	f, err := os.Open("testdata/designs.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reg, err := LoadRegistry(f)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func TestLoadRegistry(t *testing.T) {
	t.Parallel()
	reg := loadDesigns(t)
	var names []string
	for _, e := range reg.List() {
		names = append(names, e.Name+"/"+e.Hash)
	}
	if want := []string{"balance/fnv1a32", "booking/fnv1a32", "idempotency-cleanup/", "orphan-cleanup/sha256",
		"registration/namespaced:registration"}; !slices.Equal(names, want) {
		t.Fatalf("entries %v, want %v", names, want)
	}
	if e, ok := reg.Lookup("idempotency-cleanup"); !ok || e.Key != Int64(42424242) {
		t.Fatalf("Lookup = %+v %v", e, ok)
	}
	// Derive gives the designs' own derivations.
	for _, c := range []struct {
		name  string
		parts []string
		want  func() (Key, error)
	}{
		{"booking", []string{"tenant-1", "2025-01-15"}, func() (Key, error) { return FNV1a32("tenant-1:2025-01-15") }},
		{"balance", []string{"tenant-1", "b-9"}, func() (Key, error) { return FNV1a32("tenant-1:balance:b-9") }},
		{"orphan-cleanup", []string{" User@Example.com"}, func() (Key, error) { return SHA256Key("user@example.com") }},
		{"registration", []string{"user@example.com"}, func() (Key, error) { return NamespacedKey("registration", "user@example.com") }},
	} {
		got, err := reg.Derive(c.name, c.parts...)
		want, werr := c.want()
		if err != nil || werr != nil || got != want {
			t.Errorf("Derive(%s) = %v %v, want %v %v", c.name, got, err, want, werr)
		}
		if n, ok := reg.Name(got); !ok || n != c.name {
			t.Errorf("Name(Derive(%s)) = %q %v", c.name, n, ok)
		}
	}
	_, err := reg.Derive("idempotency-cleanup")
	wantCode(t, err, pglease.CodeInvalidArgument)
	_, err = reg.Derive("nope", "x")
	wantCode(t, err, pglease.CodeInvalidArgument)
}

// TestLoadRegistryRefuses: a registry file with a colliding id (the
// registry design's failure) or any malformed entry stops the
// application at start-up with InvalidArgument naming the entry.
func TestLoadRegistryRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, file, msg string }{
		{"colliding fixed ids", `{"locks": [{"name": "a", "key": 42424242}, {"name": "b", "key": "int64:42424242"}]}`,
			`entry 2 ("b"): key already registered under the name "a"`},
		{"name twice", `{"locks": [{"name": "a", "key": 1}, {"name": "a", "pattern": "{x}", "hash": "sha256"}]}`, `entry 2 ("a"): name already registered`},
		{"unknown field", `{"locks": [{"name": "a", "id": 1}]}`, "not valid JSON"},
		{"key and pattern", `{"locks": [{"name": "a", "key": 1, "pattern": "{x}", "hash": "sha256"}]}`, "not both"},
		{"no key", `{"locks": [{"name": "a"}]}`, "needs a key"},
		{"pattern without hash", `{"locks": [{"name": "a", "pattern": "{x}"}]}`, "needs a key"},
		{"unknown hash", `{"locks": [{"name": "a", "pattern": "{x}", "hash": "md5"}]}`, "unknown hash"},
		{"bad namespace", `{"locks": [{"name": "a", "pattern": "{x}", "hash": "namespaced:a:b"}]}`, "bad namespace"},
		{"bad key", `{"locks": [{"name": "a", "key": "int32:5"}]}`, "int64:ID or pair:A,B"},
		{"key too big", `{"locks": [{"name": "a", "key": 9223372036854775808}]}`, "64-bit integer"},
		{"key not a number", `{"locks": [{"name": "a", "key": true}]}`, "64-bit integer"},
		{"template without placeholder", `{"locks": [{"name": "a", "pattern": "x", "hash": "sha256"}]}`, "no {placeholder}"},
		{"empty name", `{"locks": [{"name": "", "key": 1}]}`, "entry 1: name must be"},
		{"trailing data", `{"locks": []} {}`, "after its JSON object"},
	} {
		_, err := LoadRegistry(strings.NewReader(c.file))
		if pglease.CodeOf(err) != pglease.CodeInvalidArgument || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want InvalidArgument with %q", c.name, err, c.msg)
		}
	}
	_, err := LoadRegistry(nil)
	wantCode(t, err, pglease.CodeInvalidArgument)
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, k := range []Key{Int64(42424242), Int64(-1 << 63), Int64(1<<63 - 1), Pair(1, -2), Pair(-1<<31, 1<<31-1)} {
		got, err := ParseKey(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKey(%q) = %v %v", k.String(), got, err)
		}
	}
	for _, bad := range []string{"", "42", "int64:", "int64:x", "int64:9223372036854775808", "pair:1", "pair:1,2,3", "pair:2147483648,1", "invalid"} {
		if _, err := ParseKey(bad); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
			t.Errorf("ParseKey(%q) = %v", bad, err)
		}
	}
}

// TestInspectNamesDesignLocks: the locks of both designs
// held by other sessions show up in Inspect by their registry names for
// an inspector that loaded the same registry file (as an operator's
// tool in another process does): fixed ids at once, pattern keys once
// the inspector derives them from the input it was given, which never
// appears in what Inspect returns.
func TestInspectNamesDesignLocks(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t, 20*time.Second)
	app := loadDesigns(t) // the application's registry
	// Unique inputs, so parallel tests and runs never share these keys.
	email := fmt.Sprintf("Someone.%d@Example.com", time.Now().UnixNano())
	tenant, date := "tenant-"+strconv.FormatInt(time.Now().UnixNano(), 36), "2025-01-15"

	scheduler := openSession(t, pool, testOpts())
	sched, ok, err := scheduler.TryLock(ctx, Int64(42424242))
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer sched.Release(ctx)
	cleanupKey, err := app.Derive("orphan-cleanup", email)
	if err != nil {
		t.Fatal(err)
	}
	cleaner := openSession(t, pool, testOpts())
	cl, ok, err := cleaner.TryLock(ctx, cleanupKey)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer cl.Release(ctx)
	bookingKey, err := app.Derive("booking", tenant, date)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := XactLock(ctx, tx, bookingKey); err != nil {
		t.Fatal(err)
	}
	var bookingPID int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&bookingPID); err != nil {
		t.Fatal(err)
	}

	ops := loadDesigns(t) // the operator's tool: same file, its own Registry
	names := func() map[Key]string {
		t.Helper()
		infos, err := Inspect(ctx, superConn(t), ops)
		if err != nil {
			t.Fatal(err)
		}
		out := map[Key]string{}
		for _, li := range infos {
			switch {
			case li.Key == Int64(42424242) && li.PID == scheduler.BackendPID(),
				li.Key == cleanupKey && li.PID == cleaner.BackendPID(),
				li.Key == bookingKey && li.PID == bookingPID:
				out[li.Key] = li.Name
			}
			if s := fmt.Sprintf("%+v %#v", li, li); strings.Contains(strings.ToLower(s), strings.ToLower(email)) || strings.Contains(s, tenant) {
				t.Fatalf("Inspect output shows an input: %s", s)
			}
		}
		return out
	}
	got := names()
	if len(got) != 3 || got[Int64(42424242)] != "idempotency-cleanup" || got[cleanupKey] != "" || got[bookingKey] != "" {
		t.Fatalf("before deriving: %v, want the fixed id named and the others found but unnamed", got)
	}
	if _, err := ops.Derive("orphan-cleanup", strings.ToUpper(email)); err != nil { // as typed into a support ticket
		t.Fatal(err)
	}
	if _, err := ops.Derive("booking", tenant, date); err != nil {
		t.Fatal(err)
	}
	got = names()
	if got[Int64(42424242)] != "idempotency-cleanup" || got[cleanupKey] != "orphan-cleanup" || got[bookingKey] != "booking" {
		t.Fatalf("after deriving: %v", got)
	}
}
