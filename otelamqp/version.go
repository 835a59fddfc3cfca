package otelamqp

// ScopeName is the instrumentation scope of the tracers and meters this
// package creates: the import path, as the OpenTelemetry specification
// recommends, so that a backend can tell these spans from the
// application's own.
const ScopeName = "github.com/amqp091-drainer/amqp091-drainer/otelamqp"

// Version returns the version of this instrumentation, reported as the
// instrumentation scope's version. It follows the amqp091-go release the
// module instruments, since the hooks it relies on are that build's.
func Version() string {
	return "1.17.0"
}
