package driver

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"
)

// Final is the server's state after every worker closed (final.json).
type Final struct {
	NowMs         int64            `json:"now_ms"`
	Fences        map[string]int64 `json:"fences"`         // fence counter per user key
	LiveRows      int              `json:"live_rows"`      // lock rows not yet expired
	ExpiredRows   int              `json:"expired_rows"`   // lock rows past expiry (killed holders)
	LiveShared    int              `json:"live_shared"`    // shared-hold rows not yet expired
	AdvisoryLocks int              `json:"advisory_locks"` // advisory locks held by anyone
	LiveTickets   int              `json:"live_tickets"`   // fair-queue tickets not yet expired
	Counters      map[int]int64    `json:"counters"`       // resource counter per key
	ResFences     map[int]int64    `json:"res_fences"`
}

// dump writes the audit tables and the final state to the run directory.
func (d *driver) dump(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var f Final
	f.Fences = map[string]int64{}
	f.Counters = map[int]int64{}
	f.ResFences = map[int]int64{}
	if err := d.admin.QueryRow(ctx, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&f.NowMs); err != nil {
		return err
	}
	if err := d.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE expires_at_ms > $1), count(*) FILTER (WHERE expires_at_ms <= $1)
		FROM syncguard_locks`, f.NowMs).Scan(&f.LiveRows, &f.ExpiredRows); err != nil {
		return err
	}
	if err := d.admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks_shared WHERE expires_at_ms > $1`, f.NowMs).Scan(&f.LiveShared); err != nil {
		return err
	}
	if err := d.admin.QueryRow(ctx, `SELECT count(*) FROM syncguard_locks_queue WHERE expires_at_ms > $1`, f.NowMs).Scan(&f.LiveTickets); err != nil {
		return err
	}
	// A closed worker's sessions end when their backends see the closed
	// sockets, a moment after Close on a loaded machine: their locks are
	// counted after at most 5 s of that. A lock a live session still
	// holds stays counted.
	for settle := time.Now().Add(5 * time.Second); ; {
		if err := d.admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND pid <> pg_backend_pid()`).Scan(&f.AdvisoryLocks); err != nil {
			return err
		}
		if f.AdvisoryLocks == 0 || time.Now().After(settle) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if f.AdvisoryLocks > 0 {
		// Who holds them, for the run's log (the check only counts them).
		var who string
		if err := d.admin.QueryRow(ctx, `SELECT coalesce(string_agg(format('%s pid %s %s %s (advisory %s/%s/%s, backend started %s, client %s): %s', a.application_name, l.pid, a.state,
				l.mode, l.classid, l.objid, l.objsubid, a.backend_start, a.client_addr || ':' || a.client_port, left(a.query, 80)), '; '), '') FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()`).Scan(&who); err == nil {
			d.logf("advisory locks held at the end: %s", who)
		}
	}
	rows, err := d.admin.Query(ctx, "SELECT coalesce(key_debug, fence_key), fence FROM syncguard_fence_counters")
	if err != nil {
		return err
	}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return err
		}
		f.Fences[k] = n
	}
	rows.Close()
	rows, err = d.admin.Query(ctx, "SELECT key, coalesce(fence, 0), counter FROM soak_res")
	if err != nil {
		return err
	}
	for rows.Next() {
		var k int
		var fe, c int64
		if err := rows.Scan(&k, &fe, &c); err != nil {
			return err
		}
		f.Counters[k], f.ResFences[k] = c, fe
	}
	rows.Close()
	if err := writeJSON(filepath.Join(d.o.Dir, "final.json"), f); err != nil {
		return err
	}
	if err := d.copyOut(ctx, `SELECT row_to_json(t)::text FROM (SELECT seq, tg, user_key, id_hash, old_id_hash, fence, old_fence,
		acquired_ms, expires_ms, old_expires_ms, (extract(epoch FROM at) * 1e6)::bigint AS at_us, xid, app
		FROM soak_lock_log ORDER BY seq) t`, "lock_log.jsonl"); err != nil {
		return err
	}
	if err := d.copyOut(ctx, `SELECT row_to_json(t)::text FROM (SELECT seq, tg, user_key, grant_id, lim, fence,
		acquired_ms, expires_ms, (extract(epoch FROM at) * 1e6)::bigint AS at_us, xid, app
		FROM soak_shared_log ORDER BY seq) t`, "shared_log.jsonl"); err != nil {
		return err
	}
	if err := d.copyOut(ctx, `SELECT row_to_json(t)::text FROM (SELECT seq, tg, user_key, id_hash, grant_id, tseq, lim, set_no, expires_ms,
		(extract(epoch FROM at) * 1e6)::bigint AS at_us, xid FROM soak_queue_log ORDER BY seq) t`, "queue_log.jsonl"); err != nil {
		return err
	}
	return d.copyOut(ctx, `SELECT row_to_json(t)::text FROM (SELECT seq, key, old_fence, new_fence, old_counter, new_counter, op,
		(extract(epoch FROM at) * 1e6)::bigint AS at_us FROM soak_res_log ORDER BY seq) t`, "res_log.jsonl")
}

func (d *driver) copyOut(ctx context.Context, sql, name string) error {
	out, err := os.Create(filepath.Join(d.o.Dir, name))
	if err != nil {
		return err
	}
	defer out.Close()
	rows, err := d.admin.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		if _, err := out.WriteString(s + "\n"); err != nil {
			return err
		}
	}
	return rows.Err()
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
