package manager

import "time"

// hooks are the internal instrumentation points, for the telemetry
// package to fill in later. Every field may be nil; the methods are
// nil-safe. They receive key hashes (pglease.HashKey), never raw keys or
// lockIds, and must not block: the loop calls some of them.
type hooks struct {
	acquireStart func(keyHash string)                                 // a caller started waiting (loop)
	acquireEnd   func(keyHash string, err error, wait time.Duration)  // a caller's wait ended (caller goroutine)
	batchStart   func(kind string, n int)                             // a batch is about to be sent (DB goroutine)
	batchEnd     func(kind string, n int, err error, d time.Duration) // a batch came back (DB goroutine)
	extendRound  func(n int)                                          // a heartbeat tick sent n extends (loop)
	lost         func(keyHash string, reason string)                  // a held lock was declared lost (loop)
}

func (h *hooks) onAcquireStart(keyHash string) {
	if h.acquireStart != nil {
		h.acquireStart(keyHash)
	}
}

func (h *hooks) onAcquireEnd(keyHash string, err error, wait time.Duration) {
	if h.acquireEnd != nil {
		h.acquireEnd(keyHash, err, wait)
	}
}

func (h *hooks) onBatchStart(kind batchKind, n int) {
	if h.batchStart != nil {
		h.batchStart(string(kind), n)
	}
}

func (h *hooks) onBatchEnd(kind batchKind, n int, err error, d time.Duration) {
	if h.batchEnd != nil {
		h.batchEnd(string(kind), n, err, d)
	}
}

func (h *hooks) onExtendRound(n int) {
	if h.extendRound != nil {
		h.extendRound(n)
	}
}

func (h *hooks) onLost(keyHash, reason string) {
	if h.lost != nil {
		h.lost(keyHash, reason)
	}
}
