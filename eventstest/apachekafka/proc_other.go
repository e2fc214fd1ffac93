//go:build !linux

package apachekafka

import "syscall"

// procAttr puts a node in a process group of its own. Outside Linux there
// is no parent-death signal: a test binary that crashes may leave a node
// running until it is killed by hand.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
