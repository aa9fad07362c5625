package storetest

import (
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
)

// atLimit sets key's counter to f, or skips the test when the harness
// cannot.
func (e *env) atLimit(key string, f pglease.Fence) {
	e.t.Helper()
	if e.SetFence == nil {
		e.t.Skip("the harness cannot set a fence counter")
	}
	e.SetFence(e.t, key, f)
}

// internal checks that err is CodeInternal (the fence overflow).
func (e *env) internal(what string, err error) {
	e.t.Helper()
	if pglease.CodeOf(err) != pglease.CodeInternal {
		e.t.Fatalf("%s: want an Internal error (fence overflow), got %v", what, err)
	}
}

var fenceLimitTests = []test{
	{"Exclusive", func(t *testing.T, e *env) {
		e.atLimit("last", keys.FenceMax-1)
		if g := e.mustAcquire(e.Store, "last", long); g.Fence != keys.FenceMax {
			t.Fatalf("grant at FenceMax-1: fence %v, want FenceMax", g.Fence)
		}
		e.atLimit("k", keys.FenceMax)
		res, err := e.Store.AcquireMany(e.ctx(), []store.AcquireRequest{{Key: "k", TTL: long}, {Key: "free", TTL: long}})
		if err != nil || len(res) != 2 {
			t.Fatalf("AcquireMany = %+v, %v", res, err)
		}
		if res[0].OK {
			t.Fatalf("grant past FenceMax: %+v", res[0])
		}
		e.internal("the item at the limit", res[0].Err)
		if !res[1].OK {
			t.Fatalf("the other item of the batch: %+v", res[1])
		}
		if info, _ := e.Store.LookupByKey(e.ctx(), "k"); info != nil {
			t.Fatalf("a lease at the limit: %v", info)
		}
	}},
	{"Shared", func(t *testing.T, e *env) {
		e.atLimit("k", keys.FenceMax)
		res, err := e.Store.AcquireSharedMany(e.ctx(), []store.SharedRequest{{Key: "k", TTL: long, Limit: 2}, {Key: "k", TTL: long}})
		if err != nil || len(res) != 2 {
			t.Fatalf("AcquireSharedMany = %+v, %v", res, err)
		}
		e.internal("a permit at the limit", res[0].Err)
		// A reader takes no fence of its own.
		if !res[1].OK || res[1].Fence != keys.FenceMax {
			t.Fatalf("a reader at the limit: %+v, want granted with the counter's fence", res[1])
		}
	}},
	{"Set", func(t *testing.T, e *env) {
		e.atLimit("b", keys.FenceMax)
		out, err := e.Store.AcquireSets(e.ctx(), [][]store.AcquireRequest{{{Key: "a", TTL: long}, {Key: "b", TTL: long}}})
		if err != nil || len(out) != 1 || len(out[0]) != 2 {
			t.Fatalf("AcquireSets = %+v, %v", out, err)
		}
		if out[0][0].OK || out[0][1].OK {
			t.Fatalf("a set with a key at the limit: %+v, want nothing granted", out[0])
		}
		e.internal("the set's item at the limit", out[0][1].Err)
		if st := e.snapshot(e.Store, "a"); st.Counter != 0 {
			t.Fatalf("the refused set wrote a's counter: %v", st.Counter)
		}
	}},
	{"HandOff", func(t *testing.T, e *env) {
		e.atLimit("k", keys.FenceMax-1)
		old := e.mustAcquire(e.Store, "k", long)
		res, err := e.Store.HandOff(e.ctx(), []store.HandOffRequest{{Old: old.LockID, Key: "k", TTL: long}})
		if err != nil || len(res) != 1 {
			t.Fatalf("HandOff = %+v, %v", res, err)
		}
		if !res[0].Released || res[0].OK {
			t.Fatalf("handoff at the limit: %+v, want the old lease released and nothing granted", res[0])
		}
		e.internal("the handoff's grant", res[0].Err)
		if info, _ := e.Store.LookupByKey(e.ctx(), "k"); info != nil {
			t.Fatalf("the key after a handoff at the limit: %v, want free", info)
		}
	}},
}
