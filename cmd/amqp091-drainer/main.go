// Command amqp091-drainer builds the patched amqp091-go tree that
// amqp091-drainer ships, and adopts it in (or removes it from) a user's
// module.
//
// Usage:
//
//	amqp091-drainer vendor [-dir upstream/amqp091-go] [-pin FILE] [-pristine]
//	amqp091-drainer install [-dir third_party/amqp091-go] [-module DIR]
//	amqp091-drainer uninstall [-dir third_party/amqp091-go] [-module DIR]
//
// vendor fetches the pinned amqp091-go release through the Go module proxy,
// verifies its hash, applies the patch set and adds the overlay files (both
// compiled into this command from upstream/), and stamps the result. Run it
// twice and the second run does nothing. With -pristine it extracts the
// verified release without patching it, for comparisons.
//
// install works on the module containing -module (default: the current
// directory): it refuses a module that does not require
// github.com/rabbitmq/amqp091-go, builds the patched tree into -dir
// (relative to the module root), sets the requirement to the pinned version
// (warning when that changes it) and adds
// `replace github.com/rabbitmq/amqp091-go => ./third_party/amqp091-go` to
// go.mod, one printed line per step. A second run finds everything in place
// and writes nothing. uninstall drops that replace and removes the folder;
// the requirement stays. The logic is in internal/install.
//
// From inside your module, run it at a released version with
//
//	go run github.com/amqp091-drainer/amqp091-drainer/cmd/amqp091-drainer@<version> install
//
// or from a checkout with
//
//	GOWORK=off go -C /path/to/amqp091-drainer run ./internal/bootstrap install -module "$PWD"
//
// (`go run /path/to/amqp091-drainer/cmd/amqp091-drainer` from inside your
// module does not work: the go command refuses to build a package outside
// the current module). This command is a module of its own so that the
// @version form works: the go command refuses it for a module whose go.mod
// has replace directives, as the root module's must.
package main

import "github.com/amqp091-drainer/amqp091-drainer/internal/cli"

func main() { cli.Main() }
