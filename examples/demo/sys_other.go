//go:build !linux

package main

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; the demo's own
// cleanup stops the workers.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
