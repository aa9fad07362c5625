package kernel

import (
	"strings"
	"testing"
)

// TestLoopInvariants: checkInvariants accepts a consistent state and
// names what an inconsistent one breaks (the tests' Managers run it after
// every event: run, mustHold).
func TestLoopInvariants(t *testing.T) {
	mk := func() (*LoopState, *KeyState) {
		st := &LoopState{keys: map[string]*KeyState{}, byHash: map[string]*KeyState{}, held: map[*holding]struct{}{}, sets: map[*AcquireReq]*setWait{}}
		ks := &KeyState{Key: "k", hash: "h"}
		st.keys["k"] = ks
		return st, ks
	}
	st, ks := mk()
	ks.queue = []*AcquireReq{{Key: "k"}}
	st.byHash["h"] = ks
	st.waiting = 1
	if err := st.checkInvariants(); err != nil {
		t.Fatalf("consistent state: %v", err)
	}
	if ks.idle() {
		t.Fatal("a key with a waiter is idle")
	}
	for _, c := range []struct {
		name, want string
		break_     func(st *LoopState, ks *KeyState)
	}{
		{"waiter not in byHash", "byHash", func(st *LoopState, ks *KeyState) { delete(st.byHash, "h") }},
		{"waiting miscounted", "waiting", func(st *LoopState, ks *KeyState) { st.waiting = 2 }},
		{"a try queued", "not a waiting caller", func(st *LoopState, ks *KeyState) { ks.queue[0].Try = true }},
		{"negative releases", "negative", func(st *LoopState, ks *KeyState) { ks.releasing = -1 }},
		{"holder not held", "holder", func(st *LoopState, ks *KeyState) { ks.holder = &holding{ks: ks, lock: &Hold{}} }},
		{"shared count", "shared holds", func(st *LoopState, ks *KeyState) { ks.nShared = 1 }},
		{"foreign attempt", "attempt", func(st *LoopState, ks *KeyState) { ks.attempt = &Attempt{Ks: &KeyState{}} }},
	} {
		st, ks := mk()
		ks.queue = []*AcquireReq{{Key: "k"}}
		st.byHash["h"] = ks
		st.waiting = 1
		c.break_(st, ks)
		err := st.checkInvariants()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
	// Predicates.
	st, ks = mk()
	if !ks.idle() || ks.busy() || ks.held() {
		t.Errorf("an empty key: idle %v busy %v held %v", ks.idle(), ks.busy(), ks.held())
	}
	ks.releasing = 1
	if ks.idle() || !ks.busy() || ks.held() {
		t.Errorf("a key being released: idle %v busy %v held %v", ks.idle(), ks.busy(), ks.held())
	}
	ks.releasing, ks.nShared = 0, 1
	if ks.idle() || ks.busy() || !ks.held() {
		t.Errorf("a key held shared: idle %v busy %v held %v", ks.idle(), ks.busy(), ks.held())
	}
	_ = st
}
