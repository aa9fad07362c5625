//go:build !linux

package main

import "syscall"

// fleetSysProcAttr: no parent-death signal outside Linux; a worker ends
// when its stdin closes (the bench is gone).
func fleetSysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

const userHZ = 100

func selfRSSKB() int64 { return -1 }

// postmasterOf: the server's CPU is read from /proc, on Linux only.
func postmasterOf(int) int { return 0 }

func clusterCPUTicks(int) (int64, bool) { return 0, false }

func selfCPUMs() float64 { return -1 }
