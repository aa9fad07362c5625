package heartbeat

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootOffset returns CLOCK_BOOTTIME − CLOCK_MONOTONIC: the time the machine
// spent suspended since it booted (the two clocks differ only by it). The
// two readings are a system call apart; the monotonic clock is read on
// both sides and the later reading used, so a delay between the calls can
// only make the result smaller, and a reading whose calls lay more than
// 1 ms apart is taken again.
func bootOffset() (time.Duration, bool) {
	var best time.Duration
	for i := range 3 {
		var m1, b, m2 unix.Timespec
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1) != nil ||
			unix.ClockGettime(unix.CLOCK_BOOTTIME, &b) != nil ||
			unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2) != nil {
			return 0, false
		}
		off := time.Duration(b.Nano() - m2.Nano())
		if i == 0 || off > best {
			best = off
		}
		if m2.Nano()-m1.Nano() <= int64(time.Millisecond) {
			break
		}
	}
	return best, true
}
