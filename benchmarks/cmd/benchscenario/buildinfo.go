package main

import (
	"fmt"
	"runtime/debug"
)

// amqpBuild names the amqp091-go module this binary was built against and
// says whether it is the pristine release or the patched tree, so that
// every result can be traced to the build that produced it.
func amqpBuild() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown: no build info in this binary"
	}
	for _, dep := range info.Deps {
		if dep.Path != "github.com/rabbitmq/amqp091-go" {
			continue
		}
		if dep.Replace != nil {
			return fmt.Sprintf("%s %s, patched (replaced by %s)", dep.Path, dep.Version, dep.Replace.Path)
		}
		return fmt.Sprintf("%s %s, pristine (%s)", dep.Path, dep.Version, dep.Sum)
	}
	return "unknown: amqp091-go is not in this binary's build info"
}
