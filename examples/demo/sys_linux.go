package main

import "syscall"

// sysProcAttr makes the kernel kill a worker if the demo dies without
// cleaning up (SIGKILL, crash).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
