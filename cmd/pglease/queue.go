package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
)

// The fair queue ({lock}_queue, docs/fairness.md) as status, inspect and
// serve show it: each key's live tickets in order, with the waiting
// holder's identity, what it waits for and since when. A ticket's lockId
// is the grant's to be (a bearer secret): only its hash is shown; its
// key only with --show-keys, as everywhere.

// probeQueue reports whether the queue table exists.
func probeQueue(ctx context.Context, pool *pgxpool.Pool, n store.Names) (bool, error) {
	var ok bool
	err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", n.Queue).Scan(&ok)
	return ok, err
}

// readQueue reads the live tickets (of key only, if not ""), in order
// per key: at most limit tickets, and the counts of all of them. A ticket
// is live while its expiry is ahead of the server's clock, the rule the
// queue's functions apply (no tolerance): an expired one waits for no
// one, though its row stays until a statement touches its key.
func readQueue(ctx context.Context, pool *pgxpool.Pool, n store.Names, key string, limit int, showKeys bool) (queueSection, error) {
	sec := queueSection{Rows: []queueKeyView{}}
	where, args := "", []any{limit}
	if key != "" {
		where, args = " AND q.key = $2", append(args, key)
	}
	sql := "WITH n AS (SELECT " + nowMsSQL + " AS now), q AS (SELECT q.*, row_number() OVER w AS pos, count(*) OVER w AS len " +
		"FROM " + n.Queue + " AS q, n WHERE q.expires_at_ms > n.now" + where + " WINDOW w AS (PARTITION BY q.key ORDER BY q.seq " +
		"ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)) " +
		"SELECT x.key, x.pos, x.len, x.holder, x.lim, x.set_no IS NOT NULL, x.enqueued_at_ms, x.expires_at_ms, x.lock_id, " +
		"hashtext(x.key)::bigint, n.now, (SELECT count(*) FROM q), (SELECT count(DISTINCT q.key) FROM q) " +
		"FROM n LEFT JOIN LATERAL (SELECT q.* FROM q ORDER BY q.key, q.seq LIMIT $1) AS x ON true ORDER BY x.key, x.seq"
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return sec, err
	}
	defer rows.Close()
	for rows.Next() {
		var k, holder, id *string
		var lim *int32
		var pos, length, since, exp, adv *int64
		var set *bool
		var now, total, nkeys int64
		if err := rows.Scan(&k, &pos, &length, &holder, &lim, &set, &since, &exp, &id, &adv, &now, &total, &nkeys); err != nil {
			return sec, err
		}
		sec.Tickets, sec.Keys = int(total), int(nkeys)
		if k == nil { // no ticket: the one row of the LEFT JOIN
			continue
		}
		h := pglease.HashKey(*k)
		if len(sec.Rows) == 0 || sec.Rows[len(sec.Rows)-1].KeyHash != h {
			g := queueKeyView{KeyHash: h, Length: int(*length), Tickets: []queuedView{}, advisoryKey: *adv}
			if showKeys {
				g.Key = *k
			}
			sec.Rows = append(sec.Rows, g)
		}
		t := queuedView{Position: int(*pos), Mode: "exclusive", Since: time.UnixMilli(*since).UTC(), WaitingMs: now - *since,
			ExpiresInMs: *exp - now, LockIDHash: pglease.HashKey(*id)}
		switch {
		case set != nil && *set:
			t.Mode = "set"
		case lim != nil && *lim == 0:
			t.Mode = "reader"
		case lim != nil:
			t.Mode, t.Limit = "permit", int(*lim)
		}
		if holder != nil {
			t.Holder = *holder
		}
		g := &sec.Rows[len(sec.Rows)-1]
		g.Tickets = append(g.Tickets, t)
	}
	return sec, rows.Err()
}

// mode is what the ticket waits for, for people.
func (t *queuedView) mode() string {
	if t.Mode == "permit" {
		return fmt.Sprintf("permit (of %d)", t.Limit)
	}
	return t.Mode
}

// printQueue is status's fair queue: one row per ticket, in order.
func printQueue(w io.Writer, v *snapshotView) {
	s := &v.Schema
	switch {
	case !s.LockTable:
		return
	case !s.QueueTable:
		fmt.Fprintf(w, "\nQUEUE  not shown: no queue table (schema v%d; the fair queue needs v4)\n", s.Version)
		return
	case v.Queue.Tickets == 0:
		fmt.Fprintln(w, "\nQUEUE  none: nobody waits in line")
		return
	}
	fmt.Fprintf(w, "\nQUEUE  %d waiting in line for %d key(s): served in this order, position 1 first (the fair queue)", v.Queue.Tickets, v.Queue.Keys)
	shown := 0
	for _, g := range v.Queue.Rows {
		shown += len(g.Tickets)
	}
	if shown < v.Queue.Tickets {
		fmt.Fprintf(w, "  (showing %d)", shown)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tPOSITION\tHOLDER\tMODE\tWAITING SINCE\tTICKET EXPIRES")
	for _, g := range v.Queue.Rows {
		key := g.KeyHash
		if g.Key != "" {
			key = g.Key
		}
		for _, t := range g.Tickets {
			fmt.Fprintf(tw, "%s\t%d of %d\t%s\t%s\t%s\t%s\n", key, t.Position, g.Length, dash(t.Holder), t.mode(),
				short(time.Duration(t.WaitingMs)*time.Millisecond)+" ago", "in "+short(time.Duration(t.ExpiresInMs)*time.Millisecond))
		}
	}
	tw.Flush()
}

// printKeyQueue prints the key's fair queue, in order.
func printKeyQueue(tw io.Writer, kv *keyView) {
	if !kv.Schema.QueueTable {
		fmt.Fprintf(tw, "queue\tnot shown: no queue table (schema v%d; the fair queue needs v4)\n", kv.Schema.Version)
		return
	}
	if kv.queueLen == 0 {
		fmt.Fprintln(tw, "queue\tnone: nobody waits in line")
		return
	}
	more := ""
	if len(kv.Queue) < kv.queueLen {
		more = fmt.Sprintf(" (showing %d)", len(kv.Queue))
	}
	fmt.Fprintf(tw, "queue\t%d waiting in line, served in this order%s\n", kv.queueLen, more)
	for _, t := range kv.Queue {
		fmt.Fprintf(tw, "  %d\t%s, holder %s, waiting since %s ago, id %s, ticket expires in %s\n", t.Position, t.mode(), dash(t.Holder),
			short(time.Duration(t.WaitingMs)*time.Millisecond), t.LockIDHash, short(time.Duration(t.ExpiresInMs)*time.Millisecond))
	}
}
