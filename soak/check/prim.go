package check

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/pglease/pglease/soak/event"
	"github.com/pglease/pglease/soak/worker"
)

// The checks of the Manager's other primitives: semaphore permits
// (WithLimit), readers and writers (Shared), all-or-nothing sets
// (AcquireAll), and the fences of shared holds. The server's side comes
// from the audit logs of the lock table and of its shared-hold table; the
// clients' from the holders' own events.

func isSemKey(k int) bool   { return k >= worker.SemBase && k < worker.RWBase }
func isRWKey(k int) bool    { return k >= worker.RWBase }
func isSetKey(k int) bool   { return k >= worker.SetBase && k < worker.SemBase }
func isLeaseKey(k int) bool { return k < worker.SetBase }

// hold is one hold of a key, exclusive or shared, over [from, to).
type hold struct {
	from, to int64
	excl     bool
	who      string
}

// sweep goes through the holds of one key in time order and calls fail
// for each start that breaks exclusion: an exclusive hold beginning while
// anything is held, a shared one while an exclusive hold is, or (limit >
// 0) a shared one beyond limit shared holds. An end at the same time as a
// start comes first (a hold is [from, to)). It returns the most shared
// holds live at once.
func sweep(hs []hold, limit int, fail func(h hold, other hold, n int)) int {
	type ev struct {
		t     int64
		start bool
		i     int
	}
	evs := make([]ev, 0, 2*len(hs))
	for i, h := range hs {
		if h.to <= h.from {
			continue
		}
		evs = append(evs, ev{h.from, true, i}, ev{h.to, false, i})
	}
	sort.Slice(evs, func(a, b int) bool {
		if evs[a].t != evs[b].t {
			return evs[a].t < evs[b].t
		}
		return !evs[a].start && evs[b].start
	})
	live := map[int]bool{}
	nExcl, nShared, most := 0, 0, 0
	someLive := func(excl bool) hold {
		for i := range live {
			if hs[i].excl == excl {
				return hs[i]
			}
		}
		return hold{}
	}
	for _, e := range evs {
		h := hs[e.i]
		if !e.start {
			delete(live, e.i)
			if h.excl {
				nExcl--
			} else {
				nShared--
			}
			continue
		}
		switch {
		case h.excl && nExcl > 0:
			fail(h, someLive(true), nExcl)
		case h.excl && nShared > 0:
			fail(h, someLive(false), nShared)
		case !h.excl && nExcl > 0:
			fail(h, someLive(true), nExcl)
		case !h.excl && limit > 0 && nShared >= limit:
			fail(h, someLive(false), nShared+1)
		}
		live[e.i] = true
		if h.excl {
			nExcl++
		} else {
			nShared++
			most = max(most, nShared)
		}
	}
	return most
}

// serverHolds returns key k's holds on the server: its exclusive grants
// (not the ones deleted by their own transaction, which never committed as
// grants) and its shared holds, each live from its row's change to its
// deletion, takeover or expiry + tolerance.
func (r *run) serverHolds(k int) []hold {
	var hs []hold
	for _, s := range r.sgrants[k] {
		if s.deletedTx {
			continue
		}
		hs = append(hs, hold{from: s.atT, to: s.liveEnd(r), excl: true, who: fmt.Sprintf("exclusive fence %d (seq %d)", s.fence, s.seq)})
	}
	for _, s := range r.sshared[k] {
		what := "reader"
		if s.lim > 0 {
			what = fmt.Sprintf("permit of %d", s.lim)
		}
		who := fmt.Sprintf("%s fence %d (seq %d)", what, s.fence, s.seq)
		if s.app != "" {
			who = fmt.Sprintf("%s fence %d (seq %d, %s)", what, s.fence, s.seq, s.app)
		}
		hs = append(hs, hold{from: s.atT, to: s.liveEnd(r), who: who})
	}
	return hs
}

// clientHolds returns key k's holds as their holders saw them (from the
// grant's return to the holder's stop: release, loss notice or death; the
// end of the run if none; a revoked grant's revoke), leaving out holders
// paused (SIGSTOP) meanwhile: a paused holder acts on its lock late, which
// fencing answers for.
func (r *run) clientHolds(k int, c *Check) []hold {
	var hs []hold
	add := func(g *grant, excl bool) {
		stop, ok := g.stopped()
		if !ok {
			stop = r.endT
		}
		if r.exempt(g.w, g.callT, stop, tolerance+r.margin()) {
			c.Skipped++
			return
		}
		if s, rv := r.revoked(g); rv && excl {
			// A revoke ends the grant on the server and frees the key at
			// once; the holder hears of it a moment later
			// (revoked-holder-stops checks it does).
			stop = min(stop, s.revokedT)
		}
		what := "writer"
		switch {
		case g.kind == event.KindPermit:
			what = "permit"
		case g.kind == event.KindReader:
			what = "reader"
		case isSemKey(k):
			what = "exclusive holder"
		}
		hs = append(hs, hold{from: g.okT, to: stop, excl: excl, who: fmt.Sprintf("%s worker %d.%d fence %d", what, g.w, g.inc, g.fence)})
	}
	for _, g := range r.grants {
		if g.key == k {
			add(g, true)
		}
	}
	for _, g := range r.shared {
		if g.key == k {
			add(g, false)
		}
	}
	return hs
}

// keysOf returns the keys, of the kind in, that the server or a client
// has holds of, in order.
func (r *run) keysOf(in func(int) bool) []int {
	seen := map[int]bool{}
	for k := range r.sgrants {
		seen[k] = true
	}
	for k := range r.sshared {
		seen[k] = true
	}
	for _, g := range r.grants {
		seen[g.key] = true
	}
	for _, g := range r.shared {
		seen[g.key] = true
	}
	var ks []int
	for k := range seen {
		if in(k) {
			ks = append(ks, k)
		}
	}
	sort.Ints(ks)
	return ks
}

// serverSharedByID indexes the server's shared holds by grant id.
func (r *run) serverSharedByID() map[string]*serverShared {
	m := map[string]*serverShared{}
	for _, ss := range r.sshared {
		for _, s := range ss {
			m[s.grantID] = s
		}
	}
	return m
}

// sharedCommitted checks that each shared hold of kind a client got on a
// key that in accepts is one the server committed, with the fence the
// client was given.
func (r *run) sharedCommitted(c *Check, kind string, in func(int) bool, byID map[string]*serverShared) {
	for _, g := range r.shared {
		if g.kind != kind || !in(g.key) {
			continue
		}
		c.Checked++
		s := byID[g.grantID]
		switch {
		case g.grantID == "" || s == nil:
			c.fail("%s: worker %d.%d holds a %s (fence %d) the server never granted", kn(g.key), g.w, g.inc, kindName(kind), g.fence)
		case s.key != g.key || s.fence != g.fence || s.lim != g.lim:
			c.fail("%s: worker %d.%d holds a %s of %s fence %d limit %d; the server granted %s fence %d limit %d", kn(g.key), g.w, g.inc,
				kindName(kind), kn(g.key), g.fence, g.lim, kn(s.key), s.fence, s.lim)
		}
	}
}

func kindName(kind string) string {
	switch kind {
	case event.KindPermit:
		return "permit"
	case event.KindReader:
		return "reader hold"
	}
	return "lease"
}

func at(t, base int64) string { return fmt.Sprintf("%.3fs", float64(t-base)/1e9) }

// checkSemaphore: a counting semaphore of N never has more than N live
// permits of a key, nor a permit and an exclusive holder at once.
func (r *run) checkSemaphore(rep *Report) *Check {
	n := r.meta.SemLimit
	c := &Check{Name: CSemBound, Guarantee: fmt.Sprintf("shared holds: never more than N=%d live permits of a key, never a permit with an exclusive holder (server log, every server time); holders not paused never hold more than N at once; every permit a holder got is the server's", n)}
	byID := r.serverSharedByID()
	for _, k := range r.keysOf(isSemKey) {
		for _, s := range r.sshared[k] {
			c.Checked++
			if s.lim != n {
				c.fail("%s: the server granted a %s with limit %d (fence %d, %s); the run's semaphores are of %d", kn(k),
					map[bool]string{true: "permit", false: "reader"}[s.lim > 0], s.lim, s.fence, s.app, n)
			}
		}
		most := sweep(r.serverHolds(k), n, func(h, o hold, cnt int) {
			c.fail("%s (server): %s granted at %s while %d held, e.g. %s", kn(k), h.who, at(h.from, r.readyT), cnt, o.who)
		})
		rep.PermitsMax = max(rep.PermitsMax, most)
		ch := r.clientHolds(k, c)
		c.Checked += len(ch)
		sweep(ch, n, func(h, o hold, cnt int) {
			c.fail("%s (holders): %s got it at %s while %d held, e.g. %s", kn(k), h.who, at(h.from, r.readyT), cnt, o.who)
		})
	}
	r.sharedCommitted(c, event.KindPermit, isSemKey, byID)
	return c
}

// checkRW: a reader-writer key never has a live reader with a live writer,
// nor two live writers.
func (r *run) checkRW() *Check {
	c := &Check{Name: CRWExcl, Guarantee: "shared holds: never a live reader with a live writer, never two live writers (server log, every server time); holders not paused: a writer's hold never overlaps a reader's or another writer's; every reader hold a holder got is the server's, with its fence"}
	byID := r.serverSharedByID()
	for _, k := range r.keysOf(isRWKey) {
		for _, s := range r.sshared[k] {
			c.Checked++
			if s.lim != 0 {
				c.fail("%s: the server granted a permit of %d (fence %d) on a reader-writer key", kn(k), s.lim, s.fence)
			}
		}
		sweep(r.serverHolds(k), 0, func(h, o hold, cnt int) {
			c.fail("%s (server): %s granted at %s while %s held it", kn(k), h.who, at(h.from, r.readyT), o.who)
		})
		ch := r.clientHolds(k, c)
		c.Checked += len(ch)
		sweep(ch, 0, func(h, o hold, cnt int) {
			c.fail("%s (holders): %s got it at %s while %s held it", kn(k), h.who, at(h.from, r.readyT), o.who)
		})
	}
	r.sharedCommitted(c, event.KindReader, isRWKey, byID)
	return c
}

// checkSets: all-or-nothing sets. Every transaction that grants set keys
// commits whole sets (at least two keys, none of them deleted again by
// the same transaction); every set a holder got is all the keys it asked
// for, granted by one transaction.
func (r *run) checkSets(rep *Report) *Check {
	c := &Check{Name: CSets, Guarantee: "all-or-nothing sets: a set's keys are granted in one server transaction, all of them, never a subset (server log); a holder gets every key it asked for, all from that one transaction"}
	byXid := map[int64][]*serverGrant{}
	for k, gs := range r.sgrants {
		if !isSetKey(k) {
			continue
		}
		for _, s := range gs {
			if s.xid != 0 {
				byXid[s.xid] = append(byXid[s.xid], s)
			}
		}
	}
	for xid, gs := range byXid {
		c.Checked++
		kept := 0
		for _, s := range gs {
			if s.deletedTx {
				c.fail("transaction %d granted %s (fence %d) and deleted it before committing: a set committed in part", xid, kn(s.key), s.fence)
			} else {
				kept++
			}
		}
		if kept == 1 {
			c.fail("transaction %d committed a grant of one set key only (%s fence %d): sets are of 2–3 keys", xid, kn(gs[0].key), gs[0].fence)
		}
	}
	for _, s := range r.sets {
		if s.okT == 0 {
			continue
		}
		rep.Sets++
		rep.SetLocks += s.n
		c.Checked++
		if s.n != len(s.asked) || !slices.Equal(s.got, s.asked) {
			c.fail("worker %d.%d asked for %v and got %d locks, of %v", s.w, s.inc, names(s.asked), s.n, names(s.got))
			continue
		}
		if len(s.locks) < s.n {
			if _, died := r.deaths[[2]int{s.w, s.inc}]; died {
				c.Skipped++ // killed while logging the locks
				continue
			}
			c.fail("worker %d.%d logged %d of the set's %d locks", s.w, s.inc, len(s.locks), s.n)
			continue
		}
		var xid int64
		for i, g := range s.locks {
			sg := r.serverGrant(g.key, g.fence)
			switch {
			case sg == nil:
				c.fail("worker %d.%d got %s fence %d in a set; the server never granted it", s.w, s.inc, kn(g.key), g.fence)
			case sg.deletedTx:
				c.fail("worker %d.%d got %s fence %d in a set; its grant was deleted in its own transaction %d (never committed)", s.w, s.inc, kn(g.key), g.fence, sg.xid)
			case i > 0 && sg.xid != xid:
				c.fail("worker %d.%d got the set %v from two transactions (%d and %d)", s.w, s.inc, names(s.asked), xid, sg.xid)
			default:
				xid = sg.xid
			}
		}
	}
	return c
}

func names(ks []int) []string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = kn(k)
	}
	return s
}

// checkSharedFences: fences of keys with shared holds. On the server, in
// the grants' order (one sequence for both audit logs; every grant of a
// key holds its advisory lock until it commits), the fences of permits and
// exclusive grants strictly increase and a reader's is the last one
// granted before it. Holders: no permit or exclusive fence twice; a grant
// that returned before another was called has the lower fence (a reader's
// may be equal).
func (r *run) checkSharedFences() *Check {
	c := &Check{Name: CSharedFences, Guarantee: "shared holds and fence monotonicity: per key, permits' and exclusive grants' fences strictly increase together, a reader's fence is the key's last fence granted before it (server order); holders: no permit fence repeated, a grant returned before another was called has the lower fence"}
	type item struct {
		seq    int64
		fence  int64
		reader bool
		who    string
	}
	for _, k := range r.keysOf(func(k int) bool { return isSemKey(k) || isRWKey(k) }) {
		var its []item
		for _, s := range r.sgrants[k] {
			its = append(its, item{s.seq, s.fence, false, fmt.Sprintf("exclusive grant seq %d", s.seq)})
		}
		for _, s := range r.sshared[k] {
			what := "permit"
			if s.lim == 0 {
				what = "reader"
			}
			its = append(its, item{s.seq, s.fence, s.lim == 0, fmt.Sprintf("%s seq %d", what, s.seq)})
		}
		sort.Slice(its, func(i, j int) bool { return its[i].seq < its[j].seq })
		var last int64
		for _, it := range its {
			c.Checked++
			switch {
			case it.reader && it.fence != last:
				c.fail("%s: %s has fence %d, but the last fence granted before it is %d", kn(k), it.who, it.fence, last)
			case !it.reader && it.fence <= last:
				c.fail("%s: %s has fence %d after fence %d", kn(k), it.who, it.fence, last)
			}
			if !it.reader {
				last = max(last, it.fence)
			}
		}

		// Holders: exclusive grants and permits (and readers) of the key.
		var gs []*grant
		for _, g := range r.grants {
			if g.key == k {
				gs = append(gs, g)
			}
		}
		for _, g := range r.shared {
			if g.key == k {
				gs = append(gs, g)
			}
		}
		seen := map[int64]*grant{}
		for _, g := range gs {
			if g.kind == event.KindReader {
				continue
			}
			if o := seen[g.fence]; o != nil {
				c.fail("%s: fence %d given twice (worker %d.%d and %d.%d)", kn(k), g.fence, o.w, o.inc, g.w, g.inc)
			}
			seen[g.fence] = g
		}
		sort.Slice(gs, func(i, j int) bool { return gs[i].callT < gs[j].callT })
		byRet := append([]*grant(nil), gs...)
		sort.Slice(byRet, func(i, j int) bool { return byRet[i].okT < byRet[j].okT })
		j := 0
		var maxF int64
		var maxG *grant
		for _, g := range gs {
			for j < len(byRet) && byRet[j].okT < g.callT {
				if b := byRet[j]; b.kind != event.KindReader && b.fence > maxF {
					maxF, maxG = b.fence, b
				}
				j++
			}
			c.Checked++
			if maxG == nil {
				continue
			}
			if g.kind == event.KindReader && g.fence < maxF || g.kind != event.KindReader && g.fence <= maxF {
				c.fail("%s: worker %d.%d got fence %d (%s) though fence %d (worker %d.%d) was granted before its call", kn(k), g.w, g.inc, g.fence,
					kindName(g.kind), maxF, maxG.w, maxG.inc)
			}
		}
	}
	return c
}

// primStats counts the primitives' holds for the report.
func (r *run) primStats(rep *Report) {
	for _, g := range r.shared {
		switch g.kind {
		case event.KindPermit:
			rep.Permits++
		case event.KindReader:
			rep.Readers++
		}
	}
	for _, g := range r.grants {
		if isSemKey(g.key) || isRWKey(g.key) {
			rep.PrimExclusive++
		}
	}
	for _, ss := range r.sshared {
		for _, s := range ss {
			if s.lim > 0 {
				rep.ServerPermits++
			} else {
				rep.ServerReaders++
			}
		}
	}
}

// sharedLeftovers: every shared hold held when its worker was told to stop
// is deleted (released before its expiry), not left to expire.
func (r *run) sharedLeftovers(c *Check) {
	byID := r.serverSharedByID()
	for _, g := range r.shared {
		if g.endT != 0 && g.endT < r.meta.StopAt || g.okT >= r.meta.StopAt || g.grantID == "" {
			continue
		}
		if d, ok := r.deaths[[2]int{g.w, g.inc}]; ok && d.t < r.meta.StopAt {
			continue
		}
		s := byID[g.grantID]
		if s == nil {
			continue
		}
		c.Checked++
		if s.deletedT == 0 || s.deletedT >= r.expMono(s.expires[len(s.expires)-1]*1e6, s.lastT) {
			c.fail("%s: worker %d.%d held a %s (fence %d) at the stop and did not release it", kn(g.key), g.w, g.inc, kindName(g.kind), g.fence)
		}
	}
}

// revokeStopSlack is how long after its notice a revoked holder may still
// begin a resource call: one it decided on just before the notice, on a
// loaded machine.
const revokeStopSlack = time.Second

// checkRevoked: revocation. Every grant the driver's revoking Manager
// deleted whose holder did not stop first (release, death) and was not
// paused: the holder is told (its Context ends with ErrRevoked, or with
// ErrLockLost when its listener missed the notification and its next
// extend found the lease gone) before the lease's expiry in force at the
// revoke, and begins no resource call later than revokeStopSlack after
// that; and (fencing, the resource's log) none of its writes is accepted
// after the first accepted write of a later grant of the key.
func (r *run) checkRevoked(rep *Report) *Check {
	c := &Check{Name: CRevoked, Guarantee: fmt.Sprintf("revocation: a revoked holder not paused is told (ErrRevoked; ErrLockLost if it missed the notice) before its lease's expiry and begins no resource call %s after; none of its fenced writes is accepted after the next grant's first (resource log)", revokeStopSlack)}
	byKey := map[int][]resLogRow{}
	for _, row := range r.resLog {
		byKey[row.Key] = append(byKey[row.Key], row)
	}
	for _, e := range r.revokes {
		if e.V == 1 {
			rep.Revokes++
		}
	}
	for _, g := range r.grants {
		s, rv := r.revoked(g)
		if !rv {
			continue
		}
		// Fencing, from the resource's log: after the first write of a
		// later grant, no write of this one.
		if next := r.nextServerGrant(g.key, g.fence); next != nil && isLeaseKey(g.key) {
			c.Checked++
			newer := false
			for _, row := range byKey[g.key] {
				nf := int64(-1)
				if row.NewFence != nil {
					nf = *row.NewFence
				}
				switch {
				case nf >= next.fence:
					newer = true
				case newer && nf == g.fence:
					c.fail("%s: worker %d.%d's write with revoked fence %d accepted (seq %d) after fence %d's", kn(g.key), g.w, g.inc, g.fence, row.Seq, next.fence)
				}
			}
		}
		// The holder stopped by itself first (a release called before it
		// could hear, its death), or was paused: nothing to tell.
		if g.relT > 0 && g.relT <= s.revokedT || g.deathT > 0 && g.deathT <= s.revokedT ||
			g.endT > 0 && g.endT <= s.revokedT && g.endCode != "Revoked" {
			c.Skipped++
			continue
		}
		stop, _ := g.stopped()
		if r.exempt(g.w, g.callT, max(stop, s.revokeExp), r.margin()) {
			c.Skipped++
			continue
		}
		c.Checked++
		told := g.endT > 0 && (g.endCode == "Revoked" || g.endCode == "LockLost")
		// When it stopped: told, or its own release (called before it
		// heard: the release finds the lease gone), or its death.
		notice, how := int64(0), ""
		pick := func(t int64, h string) {
			if t > 0 && (notice == 0 || t < notice) {
				notice, how = t, h
			}
		}
		if told {
			pick(g.endT, g.endCode)
		}
		pick(g.relT, "release")
		pick(g.deathT, "death")
		switch {
		case how == "death":
			c.Skipped++ // killed before it heard
			continue
		case notice == 0:
			c.fail("%s: worker %d.%d (fence %d) was revoked and never told (end %q)", kn(g.key), g.w, g.inc, g.fence, g.endCode)
			continue
		case notice >= s.revokeExp:
			c.fail("%s: worker %d.%d (fence %d) was revoked and went on until %s %s after its lease's expiry", kn(g.key), g.w, g.inc, g.fence,
				how, time.Duration(notice-s.revokeExp).Round(time.Millisecond))
		case how == "release":
			rep.RevokeReleased++
		default:
			rep.RevokeNotice = append(rep.RevokeNotice, time.Duration(max(0, notice-s.revokedT)))
			if how == "LockLost" {
				rep.RevokeLost++
			}
		}
		for _, op := range g.ops {
			if op.callT > notice+int64(revokeStopSlack) {
				c.fail("%s: worker %d.%d (fence %d) began a %s %s after it was told of the revoke (%s)", kn(g.key), g.w, g.inc, g.fence, op.kind,
					time.Duration(op.callT-notice).Round(time.Millisecond), how)
				break
			}
		}
	}
	sort.Slice(rep.RevokeNotice, func(i, j int) bool { return rep.RevokeNotice[i] < rep.RevokeNotice[j] })
	return c
}
