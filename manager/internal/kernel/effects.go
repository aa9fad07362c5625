package kernel

// The loop's effects. A handler changes the loop's state and leaves what
// it decided as effects, which run performs once the event is handled, so
// that a test can drive the state one event at a time and see, or perform
// itself, what each event decided (etcd-io/raft's RawNode and its Ready
// are the model):
//
//   - send this batch: flush launches the lanes' batches (lane.go) and
//     records each as dbWork (start); run hands them to DB workers
//     (startWork). The worker posts the answer back as an event
//     (acquireDoneCh, releaseDoneCh, extendDoneCh).
//   - answer this caller: a reply on the request's own channel (capacity
//     1, never blocking: the loop is its only sender).
//   - arm this timer: nextWake, computed from the state after the event.
//
// (Watch reads, watch.go, are still started from their own flush.)

// dbWork is one batch launched by flush: its flight (its kind and slots:
// flight.go), how many items it carries, and the statement to run on a
// DB worker, which posts its answer back to run.
type dbWork struct {
	fl  *flight
	n   int
	run func()
}

// Start records the DB work of a batch just launched (fl, n items); run
// starts it once the event is handled (startWork).
func (st *LoopState) Start(fl *flight, n int, run func()) {
	st.work = append(st.work, dbWork{fl: fl, n: n, run: run})
}

// startWork hands the recorded DB work to do (run: Manager.spawn), in
// the order it was launched, and forgets it.
func (st *LoopState) startWork(do func(func())) {
	for _, w := range st.work {
		do(w.run)
	}
	clear(st.work)
	st.work = st.work[:0]
}
