package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// fleetSysProcAttr makes the kernel kill a fleet worker when the thread
// that started it ends (the bench died, or the fleet's spawner thread
// ended; see startSpawner).
func fleetSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on
// Linux whatever the kernel's own tick rate).
const userHZ = 100

// selfRSSKB returns this process's VmRSS in kB, -1 if unknown.
func selfRSSKB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// postmasterOf returns the postmaster's pid given a backend's pid, when
// that backend is a PostgreSQL process on this machine (0 otherwise: the
// server is elsewhere, or in another pid namespace).
func postmasterOf(backend int) int {
	b, ok := readProcStat(backend)
	if !ok || !isPostgresComm(b.comm) {
		return 0
	}
	pm, ok := readProcStat(b.ppid)
	if !ok || !isPostgresComm(pm.comm) {
		return 0
	}
	return b.ppid
}

// clusterCPUTicks returns the CPU time (user + system, in 1/userHZ s) of
// the postmaster and all its children, alive or exited: a child that
// exited was reaped by the postmaster, so its time is in the postmaster's
// cutime/cstime.
func clusterCPUTicks(postmaster int) (int64, bool) {
	pm, ok := readProcStat(postmaster)
	if !ok {
		return 0, false
	}
	total := pm.ticks
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if st, ok := readProcStat(pid); ok && st.ppid == postmaster {
			total += st.ticks
		}
	}
	return total, true
}

// selfCPUMs returns this process's user+system CPU time in ms (getrusage),
// -1 if unknown.
func selfCPUMs() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
}
