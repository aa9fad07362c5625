//go:build !linux

package heartbeat

const testingOnLinux = false
