package cluster

import (
	"os"
	"syscall"
)

func gettid() int { return syscall.Gettid() }

// setns moves the calling thread into the network namespace f refers to.
func setns(f *os.File) error {
	nr := sysSetns // a variable: the constant may be negative
	if nr < 0 {
		return syscall.ENOSYS
	}
	if _, _, e := syscall.Syscall(uintptr(nr), f.Fd(), syscall.CLONE_NEWNET, 0); e != 0 {
		return e
	}
	return nil
}
