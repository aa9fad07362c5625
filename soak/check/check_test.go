package check

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/soak/driver"
	"github.com/pglease/pglease/soak/event"
	"github.com/pglease/pglease/soak/worker"
)

// The checks on synthetic runs: a clean history passes every check, and
// each check fails on a history with the one defect it is there for. (The
// end-to-end proof, a broken worker per check, is TestControls.)

const sec = int64(time.Second)

// hist is a synthetic run: two workers taking key 0 in turn, with
// advisory locks, a blackhole on worker 1, and a clean stop. Server
// time = monotonic time (offset 0).
type hist struct {
	meta      driver.Meta
	final     driver.Final
	drv       []event.Event
	wlog      map[string][]event.Event
	locks     []lockLogRow
	res       []resLogRow
	sharedLog []sharedLogRow
	queueLog  []queueLogRow
	stderr    map[string]string
	seq       int64
}

func (h *hist) w(name string, e event.Event) { h.wlog[name] = append(h.wlog[name], e) }

func (h *hist) lock(tg string, fence, atNs, expMs int64, id string) {
	h.seq++
	h.locks = append(h.locks, lockLogRow{Seq: h.seq, Tg: tg, UserKey: "soak:0", IDHash: id, OldIDHash: id,
		Fence: fence, AcquiredMs: atNs / 1e6, ExpiresMs: expMs, AtUs: atNs / 1000})
}

func (h *hist) resRow(oldF, newF, oldC, newC, op, atNs int64) {
	h.seq++
	of := &oldF
	if oldF == 0 {
		of = nil
	}
	h.res = append(h.res, resLogRow{Seq: h.seq, Key: 0, OldFence: of, NewFence: &newF, OldCounter: oldC, NewCounter: newC, Op: &op, AtUs: atNs / 1000})
}

// grant adds one full lease cycle of worker w on key 0 at time t (ns):
// acquire, claim, read, write, release; held 100 ms.
func (h *hist) grant(w int, fence, t int64) {
	name := fmt.Sprintf("w%d.0.jsonl", w)
	op := int64(w+1)<<40 | fence*10
	id := fmt.Sprintf("id%d", fence)
	ms := int64(time.Millisecond)
	h.w(name, event.Event{T: t, E: event.AcqCall, W: w, O: op})
	h.lock("I", fence, t+ms, (t+ms)/1e6+1000, id)
	h.w(name, event.Event{T: t + 2*ms, E: event.AcqOK, W: w, O: op, F: fence, V: (t + ms) / 1e6, V2: (t+ms)/1e6 + 1000})
	// claim
	h.w(name, event.Event{T: t + 3*ms, E: event.ResCall, W: w, O: op + 1, P: op, F: fence, M: "claim"})
	h.resRow(fence-1, fence, fence-1, fence-1, op+1, t+4*ms)
	h.w(name, event.Event{T: t + 5*ms, E: event.ResRet, W: w, O: op + 1, P: op, F: fence, C: "ok"})
	// read
	h.w(name, event.Event{T: t + 6*ms, E: event.ResCall, W: w, O: op + 2, P: op, F: fence, M: "read"})
	h.w(name, event.Event{T: t + 7*ms, E: event.ResRet, W: w, O: op + 2, P: op, F: fence, C: "ok", V: fence - 1, V2: fence})
	// write
	h.w(name, event.Event{T: t + 8*ms, E: event.ResCall, W: w, O: op + 3, P: op, F: fence, M: "write", V: fence})
	h.resRow(fence, fence, fence-1, fence, op+3, t+9*ms)
	h.w(name, event.Event{T: t + 10*ms, E: event.ResRet, W: w, O: op + 3, P: op, F: fence, C: "ok"})
	// release
	h.w(name, event.Event{T: t + 100*ms, E: event.RelCall, W: w, O: op, F: fence})
	h.lock("D", fence, t+101*ms, (t+ms)/1e6+1000, id)
	h.w(name, event.Event{T: t + 101*ms, E: event.End, W: w, O: op, F: fence, C: "Released"})
	h.w(name, event.Event{T: t + 102*ms, E: event.RelRet, W: w, O: op, F: fence})
}

func newHist() *hist {
	h := &hist{wlog: map[string][]event.Event{}, stderr: map[string]string{}}
	h.meta = driver.Meta{Options: driver.Options{Workers: 2, Keys: 1, AdvKeys: 1, LeaseG: 1, AdvG: 1,
		TTL: time.Second, AcquireTimeout: 3 * time.Second, CloseTimeout: 5 * time.Second},
		StatementTO: 5 * time.Second, RetryCap: 2 * time.Second, ProbeBound: 2 * time.Second, AdvServerTO: 25 * time.Second,
		StopAt: 20 * sec}
	h.drv = []event.Event{
		{T: sec / 2, E: event.Offset, W: -1, V: 0},
		{T: 2 * sec, E: event.Fault, W: 1, O: 1, M: driver.FBlackhole, V: 2 * sec},
		{T: 4 * sec, E: event.Heal, W: 1, O: 1, M: driver.FBlackhole},
		{T: 20 * sec, E: event.StopAll, W: -1},
		{T: 20*sec + sec/2, E: event.Died, W: 0, C: "0", M: "killed"},
		{T: 20*sec + sec/2, E: event.Died, W: 1, C: "0", M: "killed"},
		{T: 21 * sec, E: event.Offset, W: -1, V: 0},
	}
	for w := range 2 {
		name := fmt.Sprintf("w%d.0.jsonl", w)
		h.w(name, event.Event{T: sec, E: event.Ready, W: w})
	}
	fence := int64(0)
	for t := sec; t < 19*sec; t += sec / 2 {
		fence++
		h.grant(int(fence%2), fence, t)
	}
	// advisory: worker 0 then worker 1, alternating, every second
	for i, t := 0, sec; t < 19*sec; i, t = i+1, t+sec {
		w := i % 2
		name := fmt.Sprintf("w%d.0.jsonl", w)
		op := int64(w+1)<<40 | int64(1000+i)
		h.w(name, event.Event{T: t + 200*int64(time.Millisecond), E: event.AdvOK, W: w, O: op})
		h.w(name, event.Event{T: t + 300*int64(time.Millisecond), E: event.AdvRel, W: w, O: op})
		h.w(name, event.Event{T: t + 301*int64(time.Millisecond), E: event.AdvEnd, W: w, O: op, C: "Released"})
		h.w(name, event.Event{T: t + 302*int64(time.Millisecond), E: event.AdvRet, W: w, O: op})
	}
	for w := range 2 {
		name := fmt.Sprintf("w%d.0.jsonl", w)
		h.w(name, event.Event{T: 20*sec + 1000, E: event.CloseRet, W: w, V: int64(10 * time.Millisecond)})
	}
	h.final = driver.Final{Fences: map[string]int64{"soak:0": fence}, Counters: map[int]int64{0: fence}, ResFences: map[int]int64{0: fence}}
	return h
}

func (h *hist) write(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	put := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lines := func(name string, rows []any) {
		var b strings.Builder
		for _, r := range rows {
			j, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(j)
			b.WriteByte('\n')
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("meta.json", h.meta)
	put("final.json", h.final)
	var rows []any
	for _, e := range h.drv {
		rows = append(rows, e)
	}
	lines("driver.jsonl", rows)
	for name, evs := range h.wlog {
		rows = rows[:0]
		for _, e := range evs {
			rows = append(rows, e)
		}
		lines(name, rows)
	}
	rows = rows[:0]
	for _, r := range h.locks {
		rows = append(rows, r)
	}
	lines("lock_log.jsonl", rows)
	rows = rows[:0]
	for _, r := range h.res {
		rows = append(rows, r)
	}
	lines("res_log.jsonl", rows)
	if len(h.sharedLog) > 0 {
		rows = rows[:0]
		for _, r := range h.sharedLog {
			rows = append(rows, r)
		}
		lines("shared_log.jsonl", rows)
	}
	if len(h.queueLog) > 0 {
		rows = rows[:0]
		for _, r := range h.queueLog {
			rows = append(rows, r)
		}
		lines("queue_log.jsonl", rows)
	}
	for name, s := range h.stderr {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func runChecks(t *testing.T, h *hist) *Report {
	t.Helper()
	rep, err := Run(h.write(t))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestCleanHistoryPasses(t *testing.T) {
	rep := runChecks(t, newHist())
	for _, c := range rep.Checks {
		if c.Failed > 0 {
			t.Errorf("%s failed on a clean history: %v", c.Name, c.Examples)
		}
	}
	for _, name := range []string{CFences, CGrantsReal, CRegister, CWrites, CLinear, CHolderEnded, CAdvisory, CRecovery, CStarve, CClose, CLeftovers} {
		if rep.Check(name).Checked == 0 {
			t.Errorf("%s checked nothing", name)
		}
	}
	if !strings.Contains(rep.Markdown(), "| blackhole | 1 |") {
		t.Errorf("report lacks the blackhole row:\n%s", rep.Markdown())
	}
}

// A local handoff (one UPDATE releasing the holder's lockId and granting
// the key to the next waiter) ends a lease like a release: a lease handed
// over at the stop is not left behind.
func TestHandOffIsARelease(t *testing.T) {
	h := newHist()
	f := h.final.Fences["soak:0"] + 1
	h.grant(int(f%2), f, 19*sec+sec/2)
	name, _ := h.find(event.AcqOK, f)
	// the holder released, and the Manager handed the key over to a waiter
	// that had left (fence f+1), then released that grant
	last := &h.locks[len(h.locks)-1] // fence f's D row
	at := last.AtUs * 1000
	*last = lockLogRow{Seq: last.Seq, Tg: "U", UserKey: "soak:0", IDHash: "idnext", OldIDHash: last.IDHash, Fence: f + 1, OldFence: f,
		AcquiredMs: at / 1e6, ExpiresMs: at/1e6 + 1000, AtUs: at / 1000}
	h.lock("D", f+1, at+int64(time.Millisecond), at/1e6+1000, "idnext")
	h.final.Fences["soak:0"] = f + 1
	h.final.Counters[0] = f
	h.meta.StopAt = h.wlog[name][len(h.wlog[name])-3].T - 1 // the stop came while fence f was held
	rep := runChecks(t, h)
	for _, c := range rep.Checks {
		if c.Failed > 0 {
			t.Errorf("%s failed: %v", c.Name, c.Examples)
		}
	}
	if rep.Check(CLeftovers).Checked < 3 {
		t.Errorf("nothing-left did not check the handed-over lease")
	}
}

// findGrant returns the worker log name and index of the AcqOK with fence f.
func (h *hist) find(kind string, f int64) (string, int) {
	for name, evs := range h.wlog {
		for i, e := range evs {
			if e.E == kind && e.F == f {
				return name, i
			}
		}
	}
	panic("not found")
}

func TestEachCheckFails(t *testing.T) {
	ms := int64(time.Millisecond)
	cases := []struct {
		check string
		mut   func(h *hist)
	}{
		{CFences, func(h *hist) { // the server grants fence 5 twice
			for i := range h.locks {
				if h.locks[i].Fence == 6 {
					h.locks[i].Fence = 5
				}
			}
		}},
		{CFences, func(h *hist) { // a client gets a fence lower than one granted before its call
			name, i := h.find(event.AcqOK, 8)
			h.wlog[name][i].F = 3
		}},
		{CGrantsReal, func(h *hist) { // a grant the server never committed
			h.grant(0, 999, 19*sec+sec/4)
			h.locks = h.locks[:len(h.locks)-2]
		}},
		{CRegister, func(h *hist) { // an older fence accepted after a newer one
			h.resRow(10, 4, 9, 9, 12345, 19*sec)
			h.wlog["w0.0.jsonl"] = append(h.wlog["w0.0.jsonl"], event.Event{T: 19*sec - 1, E: event.ResCall, W: 0, O: 12345, M: "claim", F: 4})
		}},
		{CRegister, func(h *hist) { // a lost update
			h.res[len(h.res)-1].NewCounter += 1
		}},
		{CWrites, func(h *hist) { // the worker was told "refused", the server applied it
			name, i := h.find(event.ResRet, 7)
			h.wlog[name][i].C = "refused"
		}},
		{CWrites, func(h *hist) { // the worker was told "ok", the server has no such write
			h.res = h.res[:len(h.res)-1]
			h.final.Counters[0]--
		}},
		{CLinear, func(h *hist) { // a read that returns a value never written
			for name, evs := range h.wlog {
				for i, e := range evs {
					if e.E == event.ResRet && e.F == 9 && e.V2 == 9 {
						h.wlog[name][i].V = 77
					}
				}
			}
		}},
		{CHolderEnded, func(h *hist) { // the holder of fence 4 works on past fence 5's grant
			name, i := h.find(event.RelCall, 4)
			h.wlog[name][i].T += sec
		}},
		{CNoticeTimely, func(h *hist) { // fence 10's holder hears of the loss after the lease expired
			name, _ := h.find(event.AcqOK, 10)
			for i, e := range h.wlog[name] {
				if e.E == event.End && e.F == 10 {
					h.wlog[name][i].C = "LockLost"
					h.wlog[name][i].T = e.T + 2*sec
				}
			}
			for i := range h.locks {
				if h.locks[i].Fence == 10 && h.locks[i].Tg == "D" {
					h.locks[i].AtUs += 3 * sec / 1000
				}
			}
		}},
		{CAdvisory, func(h *hist) { // worker 0 holds advisory key 0 past worker 1's grant
			for i, e := range h.wlog["w0.0.jsonl"] {
				if e.E == event.AdvRel || e.E == event.AdvEnd && e.T < 3*sec {
					h.wlog["w0.0.jsonl"][i].T += sec
				}
			}
		}},
		{CRecovery, func(h *hist) { // worker 1 never gets a lease after its fault
			h.wlog["w1.0.jsonl"] = h.wlog["w1.0.jsonl"][:1]
			h.meta.StopAt = 30 * sec
		}},
		{CStarve, func(h *hist) { // the key is not granted for 19+ s
			h.meta.StopAt = 60 * sec
		}},
		{CClose, func(h *hist) {
			for i, e := range h.wlog["w0.0.jsonl"] {
				if e.E == event.CloseRet {
					h.wlog["w0.0.jsonl"][i].V = int64(30 * time.Second)
				}
			}
		}},
		{CLeftovers, func(h *hist) { h.final.LiveRows = 1 }},
		{CLeftovers, func(h *hist) { // a lease held at the stop that Close did not release
			h.grant(0, 1000, 19*sec+sec/2)
			name, _ := h.find(event.AcqOK, 1000)
			evs := h.wlog[name]
			h.wlog[name] = evs[:len(evs)-3] // no release
			h.locks = h.locks[:len(h.locks)-1]
			h.final.Fences["soak:0"] = 1000
			h.final.Counters[0]++
			h.res[len(h.res)-1].OldCounter = h.res[len(h.res)-3].NewCounter
			h.res[len(h.res)-1].NewCounter = h.res[len(h.res)-1].OldCounter + 1
		}},
		{CCoded, func(h *hist) {
			h.w("w0.0.jsonl", event.Event{T: 5 * sec, E: event.AcqErr, W: 0, C: "uncoded:*errors.errorString"})
		}},
		{CHygiene, func(h *hist) { h.stderr["w0.0.stderr"] = "panic: boom\n" }},
		{CHygiene, func(h *hist) { h.stderr["w1.0.stderr"] = "==================\nWARNING: DATA RACE\n" }},
		{CHygiene, func(h *hist) {
			h.w("w1.0.jsonl", event.Event{T: 21 * sec, E: event.Leak, W: 1, M: "found unexpected goroutines"})
		}},
		{CClock, func(h *hist) { h.drv = append(h.drv, event.Event{T: 22 * sec, E: event.Offset, W: -1, V: 50 * ms}) }},
	}
	for _, c := range cases {
		t.Run(c.check, func(t *testing.T) {
			h := newHist()
			c.mut(h)
			rep := runChecks(t, h)
			if rep.Check(c.check).Failed == 0 {
				t.Errorf("%s did not fail", c.check)
			}
			for _, ch := range rep.Checks {
				if ch.Failed > 0 {
					t.Logf("%s: %v", ch.Name, ch.Examples)
				}
			}
		})
	}
}

// primHist is newHist plus the other primitives: permits of a semaphore
// of 2 and an exclusive grant of its key, readers and a writer of a
// reader-writer key, and a set of two keys.
type primHist struct {
	*hist
	xid int64
}

var (
	semK = worker.SemBase
	rwK  = worker.RWBase
	setA = worker.SetBase
	setB = worker.SetBase + 1
)

func newPrimHist() *primHist {
	h := &primHist{hist: newHist(), xid: 1000}
	h.meta.PrimG, h.meta.SemKeys, h.meta.SemLimit, h.meta.RWKeys, h.meta.SetKeys = 1, 1, 2, 1, 2
	ms := int64(time.Millisecond)
	h.shared(0, semK, event.KindPermit, 2, 1, 2000*ms, 2500*ms)
	h.shared(1, semK, event.KindPermit, 2, 2, 2100*ms, 2600*ms)
	h.excl(0, semK, 3, 3000*ms, 3200*ms, 0)
	h.shared(1, semK, event.KindPermit, 2, 4, 3500*ms, 3700*ms)
	h.shared(0, rwK, event.KindReader, 0, 0, 5000*ms, 5400*ms)
	h.shared(1, rwK, event.KindReader, 0, 0, 5100*ms, 5500*ms)
	h.excl(0, rwK, 1, 6000*ms, 6200*ms, 0)
	h.shared(1, rwK, event.KindReader, 0, 1, 6500*ms, 6700*ms)
	h.set(1, []int{setA, setB}, []int64{1, 1}, 8000*ms, 8300*ms)
	h.final.Fences[worker.KeyName(semK)] = 4
	h.final.Fences[worker.KeyName(rwK)] = 1
	h.final.Fences[worker.KeyName(setA)] = 1
	h.final.Fences[worker.KeyName(setB)] = 1
	return h
}

// sharedRow adds a row of the shared-hold table's audit log.
func (h *primHist) sharedRow(tg string, k, lim int, fence int64, id string, atNs, expMs int64) {
	h.seq++
	h.xid++
	h.sharedLog = append(h.sharedLog, sharedLogRow{Seq: h.seq, Tg: tg, UserKey: worker.KeyName(k), GrantID: id, Lim: lim, Fence: fence,
		AcquiredMs: atNs / 1e6, ExpiresMs: expMs, AtUs: atNs / 1000, Xid: h.xid})
}

// lockRow adds a row of the lock table's audit log for key k.
func (h *primHist) lockRow(tg string, k int, fence int64, id string, atNs, expMs, xid int64) {
	h.seq++
	h.locks = append(h.locks, lockLogRow{Seq: h.seq, Tg: tg, UserKey: worker.KeyName(k), IDHash: id, OldIDHash: id,
		Fence: fence, AcquiredMs: atNs / 1e6, ExpiresMs: expMs, AtUs: atNs / 1000, Xid: xid})
}

// hold logs worker w's client side of a hold of k granted on the server
// at from and released at to: called 1 ms before, returned 1 ms after the
// grant, release called 1 ms before the delete.
func (h *primHist) hold(w, k int, kind string, lim int, fence int64, id string, from, to int64, set int64) int64 {
	name := fmt.Sprintf("w%d.0.jsonl", w)
	ms := int64(time.Millisecond)
	h.seq++
	op := int64(w+1)<<40 | 1<<30 | h.seq
	if set == 0 {
		h.w(name, event.Event{T: from - ms, E: event.AcqCall, W: w, K: k, O: op, M: kind, L: lim})
	}
	h.w(name, event.Event{T: from + ms, E: event.AcqOK, W: w, K: k, O: op, P: set, F: fence, M: kind, L: lim, X: id})
	h.w(name, event.Event{T: to - ms, E: event.RelCall, W: w, K: k, O: op, F: fence})
	h.w(name, event.Event{T: to + ms/2, E: event.End, W: w, K: k, O: op, F: fence, C: "Released"})
	h.w(name, event.Event{T: to + ms, E: event.RelRet, W: w, K: k, O: op, F: fence})
	return op
}

func (h *primHist) shared(w, k int, kind string, lim int, fence, from, to int64) {
	id := fmt.Sprintf("g%d", h.seq+1)
	h.sharedRow("I", k, lim, fence, id, from, from/1e6+1000)
	h.sharedRow("D", k, lim, fence, id, to, from/1e6+1000)
	h.hold(w, k, kind, lim, fence, id, from, to, 0)
}

func (h *primHist) excl(w, k int, fence, from, to int64, set int64) {
	id := fmt.Sprintf("x%d", h.seq+1)
	h.xid++
	h.lockRow("I", k, fence, id, from, from/1e6+1000, h.xid)
	h.xid++
	h.lockRow("D", k, fence, id, to, from/1e6+1000, h.xid)
	h.hold(w, k, event.KindExclusive, 0, fence, "", from, to, set)
}

// set logs an AcquireAll of keys by worker w granted in one transaction
// at from (fences: each key's), released at to.
func (h *primHist) set(w int, keys []int, fences []int64, from, to int64) {
	name := fmt.Sprintf("w%d.0.jsonl", w)
	ms := int64(time.Millisecond)
	h.seq++
	op := int64(w+1)<<40 | 2<<30 | h.seq
	list := make([]string, len(keys))
	for i, k := range keys {
		list[i] = fmt.Sprint(k)
	}
	h.w(name, event.Event{T: from - ms, E: event.SetCall, W: w, O: op, M: strings.Join(list, ",")})
	h.w(name, event.Event{T: from + ms/2, E: event.SetOK, W: w, O: op, V: int64(len(keys)), M: strings.Join(list, ",")})
	h.xid++
	xid := h.xid
	for i, k := range keys {
		id := fmt.Sprintf("s%d-%d", op, i)
		h.lockRow("I", k, fences[i], id, from+int64(i)*1000, from/1e6+1000, xid)
	}
	for i, k := range keys {
		id := fmt.Sprintf("s%d-%d", op, i)
		h.xid++
		h.lockRow("D", k, fences[i], id, to+int64(i)*1000, from/1e6+1000, h.xid)
		h.hold(w, k, event.KindSet, 0, fences[i], "", from, to, op)
	}
}

func TestPrimCleanHistoryPasses(t *testing.T) {
	rep := runChecks(t, newPrimHist().hist)
	for _, c := range rep.Checks {
		if c.Failed > 0 {
			t.Errorf("%s failed on a clean history: %v", c.Name, c.Examples)
		}
	}
	for _, name := range []string{CSemBound, CRWExcl, CSets, CSharedFences} {
		if rep.Check(name).Checked == 0 {
			t.Errorf("%s checked nothing", name)
		}
	}
	if rep.LeaseGrants != 36 || rep.Permits != 3 || rep.Readers != 3 || rep.PrimExclusive != 2 || rep.Sets != 1 || rep.SetLocks != 2 || rep.PermitsMax != 2 {
		t.Errorf("counts: %d lease grants, %d permits, %d readers, %d exclusive, %d sets (%d locks), %d most permits", rep.LeaseGrants,
			rep.Permits, rep.Readers, rep.PrimExclusive, rep.Sets, rep.SetLocks, rep.PermitsMax)
	}
	if md := rep.Markdown(); !strings.Contains(md, "| 3 / 3 | 2 | 3 / 3 | 2 | 1 (2) |") {
		t.Errorf("report lacks the primitives' row:\n%s", md)
	}
}

// Each of the primitives' checks fails on a history with the defect it is
// there for, seen by the server's log or by the holders.
func TestPrimChecksFail(t *testing.T) {
	ms := int64(time.Millisecond)
	cases := []struct {
		check, what string
		mut         func(h *primHist)
	}{
		{CSemBound, "a third permit on the server and its holder", func(h *primHist) {
			h.shared(0, semK, event.KindPermit, 2, 5, 2200*ms, 2400*ms)
		}},
		{CSemBound, "a permit of another limit on the server", func(h *primHist) {
			for i := range h.sharedLog {
				if h.sharedLog[i].Fence == 4 {
					h.sharedLog[i].Lim = 3
				}
			}
		}},
		{CSemBound, "a permit with an exclusive holder, on the server", func(h *primHist) {
			for i := range h.sharedLog {
				if h.sharedLog[i].Fence == 4 && h.sharedLog[i].Tg == "I" {
					h.sharedLog[i].AtUs = 3100 * ms / 1000
				}
			}
		}},
		{CSemBound, "a holder counts a refused permit as held", func(h *primHist) {
			h.hold(0, semK, event.KindPermit, 2, 0, "", 2200*ms, 2400*ms, 0)
		}},
		{CRWExcl, "a reader on the server while the writer holds", func(h *primHist) {
			h.sharedRow("I", rwK, 0, 1, "late", 6100*ms, 7100)
			h.sharedRow("D", rwK, 0, 1, "late", 6150*ms, 7100)
		}},
		{CRWExcl, "a holder treats its reader grant as a writer's", func(h *primHist) {
			for name, evs := range h.wlog {
				for i, e := range evs {
					if e.E == event.AcqOK && e.K == rwK && e.T == 5101*ms {
						h.wlog[name][i].M = event.KindExclusive
					}
				}
			}
		}},
		{CSets, "the set's transaction deleted one of its keys", func(h *primHist) {
			var xid int64
			for i := range h.locks {
				switch {
				case h.locks[i].UserKey == worker.KeyName(setB) && h.locks[i].Tg == "I":
					xid = h.locks[i].Xid
				case h.locks[i].UserKey == worker.KeyName(setB) && h.locks[i].Tg == "D":
					h.locks[i].Xid = xid
				}
			}
		}},
		{CSets, "the holder got one of the two keys it asked for", func(h *primHist) {
			for name, evs := range h.wlog {
				for i, e := range evs {
					if e.E == event.SetOK {
						h.wlog[name][i].V, h.wlog[name][i].M = 1, fmt.Sprint(setA)
					}
				}
			}
		}},
		{CSets, "the set's keys came from two transactions", func(h *primHist) {
			for i := range h.locks {
				if h.locks[i].UserKey == worker.KeyName(setB) && h.locks[i].Tg == "I" {
					h.locks[i].Xid = 5
				}
			}
		}},
		{CSharedFences, "a permit's fence repeats an earlier one", func(h *primHist) {
			for i := range h.sharedLog {
				if h.sharedLog[i].Fence == 4 {
					h.sharedLog[i].Fence = 2
				}
			}
			for name, evs := range h.wlog {
				for i, e := range evs {
					if e.K == semK && e.F == 4 {
						h.wlog[name][i].F = 2
					}
				}
			}
		}},
		{CSharedFences, "a reader's fence is not the last granted", func(h *primHist) {
			for i := range h.sharedLog {
				if h.sharedLog[i].UserKey == worker.KeyName(rwK) && h.sharedLog[i].AtUs == 6500*ms/1000 {
					h.sharedLog[i].Fence = 0
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.check+"/"+c.what, func(t *testing.T) {
			h := newPrimHist()
			c.mut(h)
			rep := runChecks(t, h.hist)
			if rep.Check(c.check).Failed == 0 {
				t.Errorf("%s did not fail", c.check)
			}
			for _, ch := range rep.Checks {
				if ch.Failed > 0 {
					t.Logf("%s: %v", ch.Name, ch.Examples)
				}
			}
		})
	}
}

// revokeHist is newHist with fence 6's lease (worker 0, granted at 3.5 s)
// revoked by the driver 50 ms after its grant; its holder is told 1 ms
// later, stops, and its Release (at 3.6 s) finds the lease gone.
func revokeHist() *hist {
	h := newHist()
	ms := int64(time.Millisecond)
	t := 3500 * ms
	for i := range h.locks {
		if h.locks[i].Fence == 6 && h.locks[i].Tg == "D" {
			h.locks[i].AtUs, h.locks[i].App = (t+50*ms)/1000, driver.RevokerApp
		}
	}
	for i, e := range h.wlog["w0.0.jsonl"] {
		switch {
		case e.E == event.End && e.F == 6:
			h.wlog["w0.0.jsonl"][i].T, h.wlog["w0.0.jsonl"][i].C = t+51*ms, "Revoked"
		case e.E == event.RelRet && e.F == 6:
			h.wlog["w0.0.jsonl"][i].C = "Revoked"
		}
	}
	h.drv = append(h.drv, event.Event{T: t + 60*ms, E: event.Revoke, W: 0, O: 9, M: "soak:0", V: 1})
	return h
}

func TestRevokeCheck(t *testing.T) {
	rep := runChecks(t, revokeHist())
	for _, c := range rep.Checks {
		if c.Failed > 0 {
			t.Errorf("%s failed on a clean history with a revoke: %v", c.Name, c.Examples)
		}
	}
	if rep.Check(CRevoked).Checked < 2 || rep.Revokes != 1 || len(rep.RevokeNotice) != 1 || rep.RevokeNotice[0] != time.Millisecond {
		t.Errorf("revoked-holder-stops checked %d; %d revokes, notices %v", rep.Check(CRevoked).Checked, rep.Revokes, rep.RevokeNotice)
	}
	ms := int64(time.Millisecond)
	cases := []struct {
		what string
		mut  func(h *hist)
	}{
		{"told after the lease's expiry", func(h *hist) {
			for i, e := range h.wlog["w0.0.jsonl"] {
				if (e.E == event.End || e.E == event.RelCall || e.E == event.RelRet) && e.F == 6 {
					h.wlog["w0.0.jsonl"][i].T += 1200 * ms
				}
			}
		}},
		{"a resource call long after the notice (the holder ignores the revoke)", func(h *hist) {
			h.w("w0.0.jsonl", event.Event{T: 3500*ms + 1500*ms, E: event.ResCall, W: 0, O: 777, P: int64(1)<<40 | 60, F: 6, M: "read"})
		}},
		{"a write of the revoked fence accepted after the next holder's", func(h *hist) {
			h.resRow(7, 6, 7, 7, 778, 4100*ms)
			h.w("w0.0.jsonl", event.Event{T: 4099 * ms, E: event.ResCall, W: 0, O: 778, P: int64(1)<<40 | 60, F: 6, M: "claim"})
		}},
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			h := revokeHist()
			c.mut(h)
			rep := runChecks(t, h)
			if rep.Check(CRevoked).Failed == 0 {
				t.Errorf("%s did not fail", CRevoked)
			}
			for _, ch := range rep.Checks {
				if ch.Failed > 0 {
					t.Logf("%s: %v", ch.Name, ch.Examples)
				}
			}
		})
	}
}

// A revoked writer hears of the revoke after a reader woken by it got the
// key: the holders' hold overlap for that moment is not an exclusion
// failure (the server ended the writer's grant at the revoke).
func TestRevokedWriterOverlapsNextReader(t *testing.T) {
	h := newPrimHist()
	ms := int64(time.Millisecond)
	// The writer (fence 1, granted at 6.0 s) is revoked at 6.05 s and told
	// at 6.058 s; a reader gets the key at 6.052 s.
	for i := range h.locks {
		if h.locks[i].UserKey == worker.KeyName(rwK) && h.locks[i].Tg == "D" {
			h.locks[i].AtUs, h.locks[i].App = 6050*ms/1000, driver.RevokerApp
		}
	}
	for name, evs := range h.wlog {
		for i, e := range evs {
			if e.K == rwK && e.F == 1 && e.T > 6000*ms && e.T < 6300*ms {
				switch e.E {
				case event.End:
					h.wlog[name][i].T, h.wlog[name][i].C = 6058*ms, "Revoked"
				case event.RelCall, event.RelRet:
					h.wlog[name][i].T = 6060*ms + e.T%ms
				}
			}
		}
	}
	h.shared(1, rwK, event.KindReader, 0, 1, 6051*ms, 6100*ms)
	rep := runChecks(t, h.hist)
	for _, c := range rep.Checks {
		if c.Failed > 0 {
			t.Errorf("%s failed: %v", c.Name, c.Examples)
		}
	}
	if rep.Check(CRevoked).Checked == 0 {
		t.Errorf("revoked-holder-stops checked nothing")
	}
}

// fairHist is newPrimHist with the fair queue on, plus three writers of
// the reader-writer key: worker 0 holds it from 10 s to 12 s; worker 1
// enqueues a ticket at 10.1 s (live until expires1), worker 0 at 11 s
// (unless noTicket); then both are granted, worker 1 first unless swap.
func fairHist(swap, noTicket bool, expires1 int64) *primHist {
	h := newPrimHist()
	h.meta.Fair = true
	ms := int64(time.Millisecond)
	h.excl(0, rwK, 2, 10*sec, 12*sec, 0)
	enq := func(tg string, w int, at int64, exp int64) {
		h.seq++
		h.queueLog = append(h.queueLog, queueLogRow{Seq: h.seq, Tg: tg, UserKey: worker.KeyName(rwK), IDHash: fmt.Sprintf("tk%d", w),
			TSeq: h.seq, ExpiresMs: exp, AtUs: at / 1000}) // tseq: arrival order (a delete's is not read)
	}
	enq("I", 1, 10*sec+100*ms, expires1)
	if !noTicket {
		enq("I", 0, 11*sec, 13000)
	}
	// Each grant's lockId is its ticket's (the lock log's id hash).
	grant := func(w int, fence, from int64) {
		h.excl(w, rwK, fence, from, from+50*ms, 0)
		n := len(h.locks)
		h.locks[n-2].IDHash, h.locks[n-2].OldIDHash = fmt.Sprintf("tk%d", w), fmt.Sprintf("tk%d", w)
		h.locks[n-1].IDHash, h.locks[n-1].OldIDHash = fmt.Sprintf("tk%d", w), fmt.Sprintf("tk%d", w)
		if w == 0 && noTicket {
			return
		}
		enq("D", w, from, 13000)
	}
	first, second := 1, 0
	if swap {
		first, second = 0, 1
	}
	grant(first, 3, 12*sec+50*ms)
	grant(second, 4, 12*sec+150*ms)
	h.final.Fences[worker.KeyName(rwK)] = 4
	return h
}

// fair-order holds when a key's grants go to the head of its queue, and
// fails when a grant jumps a live ticket ahead of its own, or has no
// ticket while others are queued; an expired ticket does not count.
func TestFairOrder(t *testing.T) {
	for _, c := range []struct {
		name                     string
		swap, noTicket           bool
		expires1                 int64 // ms
		checked, skipped, failed int
	}{
		{"in order", false, false, 13000, 1, 0, 0},
		{"jumped", true, false, 13000, 1, 0, 1},
		{"no ticket of its own", true, true, 13000, 1, 0, 1},
		{"jumped an expired ticket", true, false, 11500, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := fairHist(c.swap, c.noTicket, c.expires1)
			rep := runChecks(t, h.hist)
			fc := rep.Check(CFair)
			if fc == nil {
				t.Fatal("no fair-order check in a fair run")
			}
			// Skipped counts every uncontended grant of the history; only
			// checked and failed are this case's.
			if fc.Checked != c.checked || fc.Failed != c.failed {
				t.Errorf("fair-order: %d checked, %d failed; want %d, %d (%v)", fc.Checked, fc.Failed, c.checked, c.failed, fc.Examples)
			}
			for _, o := range rep.Checks {
				if o.Name != CFair && o.Failed > 0 {
					t.Errorf("%s failed: %v", o.Name, o.Examples)
				}
			}
		})
	}
	if rep := runChecks(t, newPrimHist().hist); rep.Check(CFair) != nil {
		t.Error("fair-order in a run without -fair")
	}
	h := fairHist(false, false, 13000)
	h.final.LiveTickets = 2
	if rep := runChecks(t, h.hist); rep.Check(CLeftovers).Failed != 1 {
		t.Errorf("nothing-left did not fail on 2 tickets left: %v", rep.Check(CLeftovers).Examples)
	}
}

// fairSharedHist is newPrimHist with the fair queue on and one shared
// grant at 14.2 s by worker 0 (released at 14.3 s): a reader of the
// reader-writer key (lim 0) or a permit of the semaphore key (lim 2).
// Other waiters' tickets of the key, each a kind ("w" exclusive, "s" a
// set's, "r" a reader's, "p" a permit's), are enqueued from 14 s: ahead
// before the grant's own ticket (at 14.1 s), behind after it; they live
// until exp (ms) and leave at 14.4 s. The grant's own ticket (unless
// noTicket) is deleted in the grant's statement, just before its insert
// (as the queue's attempt does). As the driver's trigger logs them, a
// queue row names its lockId twice, by an id hash (the lock log's) and by
// its grant id (the shared log's); noGID leaves the grant id out (a run
// made before the soak logged it).
func fairSharedHist(lim int, ahead, behind []string, noTicket, noGID bool, exp int64) *primHist {
	h := newPrimHist()
	h.meta.Fair = true
	ms := int64(time.Millisecond)
	k, kind, fence := rwK, event.KindReader, int64(1) // a reader's fence: the last writer's
	if lim > 0 {
		k, kind, fence = semK, event.KindPermit, 5
		h.final.Fences[worker.KeyName(semK)] = 5
	}
	n := 0
	enq := func(tg, name, what string, at, exp int64, tseq int64) int64 {
		h.seq++
		if tseq == 0 {
			tseq = h.seq
		}
		row := queueLogRow{Seq: h.seq, Tg: tg, UserKey: worker.KeyName(k), IDHash: "tk-" + name, GrantID: "gid-" + name,
			TSeq: tseq, ExpiresMs: exp, AtUs: at / 1000}
		if noGID {
			row.GrantID = ""
		}
		switch what {
		case "s":
			row.SetNo = &tseq
		case "r":
			row.Lim = new(int)
		case "p":
			l := 2
			row.Lim = &l
		}
		h.queueLog = append(h.queueLog, row)
		return tseq
	}
	type queued struct {
		name, what string
		tseq       int64
	}
	var others []queued
	add := func(whats []string, from int64) {
		for _, w := range whats {
			n++
			name := fmt.Sprintf("o%d", n)
			others = append(others, queued{name, w, enq("I", name, w, from+int64(n)*ms, exp, 0)})
		}
	}
	add(ahead, 14*sec)
	var own int64
	if !noTicket {
		what := "r"
		if lim > 0 {
			what = "p"
		}
		own = enq("I", "me", what, 14*sec+100*ms, 15000, 0)
	}
	add(behind, 14*sec+110*ms)
	from := 14*sec + 200*ms
	if !noTicket {
		enq("D", "me", "", from, 15000, own)
	}
	h.sharedRow("I", k, lim, fence, "gid-me", from, from/1e6+1000)
	h.sharedRow("D", k, lim, fence, "gid-me", from+100*ms, from/1e6+1000)
	h.hold(0, k, kind, lim, fence, "gid-me", from, from+100*ms, 0)
	for _, o := range others {
		enq("D", o.name, o.what, 14*sec+400*ms, exp, o.tseq)
	}
	return h
}

// fair-order judges readers and permits by the queue's rules: a reader
// may go with readers ahead of it, not with an exclusive ticket (a set's
// too) or a permit's; a permit only with nothing ahead; a shared grant
// without a ticket jumps the live tickets that would bar it. The shared
// audit is joined to the queue audit by the grant id.
func TestFairOrderShared(t *testing.T) {
	for _, c := range []struct {
		name            string
		lim             int
		ahead, behind   []string
		noTicket, noGID bool
		exp             int64 // the other tickets' expiry, ms
		checked, failed int
	}{
		{"reader, writer ticket ahead", 0, []string{"w"}, nil, false, false, 15000, 1, 1},
		{"reader, set's ticket ahead", 0, []string{"s"}, nil, false, false, 15000, 1, 1},
		{"reader, readers ahead", 0, []string{"r", "r"}, nil, false, false, 15000, 1, 0},
		{"reader, reader ahead and writer behind", 0, []string{"r"}, []string{"w"}, false, false, 15000, 1, 0},
		{"reader, readers ahead, writer between", 0, []string{"r", "w", "r"}, nil, false, false, 15000, 1, 1},
		{"reader, expired writer ticket ahead", 0, []string{"w"}, nil, false, false, 14150, 0, 0},
		{"reader without a ticket, reader queued", 0, nil, []string{"r"}, true, false, 15000, 1, 0},
		{"reader without a ticket, writer queued", 0, nil, []string{"w"}, true, false, 15000, 1, 1},
		{"reader, writer ahead, run without grant ids", 0, []string{"w"}, nil, false, true, 15000, 0, 0},
		{"permit, permit's ticket ahead", 2, []string{"p"}, nil, false, false, 15000, 1, 1},
		{"permit, exclusive ticket ahead", 2, []string{"w"}, nil, false, false, 15000, 1, 1},
		{"permit at the head", 2, nil, []string{"p", "w"}, false, false, 15000, 1, 0},
		{"permit without a ticket, permit queued", 2, nil, []string{"p"}, true, false, 15000, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := fairSharedHist(c.lim, c.ahead, c.behind, c.noTicket, c.noGID, c.exp)
			rep := runChecks(t, h.hist)
			fc := rep.Check(CFair)
			if fc == nil {
				t.Fatal("no fair-order check in a fair run")
			}
			// Every other grant of the history is skipped (no ticket
			// queued), the shared holds only in a run that logs grant ids.
			grants := 0
			for _, l := range h.locks {
				if l.Tg == "I" {
					grants++
				}
			}
			for _, s := range h.sharedLog {
				if s.Tg == "I" && !c.noGID {
					grants++
				}
			}
			if fc.Checked != c.checked || fc.Skipped != grants-c.checked || fc.Failed != c.failed {
				t.Errorf("fair-order: %d checked, %d skipped, %d failed; want %d, %d, %d (%v)", fc.Checked, fc.Skipped, fc.Failed,
					c.checked, grants-c.checked, c.failed, fc.Examples)
			}
			if c.failed > 0 {
				t.Logf("%v", fc.Examples)
			}
			for _, o := range rep.Checks {
				if o.Name != CFair && o.Failed > 0 {
					t.Errorf("%s failed: %v", o.Name, o.Examples)
				}
			}
		})
	}
}
