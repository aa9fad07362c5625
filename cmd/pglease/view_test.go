package main

import (
	"bytes"
	"encoding/json"
	"regexp"
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
		`"holder_table":false,"shared_table":false,"mark_columns":false,"release_trigger":false,"notify_channel":"","missing":null,` +
		`"queue_table":false},"leases":{"total":0,"live":0,"rows":[]},"shared":{"live":0,"keys":0,"rows":[]},"marks":[],"waiting_managers":[],` +
		`"watching_managers":[],"guarded_tables":[],"advisory":[],"queue":{"tickets":0,"keys":0,"rows":[]}}`
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
		`"managers_waiting":0,"managers_watching":0,"lock_delay_ms":0,"fence_counter":"000000000000007","queued":0},"fence_counter":"000000000000007",` +
		`"shared":{"key_hash":"` + h + `","key":"k","kind":"none","count":0,"limit":0,"acquires_waiting":0,"holders":[],"queued":0},` +
		`"marks":[],"acquires_in_progress":[],"waiting_manager_pids":[],"watching_manager_pids":[],"guarded_tables":[],` +
		`"schema":{"version":0,"needs":0,"current":false,"lock_table":false,"fence_table":false,"holder_table":false,"shared_table":false,` +
		`"mark_columns":false,"release_trigger":false,"notify_channel":"","missing":null,"queue_table":false},"queue":[]}`
	if string(b) != inspect {
		t.Errorf("inspect --json:\n got %s\nwant %s", b, inspect)
	}
	// A key's fair queue: one key's tickets, in order.
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	q := queueSection{Tickets: 2, Keys: 1, Rows: []queueKeyView{{KeyHash: "h", Length: 2, Tickets: []queuedView{
		{Position: 1, Holder: "a", Mode: "exclusive", Since: since, WaitingMs: 2000, ExpiresInMs: 900, LockIDHash: "i1"},
		{Position: 2, Holder: "b", Mode: "permit", Limit: 3, Since: since, WaitingMs: 1000, ExpiresInMs: 800, LockIDHash: "i2"}}}}}
	if b, err = json.Marshal(q); err != nil {
		t.Fatal(err)
	}
	queue := `{"tickets":2,"keys":1,"rows":[{"key_hash":"h","length":2,"tickets":[` +
		`{"position":1,"holder":"a","mode":"exclusive","since":"2026-01-02T03:04:05Z","waiting_ms":2000,"expires_in_ms":900,"lock_id_hash":"i1"},` +
		`{"position":2,"holder":"b","mode":"permit","limit":3,"since":"2026-01-02T03:04:05Z","waiting_ms":1000,"expires_in_ms":800,"lock_id_hash":"i2"}]}]}`
	if string(b) != queue {
		t.Errorf("status --json's queue:\n got %s\nwant %s", b, queue)
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
	v.Schema.QueueTable = true
	v.Queue = queueSection{Tickets: 3, Keys: 1, Rows: []queueKeyView{{KeyHash: "ccc", Length: 3, Tickets: []queuedView{
		{Position: 1, Holder: "w[1]@a", Mode: "exclusive", WaitingMs: 3000, ExpiresInMs: 2000},
		{Position: 2, Holder: "w[2]@b", Mode: "reader", WaitingMs: 2000, ExpiresInMs: 2500},
		{Position: 3, Holder: "w[3]@c", Mode: "permit", Limit: 2, WaitingMs: 1000, ExpiresInMs: 2900}}}}}
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
		"QUEUE  3 waiting in line for 1 key(s): served in this order",
		"CONTENTION\n  lease ccc: 3 in line (fair queue), longest 3.0s\n  lease aaa: 2 waiting\n" +
			"  lease bbb: a writer waits for the key (exclusive waiting)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("status text lacks %q:\n%s", want, got)
		}
	}
	for _, re := range []string{
		`ccc\s+1 of 3\s+w\[1\]@a\s+exclusive\s+3\.0s ago\s+in 2\.0s`,
		`ccc\s+2 of 3\s+w\[2\]@b\s+reader\s+2\.0s ago\s+in 2\.5s`,
		`ccc\s+3 of 3\s+w\[3\]@c\s+permit \(of 2\)\s+1\.0s ago\s+in 2\.9s`,
	} {
		if !regexp.MustCompile(`(?m)^` + re + `$`).MatchString(got) {
			t.Errorf("no queue line matches %q:\n%s", re, got)
		}
	}
	if !strings.Contains(got, "9 (+3)") || !strings.Contains(got, "2.0s ago") || !strings.Contains(got, "in 1m00s") {
		t.Errorf("lease row: want fence 9 (+3), acquired 2.0s ago, expires in 1m00s:\n%s", got)
	}
}
