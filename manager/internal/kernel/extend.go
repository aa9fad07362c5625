package kernel

// Manual extends (Lock.Extend) go through the loop like the heartbeat's:
// the lease joins the next extend batch, and its callers are answered
// when that batch's result arrives (handleExtendDone → answerExtends) or,
// if the lock ends first, by dropHolding.

// handleExtend queues req.lock's lease for the next extend batch.
func (st *LoopState) handleExtend(req *ExtendReq) {
	h := req.Lock.h
	if _, ok := st.held[h]; !ok || h == nil {
		req.Reply <- EndedExtend(req.Lock.Err())
		return
	}
	if c := req.Lock.Err(); c != nil {
		// Its loss timer fired; the loop drops it on the nudge that
		// follows (lossCh).
		req.Reply <- EndedExtend(c)
		return
	}
	if h.ext == nil {
		h.ext = &extWaiters{}
	}
	h.ext.want = append(h.ext.want, req.Reply)
	st.queueExtend(h)
	st.sig().ExtendAsked.signal(h.ks.Key)
}

// queueExtend adds h to the next extend batch unless an extend of h is
// already pending or in flight (answerExtends queues it again then).
func (st *LoopState) queueExtend(h *holding) {
	if h.lease.Pending {
		return
	}
	h.lease.Pending = true
	st.extends.add(h)
}

// answerExtends answers the Extend callers of the leases of d that are
// still held (dropHolding answered the others): nil when the extend
// succeeded, the round trip's error when its outcome is unknown. Leases
// with callers who came while the round trip was in flight go into the
// next batch. Called by handleExtendDone after it updated the leases.
func (st *LoopState) answerExtends(d extendDone) {
	for _, h := range d.batch {
		if _, ok := st.held[h]; !ok {
			continue
		}
		var err error
		if d.err != nil {
			err = extendUnknown(d.err)
		}
		if h.ext == nil {
			continue
		}
		sent := h.ext.sent
		h.ext.sent = nil
		for _, c := range sent {
			c <- err
		}
		if len(h.ext.want) > 0 {
			st.queueExtend(h)
		} else {
			h.ext = nil
		}
	}
}

// answerExtendWaiters answers every Extend caller of h with err.
func (h *holding) answerExtendWaiters(err error) {
	if h.ext == nil {
		return
	}
	for _, c := range h.ext.sent {
		c <- err
	}
	for _, c := range h.ext.want {
		c <- err
	}
	h.ext = nil
}
