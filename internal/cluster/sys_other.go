//go:build !linux

package cluster

import (
	"errors"
	"os"
)

// Network namespaces are Linux's; elsewhere Usable says no and these are
// never reached.

func gettid() int { return 0 }

func setns(*os.File) error { return errors.New("cluster: network namespaces need Linux") }
