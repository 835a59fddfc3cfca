//go:build !linux

package toxi

import "os/exec"

// setDeathSignal does nothing: only Linux can tie a child's life to its
// parent's. testenv.Main still stops the server when the tests end.
func setDeathSignal(cmd *exec.Cmd) {}
