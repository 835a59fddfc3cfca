// The command is a module of its own so that
// `go run github.com/amqp091-drainer/amqp091-drainer/cmd/amqp091-drainer@VERSION`
// works: the go command refuses @version for a module whose go.mod has
// replace directives, and the root module's go.mod must replace
// amqp091-go with the patched tree. In a checkout, go.work joins the two;
// releasing sets the requirement below to the root module's new tag
// (see docs/releasing.md).
module github.com/amqp091-drainer/amqp091-drainer/cmd/amqp091-drainer

go 1.26.0

require github.com/amqp091-drainer/amqp091-drainer v0.0.0-00010101000000-000000000000

// Every module that provides a package the command imports, through the
// root module, at the root's versions: `go run ...@VERSION` builds with
// exactly these (TestInstallAtVersion checks that none is missing).
require (
	github.com/bluekeyes/go-gitdiff v0.8.1 // indirect
	golang.org/x/mod v0.43.0 // indirect
)
