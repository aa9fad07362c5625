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
	TSeq      int64  `json:"tseq"` // the ticket's place in its key's queue
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
	id        string
	tseq      int64
	expiresMs int64
	atUs      int64 // enqueued (server time)
	set       bool
}

// checkFair: the fair queue (manager.Config.FairQueue, docs/fairness.md)
// serves a key's waiters in arrival order across processes. In the
// server's own order (the lock and queue audits share one sequence, and
// every statement that enqueues or grants holds its key's advisory lock):
// every exclusive grant of a key (a lease, a writer, an exclusive grant of
// a semaphore key, a set's lock) goes to the head of the key's queue. At
// the grant, no other live ticket of the key (any kind: an exclusive
// ticket goes only at the head) is ahead of the grant's own ticket (its
// lockId's last enqueue); a grant with no ticket at all (a caller that
// did not queue) jumps every live ticket of the key. A ticket past its
// expiry at the grant's commit time does not count (a dead or partitioned
// waiter's ticket blocks its key at most its life; its caller enqueues
// again, at the tail). Checked: the grants made while another live ticket
// of their key was queued; skipped: those with none queued. Only runs
// with -fair are checked.
func (r *run) checkFair() (*Check, error) {
	c := &Check{Name: CFair, Guarantee: "fair queue: every exclusive grant of a key goes to the head of its queue: no other live ticket of the key is ahead of the grant's own (server order; a grant without a ticket jumps every live one)"}
	rows, err := r.loadQueue()
	if err != nil {
		return nil, err
	}
	// Client grants by the server's lockId hash, to name the workers.
	who := func(k int, idHash string) string {
		for _, s := range r.sgrants[k] {
			if s.idHash == idHash {
				for _, g := range r.grants {
					if g.key == k && g.fence == s.fence {
						return fmt.Sprintf("worker %d.%d (fence %d)", g.w, g.inc, g.fence)
					}
				}
				return fmt.Sprintf("fence %d (no worker logged it)", s.fence)
			}
		}
		return "a caller that was never granted"
	}
	type item struct {
		seq int64
		q   *queueLogRow
		l   *lockLogRow
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
				byKey[k] = append(byKey[k], item{seq: row.Seq, l: row})
			}
		}
	}
	for k, items := range byKey {
		sort.Slice(items, func(i, j int) bool { return items[i].seq < items[j].seq })
		live := map[string]*ticket{}
		last := map[string]*ticket{} // each lockId's last enqueue
		for _, it := range items {
			if q := it.q; q != nil {
				switch q.Tg {
				case "I":
					t := &ticket{id: q.IDHash, tseq: q.TSeq, expiresMs: q.ExpiresMs, atUs: q.AtUs, set: q.SetNo != nil}
					live[q.IDHash], last[q.IDHash] = t, t
				case "U":
					if t := live[q.IDHash]; t != nil {
						t.expiresMs = q.ExpiresMs
					}
				case "D":
					delete(live, q.IDHash)
				}
				continue
			}
			g := it.l
			own := last[g.IDHash]
			atMs := g.AtUs / 1000
			var ahead []*ticket
			others := 0
			for id, t := range live {
				if id == g.IDHash || t.expiresMs <= atMs {
					continue
				}
				others++
				if own == nil || t.tseq < own.tseq {
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
				mine = fmt.Sprintf("its own ticket %d enqueued %s before the grant", own.tseq, ms(time.Duration(g.AtUs-own.atUs)*time.Microsecond))
			}
			kind := "ticket"
			if t.set {
				kind = "set's ticket"
			}
			c.fail("%s: %s was granted (audit seq %d; %s) while %d live ticket(s) were ahead of it, the first the %s %d of %s, enqueued %s earlier and live %s more",
				kn(k), who(k, g.IDHash), g.Seq, mine, len(ahead), kind, t.tseq, who(k, t.id),
				ms(time.Duration(g.AtUs-t.atUs)*time.Microsecond), ms(time.Duration(t.expiresMs-atMs)*time.Millisecond))
		}
	}
	return c, nil
}
