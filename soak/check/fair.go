package check

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// queueLogRow is one row of the fair queue's audit log (queue_log.jsonl):
// a ticket enqueued (I), refreshed (U) or deleted (D: granted, left, or
// dropped after its expiry), in the lock audits' sequence.
type queueLogRow struct {
	Seq       int64  `json:"seq"`
	Tg        string `json:"tg"`
	UserKey   string `json:"user_key"`
	IDHash    string `json:"id_hash"`
	GrantID   string `json:"grant_id"` // pg.GrantID of the lockId, as the shared audit names a hold ("" in runs made before the soak logged it)
	TSeq      int64  `json:"tseq"`     // the ticket's place in its key's queue
	Lim       *int   `json:"lim"`
	SetNo     *int64 `json:"set_no"`
	ExpiresMs int64  `json:"expires_ms"`
	AtUs      int64  `json:"at_us"`
	Xid       int64  `json:"xid"`
}

// loadQueue reads queue_log.jsonl (absent in runs made before the soak
// logged the queue: nil).
func (r *run) loadQueue() ([]queueLogRow, error) {
	f, err := os.Open(filepath.Join(r.dir, "queue_log.jsonl"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var rows []queueLogRow
	for sc.Scan() {
		var row queueLogRow
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

// ticket is a live row of the queue table, replayed from its audit log.
type ticket struct {
	id        string // md5 of the lockId (the lock audit's id_hash)
	gid       string // pg.GrantID of the lockId (the shared audit's grant_id)
	tseq      int64
	lim       *int // nil: exclusive (a set's too); 0: a reader; n: a permit of n
	expiresMs int64
	atUs      int64 // enqueued (server time)
	set       bool
}

// kind names the ticket for a failure message.
func (t *ticket) kind() string {
	switch {
	case t.set:
		return "set's ticket"
	case t.lim == nil:
		return "exclusive ticket"
	case *t.lim == 0:
		return "reader's ticket"
	}
	return "permit's ticket"
}

// fairGrant is a grant the fair-order check judges: a lock table row
// given to a lockId (l, from the lock audit) or a shared hold (s, from the
// shared-hold audit); atUs is its commit's server time.
type fairGrant struct {
	seq  int64
	l    *lockLogRow
	s    *sharedLogRow
	atUs int64
}

// bars reports whether live ticket t, ahead of grant g's own ticket (or
// anywhere, when g has none), must have kept g waiting: every ticket bars
// an exclusive grant and a permit; a reader is barred by an exclusive
// ticket (a set's included) or a permit's, never by a reader's.
func (g fairGrant) bars(t *ticket) bool {
	if g.s == nil || g.s.Lim > 0 {
		return true
	}
	return t.lim == nil || *t.lim > 0
}

// checkFair: the fair queue (manager.Config.FairQueue, docs/fairness.md)
// serves a key's waiters in arrival order across processes, by its "who
// may go" rules. In the server's own order (the lock, shared-hold and
// queue audits share one sequence, and every statement that enqueues or
// grants holds its key's advisory lock), at every grant of a key, among
// the key's live tickets ahead of the grant's own ticket (its lockId's
// last enqueue; a grant's lockId is its ticket's, exclusive or shared):
//   - an exclusive grant (a lease, a writer, an exclusive grant of a
//     semaphore key, a set's lock) and a permit find none: they go at the
//     head;
//   - a reader finds no exclusive ticket (a set's included) and no
//     permit's; readers ahead of it do not matter (readers in a row go
//     together; a writer queued ahead holds them off).
//
// A grant with no ticket at all (a caller that did not queue) is judged
// as if its ticket were behind every live one: it jumps each live ticket
// that would bar it. The shared audit names a hold by the pg.GrantID of
// its lockId and the lock audit by an md5, so the queue audit logs both
// (runs made before it logged the grant id: shared holds are not judged).
// A ticket past its expiry at the grant's commit time does not count (a
// dead or partitioned waiter's ticket blocks its key at most its life;
// its caller enqueues again, at the tail). Checked: the grants made while
// another live ticket of their key was queued (any kind, also one that
// could not bar them); skipped: those with none queued. Only runs with
// -fair are checked.
func (r *run) checkFair() (*Check, error) {
	c := &Check{Name: CFair, Guarantee: "fair queue: every grant of a key goes by its queue's order: an exclusive grant or a permit with no other live ticket of the key ahead of its own, a reader with no exclusive or permit's ticket ahead (readers ahead may be); server order; a grant without a ticket jumps every live one that would bar it"}
	rows, err := r.loadQueue()
	if err != nil {
		return nil, err
	}
	withGID := false
	for i := range rows {
		if rows[i].GrantID != "" {
			withGID = true
			break
		}
	}
	// Client grants by the server's lockId hash or grant id, to name the
	// workers.
	who := func(k int, idHash, gid string) string {
		for _, s := range r.sgrants[k] {
			if idHash != "" && s.idHash == idHash {
				for _, g := range r.grants {
					if g.key == k && g.fence == s.fence {
						return fmt.Sprintf("worker %d.%d (fence %d)", g.w, g.inc, g.fence)
					}
				}
				return fmt.Sprintf("fence %d (no worker logged it)", s.fence)
			}
		}
		if gid != "" {
			for _, g := range r.shared {
				if g.key == k && g.grantID == gid {
					return fmt.Sprintf("worker %d.%d (%s, fence %d)", g.w, g.inc, g.kind, g.fence)
				}
			}
			for _, s := range r.sshared[k] {
				if s.grantID == gid {
					return fmt.Sprintf("shared hold fence %d (no worker logged it)", s.fence)
				}
			}
		}
		return "a caller that was never granted"
	}
	type item struct {
		seq int64
		q   *queueLogRow
		g   *fairGrant
	}
	byKey := map[int][]item{}
	for i := range rows {
		if k, ok := keyIndex(rows[i].UserKey); ok {
			byKey[k] = append(byKey[k], item{seq: rows[i].Seq, q: &rows[i]})
		}
	}
	for i := range r.lockLog {
		row := &r.lockLog[i]
		if row.Tg == "I" || row.Tg == "U" && row.OldIDHash != row.IDHash {
			if k, ok := keyIndex(row.UserKey); ok {
				byKey[k] = append(byKey[k], item{seq: row.Seq, g: &fairGrant{seq: row.Seq, l: row, atUs: row.AtUs}})
			}
		}
	}
	if withGID {
		for i := range r.sharedLog {
			row := &r.sharedLog[i]
			if row.Tg == "I" {
				if k, ok := keyIndex(row.UserKey); ok {
					byKey[k] = append(byKey[k], item{seq: row.Seq, g: &fairGrant{seq: row.Seq, s: row, atUs: row.AtUs}})
				}
			}
		}
	}
	for k, items := range byKey {
		sort.Slice(items, func(i, j int) bool { return items[i].seq < items[j].seq })
		live := map[string]*ticket{}
		last := map[string]*ticket{} // each lockId's last enqueue, by id hash
		idOf := map[string]string{}  // id hash by grant id
		for _, it := range items {
			if q := it.q; q != nil {
				switch q.Tg {
				case "I":
					t := &ticket{id: q.IDHash, gid: q.GrantID, tseq: q.TSeq, lim: q.Lim, expiresMs: q.ExpiresMs, atUs: q.AtUs, set: q.SetNo != nil}
					live[q.IDHash], last[q.IDHash] = t, t
					if q.GrantID != "" {
						idOf[q.GrantID] = q.IDHash
					}
				case "U":
					if t := live[q.IDHash]; t != nil {
						t.expiresMs = q.ExpiresMs
					}
				case "D":
					delete(live, q.IDHash)
				}
				continue
			}
			g := it.g
			var self, gid, what string
			if g.l != nil {
				self, what = g.l.IDHash, "an exclusive grant"
			} else {
				gid = g.s.GrantID
				self = idOf[gid] // "": the lockId never queued
				what = "a reader"
				if g.s.Lim > 0 {
					what = fmt.Sprintf("a permit of %d", g.s.Lim)
				}
			}
			var own *ticket
			if self != "" {
				own = last[self]
			}
			atMs := g.atUs / 1000
			var ahead []*ticket
			others := 0
			for id, t := range live {
				if id == self || t.expiresMs <= atMs {
					continue
				}
				others++
				if (own == nil || t.tseq < own.tseq) && g.bars(t) {
					ahead = append(ahead, t)
				}
			}
			if others == 0 {
				c.Skipped++
				continue
			}
			c.Checked++
			if len(ahead) == 0 {
				continue
			}
			sort.Slice(ahead, func(i, j int) bool { return ahead[i].tseq < ahead[j].tseq })
			t := ahead[0]
			mine := "no ticket of its own"
			if own != nil {
				mine = fmt.Sprintf("its own ticket %d enqueued %s before the grant", own.tseq, ms(time.Duration(g.atUs-own.atUs)*time.Microsecond))
			}
			holder := who(k, self, "")
			if g.s != nil {
				holder = who(k, "", gid)
			}
			c.fail("%s: %s, %s, was granted (audit seq %d; %s) while %d live ticket(s) that bar it were ahead of it, the first the %s %d of %s, enqueued %s earlier and live %s more",
				kn(k), holder, what, g.seq, mine, len(ahead), t.kind(), t.tseq, who(k, t.id, t.gid),
				ms(time.Duration(g.atUs-t.atUs)*time.Microsecond), ms(time.Duration(t.expiresMs-atMs)*time.Millisecond))
		}
	}
	return c, nil
}
