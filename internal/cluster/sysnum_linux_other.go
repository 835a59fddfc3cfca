//go:build linux && !amd64 && !arm64

package cluster

// sysSetns is unknown here: setns reports ENOSYS.
const sysSetns = -1
