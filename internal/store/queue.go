package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
)

// The fair queue (docs/fairness.md): a ticket per waiting caller in the
// {lock}_queue table, in arrival order; a release serves the head in its
// own transaction and notifies only the head's process, on that
// process's own channel (QueueChannel).

// QueueChannelPrefix starts every per-process queue channel.
const QueueChannelPrefix = "pglease_q_"

// MinTicketLife and MaxTicketLife bound a ticket's life (QueueWait,
// QueueRefresh): the longest a dead waiter's ticket can keep its key's
// queue waiting after its last refresh.
const (
	MinTicketLife = 100 * time.Millisecond
	MaxTicketLife = time.Minute
)

// QueueChannel returns a new channel name for one process's queue
// notifications: QueueChannelPrefix and 16 random hex digits. The process
// LISTENs on it (a session of its own) while it has tickets; nothing else
// is ever sent there.
func QueueChannel() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return QueueChannelPrefix + hex.EncodeToString(b[:])
}

// WaitRequest is one item of QueueWait: an acquire that keeps a place in
// the key's queue while it is refused.
type WaitRequest struct {
	// Key, TTL and LockDelay are the grant's, as in AcquireRequest.
	// LockID is required: it is the ticket's identity, and the grant's
	// lockId. Every attempt of one wait must use the same LockID, or it
	// goes to the tail.
	Key       string
	TTL       time.Duration
	LockID    string
	LockDelay time.Duration
	// Shared makes the item a shared hold: a reader with Limit 0, a
	// permit of a semaphore of Limit otherwise. Sets are exclusive.
	Shared bool
	Limit  int
	// Set is 0 for a single-key item, k > 0 for an item of the batch's
	// set k: a set is granted whole or not at all, and all its tickets
	// are enqueued together.
	Set int
	// Refresh (single-key items only): the ticket was queued by an
	// earlier statement, and this one only refreshes it. When it is gone
	// and its lockId holds no live lease (it expired, or its grant came
	// and has ended), the item is answered Gone instead of being queued
	// again: a statement still in flight when its waiter's grant came and
	// went must not queue that lockId anew, for a grant nobody waits for.
	Refresh bool
}

// Format never prints the key or lockId.
func (r WaitRequest) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "store.WaitRequest{Key:%s TTL:%v LockID:[redacted] Shared:%v Limit:%d Set:%d Refresh:%v}",
		pglease.HashKey(r.Key), r.TTL, r.Shared, r.Limit, r.Set, r.Refresh)
}

// WaitResult answers one QueueWait item: the AcquireResult of an
// attempt, and when refused, the ticket's place in line.
type WaitResult struct {
	AcquireResult
	// Position is the ticket's place among its key's live tickets (1:
	// the head) when the item was refused and is queued; 0 when granted,
	// or when it could not be queued this time (the key was locked past
	// the bounded wait, or its set's other key was: try again after
	// RetryAfter).
	Position int
	// Gone: a Refresh item whose ticket is gone and whose lockId holds no
	// lease; it was not queued again (OK false, Position 0).
	Gone bool
}

// QueueWait tries each item once, in one statement (one round trip),
// keeping its place in the key's queue when refused: the fair queue's
// attempt. Under each key's advisory lock (taken in the acquire's global
// key order), the key's expired tickets are dropped and the item's ticket
// refreshed (to live life more) or enqueued at the tail; the item is
// granted when its ticket may go (an exclusive ticket at the head, a
// reader with no writer or permit ahead, a permit with nothing ahead; a
// set when each of its tickets may) and the key can be granted by the
// acquire's rules (AcquireMany, AcquireSharedMany, AcquireSets). A grant
// deletes the ticket. qchannel (QueueChannel) is where a release that
// serves the ticket later tells this process (see ParseTurn). life is the
// ticket's life (MinTicketLife..MaxTicketLife): refresh it (QueueRefresh)
// at least every life/3, or it expires and loses its place. A statement
// that grants an item, or answers one granted, commits durably like an
// acquire; one that only queues, refreshes or refuses does not wait for
// its WAL flush (a ticket lost in a server crash is only a place: the
// waiter's next refresh finds it gone, and its next attempt queues it
// again), so the key's advisory lock is not held through a flush that a
// release serving the key would wait for. Invalid input anywhere fails
// the whole call before I/O.
func (s *Store) QueueWait(ctx context.Context, reqs []WaitRequest, qchannel string, life time.Duration) ([]WaitResult, error) {
	const op = "pg.QueueWait"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	if err := checkQueueArgs(op, qchannel, life); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return []WaitResult{}, nil
	}
	acq := make([]AcquireRequest, len(reqs))
	sets := make([]int32, len(reqs))
	limits := make([]*int32, len(reqs))
	setKeys := map[[2]string]struct{}{}
	var refresh []bool // nil: no Refresh item (the function's default)
	for i, r := range reqs {
		if r.LockID == "" {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "LockID is required: it is the ticket's identity", nil)
		}
		if r.Set < 0 || r.Set > len(reqs) {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "Set must be 0 or a set number of the batch (1..items)", nil)
		}
		if r.Shared {
			if r.Set != 0 {
				return nil, pgerr.New(pglease.CodeInvalidArgument, op, "a set's items are exclusive", nil)
			}
			if r.Limit < 0 || r.Limit > math.MaxInt32 {
				return nil, pgerr.New(pglease.CodeInvalidArgument, op, "Limit must be 0 (a reader) or a positive int32 (a permit)", nil)
			}
			l := int32(r.Limit)
			limits[i] = &l
		}
		if r.Set > 0 {
			k, err := keys.NormalizeKey(r.Key)
			if err != nil {
				return nil, WithOp(op, err)
			}
			sk := [2]string{strconv.Itoa(r.Set), k}
			if _, dup := setKeys[sk]; dup {
				return nil, pgerr.New(pglease.CodeInvalidArgument, op, "a key given twice in one set", nil)
			}
			setKeys[sk] = struct{}{}
		}
		if r.Refresh {
			if r.Set != 0 {
				return nil, pgerr.New(pglease.CodeInvalidArgument, op, "Refresh is for single-key items", nil)
			}
			if refresh == nil {
				refresh = make([]bool, len(reqs))
			}
			refresh[i] = true
		}
		acq[i] = AcquireRequest{Key: r.Key, TTL: r.TTL, LockID: r.LockID, LockDelay: r.LockDelay}
		sets[i] = int32(r.Set)
	}
	p, err := prepareAcquire(op, acq)
	if err != nil {
		return nil, err
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	out := make([]WaitResult, len(reqs))
	got := make([]bool, len(reqs))
	q := "SELECT " + acquireCols + ", o_limit, o_position FROM " + s.n.FnQWait + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
	args := []any{sets, p.keys, p.fenceKeys, p.ids, p.ttls, p.delays, limits, s.holderArg(), s.channelArg(), qchannel, life.Milliseconds()}
	if refresh != nil {
		q = q[:len(q)-1] + ", $12)"
		args = append(args, refresh)
	}
	if oneKeyWait(reqs, p.keys, p.ids) {
		// The common wait: the lighter function of one key's items, which
		// answers as the batch function does.
		q = s.qwait1SQL
		args = []any{p.keys[0], p.fenceKeys[0], p.ids, p.ttls, p.delays, s.holderArg(), s.channelArg(), qchannel, life.Milliseconds()}
	}
	err = s.run(ctx, op, true, q, args, func(rows pgx.Rows) error {
		var lim *int32
		var pos *int64
		g, err := scanGrant(rows, &lim, &pos)
		if err != nil {
			return err
		}
		i := int(g.idx) - 1
		if i < 0 || i >= len(out) || got[i] || g.status == 3 || g.status == 4 {
			return errors.New("pg: bad result from queue wait function")
		}
		got[i] = true
		if g.status == 5 {
			if refresh == nil || !refresh[i] {
				return errors.New("pg: gone answered for an item that did not only refresh")
			}
			out[i].Gone = true
			return nil
		}
		out[i].AcquireResult, err = g.result(op, p.ids[i])
		if pos != nil && g.status == 1 {
			out[i].Position = int(*pos)
			// Behind others at a free key (the head, refused at a free
			// key, waits for its set's other keys).
			out[i].Queued = g.unnamed() && *pos > 1
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		if !got[i] {
			return nil, pgerr.New(pglease.CodeAmbiguous, op, "queue wait function returned too few rows", nil)
		}
	}
	res := make([]AcquireResult, len(out))
	for i := range out {
		res[i] = out[i].AcquireResult
	}
	s.warnFences(p.keys, res)
	return out, nil
}

// oneKeyWait reports whether a wait's items (keys and ids as prepared)
// are exclusive single-key items of one key that only wait (no refresh),
// with distinct lockIds: the case of the lighter queue function.
func oneKeyWait(reqs []WaitRequest, keys, ids []string) bool {
	for i, r := range reqs {
		if r.Shared || r.Set != 0 || r.Refresh || keys[i] != keys[0] || slices.Contains(ids[:i], ids[i]) {
			return false
		}
	}
	return true
}

func checkQueueArgs(op, qchannel string, life time.Duration) error {
	if !strings.HasPrefix(qchannel, QueueChannelPrefix) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "the queue channel must come from QueueChannel", nil)
	}
	if err := CheckChannel(op, qchannel); err != nil {
		return err
	}
	if life < MinTicketLife || life > MaxTicketLife || life%time.Millisecond != 0 {
		return pgerr.New(pglease.CodeInvalidArgument, op, "a ticket's life must be a whole number of milliseconds from 100 ms to 1 min", nil)
	}
	return nil
}

// TicketState answers one QueueRefresh item.
type TicketState struct {
	// Position is the live ticket's place in its key's queue (1: the
	// head); 0 when the lockId has no live ticket.
	Position int
	// Granted: no ticket, but the lockId holds a live lease (a release
	// served the ticket; its notification may have been missed), with
	// its Fence and ExpiresAt (server time). Neither: the ticket expired
	// or left; enqueue again (at the tail).
	Granted   bool
	Fence     pglease.Fence
	ExpiresAt time.Time
}

// QueueRefresh extends the life of each lockId's live ticket to life
// (MinTicketLife..MaxTicketLife) from the server's now, in one statement
// (one round trip; an expired ticket is not revived), and says where each
// stands. The waiting process calls it for all its tickets at least every
// life/3: a dead process's tickets stop blocking their keys at most life
// after its last refresh. It commits without waiting for its WAL flush
// (a lost refresh only shortens a ticket's life), unless it answers a
// grant (Granted): then its commit is durable and waits for a synchronous
// standby, as the grant's did, and a commit the server warned about (a
// cancelled wait for the standby) is Ambiguous, not an answer: the grant
// may be on the primary alone. Bad lockIds are InvalidArgument before
// I/O.
func (s *Store) QueueRefresh(ctx context.Context, lockIDs []string, life time.Duration) ([]TicketState, error) {
	const op = "pg.QueueRefresh"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if life < MinTicketLife || life > MaxTicketLife || life%time.Millisecond != 0 {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "a ticket's life must be a whole number of milliseconds from 100 ms to 1 min", nil)
	}
	if err := s.checkIDs(op, lockIDs); err != nil {
		return nil, err
	}
	if len(lockIDs) == 0 {
		return []TicketState{}, nil
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	out := make([]TicketState, len(lockIDs))
	n := 0
	q := "SELECT o_idx, o_position, o_fence, o_expires_ms FROM " + s.n.FnQRefresh + "($1, $2)"
	err := s.run(ctx, op, true, q, []any{lockIDs, life.Milliseconds()}, func(rows pgx.Rows) error {
		var idx int32
		var pos, fence, exp *int64
		if err := rows.Scan(&idx, &pos, &fence, &exp); err != nil {
			return err
		}
		if idx < 1 || int(idx) > len(out) {
			return errors.New("pg: bad result index from queue refresh function")
		}
		t := &out[idx-1]
		if pos != nil {
			t.Position = int(*pos)
		} else if fence != nil && exp != nil {
			t.Granted, t.Fence, t.ExpiresAt = true, pglease.Fence(*fence), time.UnixMilli(*exp)
		}
		n++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if n != len(lockIDs) {
		return nil, pgerr.New(pglease.CodeAmbiguous, op, "queue refresh function returned a wrong row count", nil)
	}
	return out, nil
}

// QueueReleaseResult answers one QueueRelease item.
type QueueReleaseResult struct {
	// Released: the lockId held a live lease and it is released.
	Released bool
	// Served is the number of grants the release made from the key's
	// queue (on the key's first item of the batch; 0 on the others).
	Served int
	// Turns are the notices for tickets on QueueRelease's self channel,
	// which the release returns instead of sending them (on the batch's
	// first item only): the grants and turns of the releasing process's
	// own waiters, in the answer, with no notification.
	Turns []Turn
}

// QueueRelease releases every item's lockId (exclusive or shared) like
// ReleaseWaited (one statement, one round trip; the same waiter-lock
// notification for processes that do not queue) and, with grant, serves
// each released key's queue in the same transaction: the head ticket is
// granted (exclusive; readers in a row; permits while the semaphore has
// room) with a new fence above every earlier one, its holder row and an
// expiry of now + its TTL, its ticket deleted, and its process alone told
// on its queue channel (ParseTurn). A head that is a set's ticket is told
// its turn and left the key free. The keys' advisory locks are taken
// first (100 ms at most: a key locked longer by another transaction is
// released without being served, its head told its turn). grant false
// (a key left to foreign pollers, see docs/fairness.md) releases only.
// Durable when it granted; otherwise it need not wait for its WAL flush,
// as ReleaseWaited. self, when not empty, is the caller's own queue
// channel (the one its QueueWait calls name): notices for its tickets are
// not sent but returned in the first item's Turns, so a waiter of the
// releasing process is granted with the release's answer, without a
// notification round. The answer is only returned by a commit that
// succeeded; when the outcome is unknown the waiter's next refresh finds
// the grant (QueueRefresh). In a transaction (the Store made on a pgx.Tx)
// self is ignored: the notices go at commit. Invalid input anywhere fails
// the whole call before I/O.
func (s *Store) QueueRelease(ctx context.Context, reqs []ReleaseRequest, grant bool, self string) ([]QueueReleaseResult, error) {
	const op = "pg.QueueRelease"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if len(reqs) > MaxBatch {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "batch too large", nil)
	}
	ids := make([]string, len(reqs))
	var key0 string // the first item's key as the lock row holds it
	for i, r := range reqs {
		if err := keys.ValidateLockID(r.LockID); err != nil {
			return nil, WithOp(op, err)
		}
		k, err := keys.NormalizeKey(r.Key)
		if err != nil {
			return nil, WithOp(op, err)
		}
		if i == 0 {
			key0 = k
		}
		ids[i] = r.LockID
	}
	if len(reqs) == 0 {
		return []QueueReleaseResult{}, nil
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	_, inTx := s.db.(pgx.Tx)
	var selfArg *string
	if self != "" && !inTx {
		selfArg = &self
	}
	out := make([]QueueReleaseResult, len(ids))
	n := 0
	q := "SELECT o_idx, o_ok, o_served, o_turns FROM " + s.n.FnQRelease + "($1, $2, $3, $4, $5, $6)"
	args := []any{ids, s.channelArg(), wakeWaited, grant, !inTx, selfArg}
	if len(reqs) == 1 && grant {
		// The common hand-over: the lighter function of plain arguments,
		// which answers as the batch function does.
		q = s.qrelease1SQL
		args = []any{ids[0], key0, s.channelArg(), wakeWaited, grant, !inTx, selfArg}
	}
	err := s.run(ctx, op, true, q, args, func(rows pgx.Rows) error {
		var idx, served int32
		var ok bool
		var turns *string
		if err := rows.Scan(&idx, &ok, &served, &turns); err != nil {
			return err
		}
		if idx < 1 || int(idx) > len(out) {
			return errors.New("pg: bad result index from queue release function")
		}
		r := QueueReleaseResult{Released: ok, Served: int(served)}
		if turns != nil {
			for _, p := range strings.Fields(*turns) {
				t, ok := ParseTurn(p)
				if !ok {
					return errors.New("pg: bad turn from queue release function")
				}
				r.Turns = append(r.Turns, t)
			}
		}
		out[idx-1] = r
		n++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if n != len(ids) {
		return nil, pgerr.New(pglease.CodeAmbiguous, op, "queue release function returned a wrong row count", nil)
	}
	return out, nil
}

// LeaveResult answers one QueueLeave item.
type LeaveResult struct {
	// Left: the lockId's ticket was queued and is gone.
	Left bool
	// Released: it had no ticket but held a live lease (a release served
	// it while the caller gave up), now released.
	Released bool
}

// QueueLeave takes each lockId's ticket out of its key's queue (a caller
// that gives up: timeout, cancel, Close), in one statement, under the
// keys' advisory locks (1 s at most: a key locked longer by another
// transaction has its ticket dropped without the lock, and its queue not
// served); a lease the lockId was granted meanwhile is released, and each
// key's queue is served (a head that left lets the next ticket go at
// once). Durable. Bad lockIds are InvalidArgument before I/O.
func (s *Store) QueueLeave(ctx context.Context, lockIDs []string) ([]LeaveResult, error) {
	const op = "pg.QueueLeave"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	if err := s.checkIDs(op, lockIDs); err != nil {
		return nil, err
	}
	if len(lockIDs) == 0 {
		return []LeaveResult{}, nil
	}
	if err := s.checkOnce(ctx, op); err != nil {
		return nil, err
	}
	out := make([]LeaveResult, len(lockIDs))
	n := 0
	q := "SELECT o_idx, o_left, o_released FROM " + s.n.FnQLeave + "($1, $2)"
	err := s.run(ctx, op, true, q, []any{lockIDs, s.channelArg()}, func(rows pgx.Rows) error {
		var idx int32
		var left, rel bool
		if err := rows.Scan(&idx, &left, &rel); err != nil {
			return err
		}
		if idx < 1 || int(idx) > len(out) {
			return errors.New("pg: bad result index from queue leave function")
		}
		out[idx-1] = LeaveResult{Left: left, Released: rel}
		n++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if n != len(lockIDs) {
		return nil, pgerr.New(pglease.CodeAmbiguous, op, "queue leave function returned a wrong row count", nil)
	}
	return out, nil
}

// Turn is a queue notification (ParseTurn): a release served a ticket of
// this process (Granted, with the grant's Fence and server ExpiresAt), or
// told it its turn (not Granted: a set's head, or a key a release could
// not serve: attempt it now with QueueWait).
type Turn struct {
	KeyHash  string // hashKey of the key
	LockHash string // hashKey of the ticket's lockId (pglease.HashKey)
	Granted  bool
	Fence    pglease.Fence
	// ExpiresAt is the grant's server expiry. Trust it from the local
	// send time of the latest statement that answered the ticket still
	// queued (QueueWait or QueueRefresh) plus the TTL: the grant came
	// after it.
	ExpiresAt time.Time
	// Unconfirmed marks a grant whose commit waited for a synchronous
	// standby: the notice may come from a commit whose wait was cancelled,
	// the grant on the primary alone, so it is not a grant until a commit
	// of the waiter's own (its next attempt) confirms it.
	Unconfirmed bool
}

// ParseTurn parses a payload of a queue channel:
// "q:" hashKey(key) ":" hashKey(lockId) ":" fence ":" expires_at_ms
// (fence and expiry 0 for a turn without a grant), then ":s" when the
// grant's commit waited for a synchronous standby (Turn.Unconfirmed).
func ParseTurn(payload string) (Turn, bool) {
	f := strings.Split(payload, ":")
	unconfirmed := len(f) == 6 && f[5] == "s"
	if unconfirmed {
		f = f[:5]
	}
	if len(f) != 5 || f[0] != "q" || len(f[1]) != 24 || len(f[2]) != 24 {
		return Turn{}, false
	}
	fence, err1 := strconv.ParseInt(f[3], 10, 64)
	exp, err2 := strconv.ParseInt(f[4], 10, 64)
	if err1 != nil || err2 != nil || fence < 0 || exp < 0 {
		return Turn{}, false
	}
	t := Turn{KeyHash: f[1], LockHash: f[2]}
	if fence > 0 || exp > 0 {
		t.Granted, t.Fence, t.ExpiresAt, t.Unconfirmed = true, pglease.Fence(fence), time.UnixMilli(exp), unconfirmed
	}
	return t, true
}
