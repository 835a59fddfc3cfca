// Command bootstrap is the amqp091-drainer command (internal/cli) built
// from the root module alone. A fresh checkout has no vendored tree yet,
// and the workspace (go.work) cannot load without it, because the root
// module replaces amqp091-go with that tree; outside the workspace the go
// command loads the replacement only when a package needs it, and this
// command needs none. So the Makefile and scripts vendor with
//
//	GOWORK=off go run ./internal/bootstrap vendor
//
// Users run cmd/amqp091-drainer, the same command as a module of its own.
package main

import "github.com/amqp091-drainer/amqp091-drainer/internal/cli"

func main() { cli.Main() }
