package driver

import (
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinProcess sets the CPU affinity of every thread of pid (threads made
// later inherit their creator's).
func pinProcess(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return err
	}
	var first error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Burn spins on one CPU for ever (the `soak burn` subcommand): a CPU
// burner for the starvation fault.
func Burn(cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	_ = unix.SchedSetaffinity(0, &set)
	x := 0
	for {
		x++
	}
}
