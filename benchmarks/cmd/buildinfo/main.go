// Command buildinfo prints which amqp091-go this binary was built against:
// the pristine release (go -modfile=go.upstream.mod) or the patched tree
// (the default go.mod). Every A/B benchmark binary reports the same line, so
// a result can always be traced to the build that produced it.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The import keeps amqp091-go in the build so its module shows in the build
// info; Config is the cheapest symbol to reference.
var _ amqp.Config

func main() {
	line, err := Describe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "buildinfo:", err)
		os.Exit(1)
	}
	fmt.Println(line)
}

// Describe names the amqp091-go module of the running binary and says
// whether it is the pristine release or the patched tree.
func Describe() (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build info in this binary")
	}
	for _, dep := range info.Deps {
		if dep.Path != "github.com/rabbitmq/amqp091-go" {
			continue
		}
		if dep.Replace != nil {
			return fmt.Sprintf("%s %s: patched (replaced by %s)", dep.Path, dep.Version, dep.Replace.Path), nil
		}
		return fmt.Sprintf("%s %s: pristine (%s)", dep.Path, dep.Version, dep.Sum), nil
	}
	return "", fmt.Errorf("amqp091-go is not in this binary's build info")
}
