package apachekafka

import "syscall"

// procAttr puts a node in a process group of its own, killed with SIGKILL
// when the process that started it dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
