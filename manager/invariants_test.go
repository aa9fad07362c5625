package manager

import (
	"strings"
	"testing"
)

// TestLoopInvariants: checkInvariants accepts a consistent state and
// names what an inconsistent one breaks (the tests' Managers run it after
// every event: run, mustHold).
func TestLoopInvariants(t *testing.T) {
	mk := func() (*loopState, *keyState) {
		st := &loopState{keys: map[string]*keyState{}, byHash: map[string]*keyState{}, held: map[*holding]struct{}{}, sets: map[*acquireReq]*setWait{}}
		ks := &keyState{key: "k", hash: "h"}
		st.keys["k"] = ks
		return st, ks
	}
	st, ks := mk()
	ks.queue = []*acquireReq{{key: "k"}}
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
		break_     func(st *loopState, ks *keyState)
	}{
		{"waiter not in byHash", "byHash", func(st *loopState, ks *keyState) { delete(st.byHash, "h") }},
		{"waiting miscounted", "waiting", func(st *loopState, ks *keyState) { st.waiting = 2 }},
		{"a try queued", "not a waiting caller", func(st *loopState, ks *keyState) { ks.queue[0].try = true }},
		{"negative releases", "negative", func(st *loopState, ks *keyState) { ks.releasing = -1 }},
		{"holder not held", "holder", func(st *loopState, ks *keyState) { ks.holder = &holding{ks: ks, lock: &Hold{}} }},
		{"shared count", "shared holds", func(st *loopState, ks *keyState) { ks.nShared = 1 }},
		{"foreign attempt", "attempt", func(st *loopState, ks *keyState) { ks.attempt = &attempt{ks: &keyState{}} }},
	} {
		st, ks := mk()
		ks.queue = []*acquireReq{{key: "k"}}
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
