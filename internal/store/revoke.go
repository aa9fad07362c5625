package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// RevokeRequest is one item of Revoke.
type RevokeRequest struct {
	// Key is the key whose live holds are revoked, whatever their lockIds.
	Key string
	// Hold, if not "", names the one hold of Key to revoke (exclusive or
	// shared): the pglease.HashKey of its lockId (24 hex digits) or its
	// grant id (pg.GrantID, 64 hex digits). "" revokes every live hold of
	// the key: its exclusive lease, or all its readers or permits.
	Hold string
	// Delay, if positive (whole milliseconds, at most keys.MaxTTL), keeps
	// the key from every acquire (exclusive, shared, set, handoff) for
	// that long after a revoke that deleted something; 0 uses the revoked
	// exclusive grant's own lock delay (AcquireRequest.LockDelay), if it
	// had one.
	Delay time.Duration
}

// Format never prints the key.
func (r RevokeRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.RevokeRequest{Key:%s Hold:%s Delay:%v}", pglease.HashKey(r.Key), r.Hold, r.Delay)
}

// RevokeResult answers one Revoke item.
type RevokeResult struct {
	// Revoked counts the live holds deleted (live for acquirers:
	// expires_at + 1 s after the server's clock); 0: nothing changed.
	Revoked int
	// Exclusive: the key's exclusive lease was one of them (the first of
	// LockIDHashes and Fences).
	Exclusive bool
	// LockIDHashes are pglease.HashKey of the revoked holds' lockIds, and
	// Fences their fences.
	LockIDHashes []string
	Fences       []pglease.Fence
	// DelayUntil is when a lock delay in force after the revoke ends: the
	// revoke's own, an earlier revoke's, or that of an expired lease the
	// revoke left in place (zero when none: the key can be granted at
	// once unless it is still held).
	DelayUntil time.Time
}

// ValidHold reports whether h names a hold for RevokeRequest.Hold and
// RequestRelease: a pglease.HashKey of a lockId (24 lowercase hex
// digits) or a grant id (pg.GrantID: 64).
func ValidHold(h string) bool {
	return isHash(h) || isGrantID(h)
}

// HoldMatches reports whether hold (ValidHold, or "" for every hold)
// names the hold whose lockId is lockID.
func HoldMatches(hold, lockID string) bool {
	switch len(hold) {
	case 0:
		return true
	case hashLen:
		return pglease.HashKey(lockID) == hold
	case grantIDLen:
		return grantID(lockID) == hold
	}
	return false
}

// grantIDLen is the length of a grant id: 64 hex digits.
const grantIDLen = 64

// grantID is pg.GrantID of lockID, as the revoke function computes it.
func grantID(lockID string) string {
	sum := sha256.Sum256([]byte("pglease grant v1\x00" + lockID))
	return hex.EncodeToString(sum[:])
}

func isGrantID(s string) bool {
	return len(s) == grantIDLen && isHex(s)
}

// Revoke deletes the live holds of each item's key (all of them, or the
// one named by Hold), whatever their lockIds, in one statement (one round
// trip, durable); results[i] answers reqs[i]. Keys are revoked in the
// acquire's global key order, each under the key's advisory lock, so a
// revoke and an acquire of a key are serialized; the delete waits for
// transactions that guard the lease (Guard), so their writes come before
// the revoke. A hold that is not live is left alone: an expired lease's
// row stays, and with it its lock delay (a revoke never frees a key before
// its expiry would).
//
// For each hold revoked, with Config.NotifyChannel set, the channel gets
// "r:" + HashKey(key) + ":" + HashKey(lockId) (always: the holder's
// Manager listens; see ParseNotification), the key's waiters are woken
// (its hash, when a session waits for it, as ReleaseWaited does) and its
// watchers told ("w:…:v:" for the exclusive lease, "w:…:u:" for a shared
// hold). The revoked holder learns of it from that notification or at its
// next extend, which fails.
//
// Invalid input anywhere fails the whole call before I/O.
func (s *Store) Revoke(ctx context.Context, reqs []RevokeRequest) ([]RevokeResult, error) {
	const op = "pg.Revoke"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	ks := make([]string, len(reqs))
	delays := make([]int64, len(reqs))
	holds := make([]*string, len(reqs))
	for i, r := range reqs {
		sk, _, err := storageKey(op, r.Key)
		if err != nil {
			return nil, err
		}
		if err := checkDelay(op, "Delay", r.Delay); err != nil {
			return nil, err
		}
		if r.Hold != "" {
			if !ValidHold(r.Hold) {
				return nil, pgerr.New(pglease.CodeInvalidArgument, op,
					"a hold is named by its lockId's hash (24 lowercase hex digits) or its grant id (64)", nil)
			}
			holds[i] = &reqs[i].Hold
		}
		ks[i], delays[i] = sk, r.Delay.Milliseconds()
	}
	if len(reqs) == 0 {
		return []RevokeResult{}, nil
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	out := make([]RevokeResult, len(reqs))
	got := make([]bool, len(reqs))
	err := s.run(ctx, op, true, s.revokeSQL, []any{ks, delays, holds, s.channelArg()}, func(rows pgx.Rows) error {
		var idx, revoked int32
		var exclusive bool
		var hashes []string
		var fences []*int64
		var until *int64
		if err := rows.Scan(&idx, &revoked, &exclusive, &hashes, &fences, &until); err != nil {
			return err
		}
		i := int(idx) - 1
		if i < 0 || i >= len(out) || got[i] {
			return errors.New("pg: bad result index from revoke function")
		}
		got[i] = true
		if int(revoked) != len(hashes) || len(hashes) != len(fences) {
			return errors.New("pg: revoke without the lockIds' hashes")
		}
		r := RevokeResult{Revoked: int(revoked), Exclusive: exclusive && revoked > 0, LockIDHashes: hashes, Fences: make([]pglease.Fence, len(fences))}
		for j, f := range fences {
			if f != nil {
				r.Fences[j] = pglease.Fence(*f)
			}
		}
		if until != nil {
			r.DelayUntil = time.UnixMilli(*until)
		}
		out[i] = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "revoke function returned too few rows", nil)
		}
	}
	return out, nil
}

// RequestRelease asks the holders of each key to release it, without
// taking anything: one statement sends "q:" + HashKey(key) on
// Config.NotifyChannel for each key, followed by ":" + holds[i] when
// holds is not nil and holds[i] is not "" (one hold, named as
// RevokeRequest.Hold; see ParseNotification); a holder's Manager tells
// the lock's holder (every lock of the key it holds, or the one named),
// which decides. Nothing is written. It needs Config.NotifyChannel
// (InvalidArgument otherwise, before any I/O, like bad keys and holds).
func (s *Store) RequestRelease(ctx context.Context, ks []string, holds []string) error {
	const op = "pg.RequestRelease"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if s.cfg.NotifyChannel == "" {
		return pgerr.New(pglease.CodeInvalidArgument, op, "no NotifyChannel: nobody would hear the request", nil)
	}
	if len(ks) > MaxBatch {
		return pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	if holds != nil && len(holds) != len(ks) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "one hold per key, or none", nil)
	}
	payloads := make([]string, len(ks))
	for i, k := range ks {
		nk, err := keys.NormalizeKey(k)
		if err != nil {
			return WithOp(op, err)
		}
		payloads[i] = "q:" + pglease.HashKey(nk)
		if holds != nil && holds[i] != "" {
			if !ValidHold(holds[i]) {
				return pgerr.New(pglease.CodeInvalidArgument, op,
					"a hold is named by its lockId's hash (24 lowercase hex digits) or its grant id (64)", nil)
			}
			payloads[i] += ":" + holds[i]
		}
	}
	if len(ks) == 0 {
		return nil
	}
	return s.run(ctx, op, false, "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p", []any{s.cfg.NotifyChannel, payloads},
		func(pgx.Rows) error { return nil })
}

// NotificationKind says what a payload on the notify channel announces.
type NotificationKind uint8

// The notification kinds (see ParseNotification).
const (
	// NotifyWake: a key was released (or a SyncGuard release fired the
	// release trigger, or a revoke freed it): its waiters try again.
	// Payload: HashKey(key).
	NotifyWake NotificationKind = iota + 1
	// NotifyRevoke: the hold (exclusive or shared) with lockId hash
	// LockIDHash was revoked. Payload: "r:" + HashKey(key) + ":" +
	// HashKey(lockId).
	NotifyRevoke
	// NotifyReleaseRequest: someone asks the key's holders to release it
	// (RequestRelease): all of them, or the one named by Hold. Payload:
	// "q:" + HashKey(key), then ":" + the hold when one is named.
	NotifyReleaseRequest
	// NotifyWatch: a change of a watched key (Event, Fence). Payload:
	// "w:" + HashKey(key) + ":" + event letter + ":" + the fence in 15
	// digits.
	NotifyWatch
)

// WatchEvent is the change a NotifyWatch notification announces.
type WatchEvent byte

// The watch events, with their payload letters.
const (
	WatchGranted        WatchEvent = 'g' // an exclusive grant (acquire, set, handoff); Fence: the grant's
	WatchReleased       WatchEvent = 'r' // an exclusive release; Fence: the released grant's
	WatchRevoked        WatchEvent = 'v' // a revoke; Fence: the revoked grant's
	WatchSharedGranted  WatchEvent = 's' // a shared hold granted; Fence: the hold's
	WatchSharedReleased WatchEvent = 'u' // a shared hold released; Fence: the hold's
)

// Notification is a parsed payload of the notify channel.
type Notification struct {
	Kind NotificationKind
	// KeyHash is HashKey of the key the notification is about.
	KeyHash string
	// LockIDHash is set for NotifyRevoke.
	LockIDHash string
	// Hold, for NotifyReleaseRequest, names the one hold asked (as
	// RevokeRequest.Hold); "" asks every holder of the key.
	Hold string
	// Event and Fence are set for NotifyWatch.
	Event WatchEvent
	Fence pglease.Fence
}

// hashLen is the length of a HashKey: 24 hex digits.
const hashLen = 24

func isHash(s string) bool {
	return len(s) == hashLen && isHex(s)
}

// isHex: s is lowercase hex digits.
func isHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ParseNotification parses a payload of the notify channel: a wake-up
// (a key's hash, what releases have always sent), a revoke ("r:"), a
// release request ("q:", of every hold or one) or a watch event ("w:"). ok is false for
// anything else (another program's payload on the channel), which a
// listener ignores.
func ParseNotification(payload string) (n Notification, ok bool) {
	if isHash(payload) {
		return Notification{Kind: NotifyWake, KeyHash: payload}, true
	}
	kind, rest, found := strings.Cut(payload, ":")
	if !found {
		return Notification{}, false
	}
	parts := strings.Split(rest, ":")
	if !isHash(parts[0]) {
		return Notification{}, false
	}
	n.KeyHash = parts[0]
	switch {
	case kind == "q" && len(parts) == 1:
		n.Kind = NotifyReleaseRequest
	case kind == "q" && len(parts) == 2 && ValidHold(parts[1]):
		n.Kind, n.Hold = NotifyReleaseRequest, parts[1]
	case kind == "r" && len(parts) == 2 && isHash(parts[1]):
		n.Kind, n.LockIDHash = NotifyRevoke, parts[1]
	case kind == "w" && len(parts) == 3 && len(parts[1]) == 1 && strings.Contains("grvsu", parts[1]):
		f, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil || f < 0 {
			return Notification{}, false
		}
		n.Kind, n.Event, n.Fence = NotifyWatch, WatchEvent(parts[1][0]), pglease.Fence(f)
	default:
		return Notification{}, false
	}
	return n, true
}

// KeyState is the state of a key read by Snapshot.
type KeyState struct {
	// Now is the server's clock at the read.
	Now time.Time
	// Held: the key has a live exclusive lease (for acquirers:
	// ExpiresAt + 1 s after Now). LockIDHash, Fence, AcquiredAt,
	// ExpiresAt, Holder and LockDelay describe its exclusive row, also
	// when that has expired (LockIDHash "" when there is none).
	Held                  bool
	LockIDHash            string
	Fence                 pglease.Fence
	AcquiredAt, ExpiresAt time.Time
	Holder                string
	LockDelay             time.Duration
	// Shared counts the live shared holds, of limit Limit (0: readers),
	// the latest expiring at SharedExpiresAt.
	Shared          int
	Limit           int
	SharedExpiresAt time.Time
	// Counter is the key's fence counter (0: never granted).
	Counter pglease.Fence
	// DelayUntil is a revoke's delay end, WriterWaitingUntil an
	// exclusive waiter's mark (zero when none, or past).
	DelayUntil, WriterWaitingUntil time.Time
	// Busy: a change of the key was in flight (its advisory lock or rows
	// held by another transaction), so it was not read: every other field
	// is zero. Read it again later.
	Busy bool
}

// Snapshot reads the state of each key in one statement (one round
// trip); results[i] answers ks[i]. A key is read only when no change of
// it is in flight: per key, in the global key order, it takes the key's
// advisory lock shared (acquires, handoffs and revokes hold it
// exclusively) and its rows FOR KEY SHARE (a release's delete excludes
// that), then reads. So a watcher that registered its watch lock
// (RegisterWatchers) and then calls Snapshot misses no final state: a
// change either saw the lock and notifies, or committed before the read.
// It never waits for those locks: a key whose change is in flight is
// answered Busy (a takeover waiting for a transaction that guards the
// lease holds its lock for as long), so that it does not hold up the
// other keys' reads. It does not block extends, guards, or other
// snapshots.
func (s *Store) Snapshot(ctx context.Context, ks []string) ([]KeyState, error) {
	const op = "pg.Snapshot"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(ks) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	sks := make([]string, len(ks))
	for i, k := range ks {
		sk, _, err := storageKey(op, k)
		if err != nil {
			return nil, err
		}
		sks[i] = sk
	}
	if len(ks) == 0 {
		return []KeyState{}, nil
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	out := make([]KeyState, len(ks))
	got := make([]bool, len(ks))
	err := s.run(ctx, op, false, s.snapshotSQL, []any{sks}, func(rows pgx.Rows) error {
		var idx int32
		var nowp *int64
		var lockHash, holder *string
		var fence, acq, exp, delay, sexp, counter, until, wait *int64
		var limit *int32
		var shared *int64
		if err := rows.Scan(&idx, &nowp, &lockHash, &fence, &acq, &exp, &holder, &delay, &shared, &limit, &sexp, &counter, &until, &wait); err != nil {
			return err
		}
		i := int(idx) - 1
		if i < 0 || i >= len(out) || got[i] {
			return errors.New("pg: bad result index from snapshot function")
		}
		got[i] = true
		if nowp == nil {
			out[i] = KeyState{Busy: true}
			return nil
		}
		now := *nowp
		st := KeyState{Now: time.UnixMilli(now)}
		if shared != nil {
			st.Shared = int(*shared)
		}
		if lockHash != nil && exp != nil && acq != nil {
			st.LockIDHash, st.AcquiredAt, st.ExpiresAt = *lockHash, time.UnixMilli(*acq), time.UnixMilli(*exp)
			st.Held = *exp+keys.TimeToleranceMs > now
			if fence != nil {
				st.Fence = pglease.Fence(*fence)
			}
			if holder != nil && checkHolder("", *holder) == nil {
				st.Holder = *holder
			}
			if delay != nil {
				st.LockDelay = time.Duration(*delay) * time.Millisecond
			}
		}
		if limit != nil {
			st.Limit = int(*limit)
		}
		if sexp != nil {
			st.SharedExpiresAt = time.UnixMilli(*sexp)
		}
		if counter != nil {
			st.Counter = pglease.Fence(*counter)
		}
		if until != nil && *until > now {
			st.DelayUntil = time.UnixMilli(*until)
		}
		if wait != nil && *wait > now {
			st.WriterWaitingUntil = time.UnixMilli(*wait)
		}
		out[i] = st
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "snapshot function returned too few rows", nil)
		}
	}
	return out, nil
}
