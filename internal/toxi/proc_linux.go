package toxi

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the server if the test binary dies
// without stopping it: killed by go test's -timeout, by a signal, or
// crashed. testenv.Main stops it in every other case.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
