package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// The JSON of status and inspect is what scripts read: its field names
// and their order are fixed. (An empty snapshot shows every field that is
// not omitted when empty.)
func TestJSONShape(t *testing.T) {
	v := newSnapshot()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	const status = `{"time":"0001-01-01T00:00:00Z","schema":{"version":0,"needs":0,"current":false,"lock_table":false,"fence_table":false,` +
		`"holder_table":false,"shared_table":false,"mark_columns":false,"release_trigger":false,"notify_channel":"","missing":null},` +
		`"leases":{"total":0,"live":0,"rows":[]},"shared":{"live":0,"keys":0,"rows":[]},"marks":[],"waiting_managers":[],` +
		`"watching_managers":[],"guarded_tables":[],"advisory":[]}`
	if string(b) != status {
		t.Errorf("status --json of an empty snapshot:\n got %s\nwant %s", b, status)
	}
	counter := "000000000000007"
	v.Leases.Rows = append(v.Leases.Rows, leaseView{KeyHash: "h", Holder: "x", Fence: "000000000000007"})
	b, err = json.Marshal(newKeyView(v, "k", &counter, 1, true))
	if err != nil {
		t.Fatal(err)
	}
	h := pglease.HashKey("k")
	inspect := `{"key_hash":"` + h + `","key":"k","lease":{"key_hash":"h","holder":"x","fence":"000000000000007",` +
		`"acquired_at":"0001-01-01T00:00:00Z","expires_at":"0001-01-01T00:00:00Z","expires_in_ms":0,"live":false,"acquires_waiting":0,` +
		`"managers_waiting":0,"managers_watching":0,"lock_delay_ms":0,"fence_counter":"000000000000007"},"fence_counter":"000000000000007",` +
		`"shared":{"key_hash":"` + h + `","key":"k","kind":"none","count":0,"limit":0,"acquires_waiting":0,"holders":[]},` +
		`"marks":[],"acquires_in_progress":[],"waiting_manager_pids":[],"watching_manager_pids":[],"guarded_tables":[],` +
		`"schema":{"version":0,"needs":0,"current":false,"lock_table":false,"fence_table":false,"holder_table":false,"shared_table":false,` +
		`"mark_columns":false,"release_trigger":false,"notify_channel":"","missing":null}}`
	if string(b) != inspect {
		t.Errorf("inspect --json:\n got %s\nwant %s", b, inspect)
	}
}

// The text view is a function of the snapshot alone: no database needed.
// Contention lists the most waited-for key first (a waiting writer counts
// one), and a lease's fence shows how far it moved since the last refresh.
func TestStatusTextView(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := newSnapshot()
	v.Time = now
	v.Schema = schemaView{Version: 4, Needs: 4, Current: true, LockTable: true, FenceTable: true, HolderTable: true, SharedTable: true,
		MarkColumns: true, NotifyChannel: "pglease_release", Missing: []string{}}
	v.Leases.Total, v.Leases.Live = 2, 1
	v.Leases.Rows = []leaseView{{KeyHash: "aaa", Holder: "billing[1]@web-1", Fence: "000000000000009", AcquiredAt: now.Add(-2 * time.Second),
		ExpiresAt: now.Add(time.Minute), ExpiresInMs: 60000, Live: true, AcquiresWaiting: 2}}
	v.Marks = []markView{{KeyHash: "bbb", Mark: markExclusiveWaiting, Until: now.Add(time.Second), InMs: 1000}}
	v.acquiresWaiting = map[string]int{"aaa": 2}
	var out bytes.Buffer
	printStatus(&out, v, map[string]string{"aaa": "000000000000006"})
	got := out.String()
	for _, want := range []string{
		"pglease status  2026-01-02 03:04:05 UTC  schema v4 (current)\n",
		"RELEASE TRIGGER  not installed for channel pglease_release",
		"LEASES  1 live, 1 expired  (showing 1)\n",
		"SHARED HOLDS  none\n",
		"MARKS  1: keys held off",
		"GUARDED TABLES  none",
		"ADVISORY LOCKS  0 held, 0 waiting\n",
		"CONTENTION\n  lease aaa: 2 waiting\n  lease bbb: a writer waits for the key (exclusive waiting)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("status text lacks %q:\n%s", want, got)
		}
	}
	if !strings.Contains(got, "9 (+3)") || !strings.Contains(got, "2.0s ago") || !strings.Contains(got, "in 1m00s") {
		t.Errorf("lease row: want fence 9 (+3), acquired 2.0s ago, expires in 1m00s:\n%s", got)
	}
}
