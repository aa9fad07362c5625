package advisory

import (
	"strconv"
	"strings"
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
)

// fnvCollision brute-forces two distinct inputs with the same FNV-1a-32
// (the birthday bound says about 77k inputs).
func fnvCollision(t *testing.T) (a, b string) {
	t.Helper()
	seen := make(map[int32]string, 1<<17)
	for i := range 1 << 20 {
		s := "tenant-" + strconv.Itoa(i)
		h := fnv1a32Sum(s)
		if prev, ok := seen[h]; ok {
			return prev, s
		}
		seen[h] = s
	}
	t.Fatal("no FNV-1a-32 collision in 2^20 inputs")
	return "", ""
}

func TestRegistryRejectsRealFNVCollision(t *testing.T) {
	t.Parallel()
	a, b := fnvCollision(t)
	ka, _ := FNV1a32(a)
	kb, _ := FNV1a32(b)
	if a == b || ka != kb {
		t.Fatalf("not a collision: %q %q", a, b)
	}
	t.Logf("collision: %q and %q → %v", a, b, ka)

	t.Run("fixed", func(t *testing.T) {
		r := NewRegistry()
		if err := r.Fixed("booking", ka, ""); err != nil {
			t.Fatal(err)
		}
		err := r.Fixed("balance", kb, "")
		wantCode(t, err, pglease.CodeInvalidArgument)
	})
	t.Run("patterns", func(t *testing.T) {
		r := NewRegistry()
		p1, err := r.Pattern("booking", "tenant-{n}", FNV1a32, "")
		if err != nil {
			t.Fatal(err)
		}
		p2, err := r.Pattern("balance", "{x}", FNV1a32, "")
		if err != nil {
			t.Fatal(err)
		}
		got, err := p1.Key(strings.TrimPrefix(a, "tenant-"))
		if err != nil || got != ka {
			t.Fatalf("p1.Key = %v, %v", got, err)
		}
		if again, err := p1.Key(strings.TrimPrefix(a, "tenant-")); err != nil || again != ka {
			t.Fatalf("same input again: %v, %v", again, err)
		}
		_, err = p2.Key(b)
		wantCode(t, err, pglease.CodeInvalidArgument)
		if strings.Contains(err.Error(), b) {
			t.Errorf("error echoes the input: %v", err)
		}
		if n, ok := r.Name(ka); !ok || n != "booking" {
			t.Errorf("Name = %q %v", n, ok)
		}
		// A fixed id equal to a derived one is refused too.
		wantCode(t, r.Fixed("late", kb, ""), pglease.CodeInvalidArgument)
	})
}

func TestRegistryRules(t *testing.T) {
	t.Parallel()
	r := NewRegistry()
	if err := r.Fixed("idempotency-cleanup", Int64(42424242), "IdempotencyService scheduler"); err != nil {
		t.Fatal(err)
	}
	// One name in two key spaces.
	wantCode(t, r.Fixed("idempotency-cleanup", Pair(0, 42424242), ""), pglease.CodeInvalidArgument)
	// Two names, one id.
	wantCode(t, r.Fixed("other", Int64(42424242), ""), pglease.CodeInvalidArgument)
	// The same bits in the other space are a different lock: allowed.
	if err := r.Fixed("pair-lock", Pair(0, 42424242), ""); err != nil {
		t.Fatal(err)
	}
	wantCode(t, r.Fixed("", Int64(1), ""), pglease.CodeInvalidArgument)
	wantCode(t, r.Fixed("bad\nname", Int64(1), ""), pglease.CodeInvalidArgument)
	wantCode(t, r.Fixed("zero", Key{}, ""), pglease.CodeInvalidArgument)
	for _, tmpl := range []string{"", "no placeholder", "{a", "a}", "{}", "{a{b}}"} {
		if _, err := r.Pattern("p"+tmpl, tmpl, FNV1a32, ""); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
			t.Errorf("template %q: %v", tmpl, err)
		}
	}
	if _, err := r.Pattern("nil-hash", "{a}", nil, ""); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Errorf("nil hash: %v", err)
	}

	// Injected hash: keys in two spaces from one pattern; a derived key
	// equal to a fixed one.
	flip := false
	mixed, err := r.Pattern("mixed", "{a}", func(string) (Key, error) {
		flip = !flip
		if flip {
			return Int64(7), nil
		}
		return Pair(0, 7), nil
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mixed.Key("x"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, func() error { _, err := mixed.Key("y"); return err }(), pglease.CodeInvalidArgument)
	hitsFixed, _ := r.Pattern("hits-fixed", "{a}", func(string) (Key, error) { return Int64(42424242), nil }, "")
	wantCode(t, func() error { _, err := hitsFixed.Key("x"); return err }(), pglease.CodeInvalidArgument)

	booking, err := r.Pattern("booking", "{tenantId}:{date}", FNV1a32, "BookingRepository")
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, func() error { _, err := booking.Key("t1"); return err }(), pglease.CodeInvalidArgument)
	k, err := booking.Key("tenant-1", "2025-01-15")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := FNV1a32("tenant-1:2025-01-15")
	if k != want {
		t.Errorf("booking.Key = %v, want %v", k, want)
	}
	// Registering a fixed id that a pattern derived is refused.
	wantCode(t, r.Fixed("late", k, ""), pglease.CodeInvalidArgument)

	var names []string
	for _, e := range r.List() {
		names = append(names, e.Name)
	}
	if got := strings.Join(names, ","); got != "booking,hits-fixed,idempotency-cleanup,mixed,pair-lock" {
		t.Errorf("List names = %s", got)
	}
	if n, ok := r.Name(Int64(42424242)); !ok || n != "idempotency-cleanup" {
		t.Errorf("Name = %q %v", n, ok)
	}
	if _, ok := r.Name(Int64(1)); ok {
		t.Error("Name of an unknown key")
	}
}

// Pair keys in the Managers' waiter-lock space are refused; the constant
// here is pg's.
func TestRegistryRefusesWaiterLockSpace(t *testing.T) {
	if waiterLockClass != store.WaiterLockClass {
		t.Fatalf("waiterLockClass %d, store.WaiterLockClass %d", waiterLockClass, store.WaiterLockClass)
	}
	r := NewRegistry()
	if err := r.Fixed("waiter", Pair(store.WaiterLockClass, 5), ""); pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Fatalf("Fixed in the waiter-lock space: %v", err)
	}
	if err := r.Fixed("neighbour", Pair(store.WaiterLockClass+1, 5), ""); err != nil {
		t.Fatal(err)
	}
	if err := r.Fixed("bigint", Int64(int64(store.WaiterLockClass)<<32|5), ""); err != nil {
		t.Fatalf("the bigint space is another lock space: %v", err)
	}
}
