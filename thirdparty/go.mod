// The third-party harness: the broker-backed test suites of libraries
// built on amqp091-go, run as ordinary modules from the module proxy, with
// no edit to their source, against the patched tree (scripts/thirdparty-tests
// runs them in every read mode; for the pristine baseline it builds with a
// copy of this file under .cache whose replace points at the pristine
// release tree). A module of its own so that the root module never depends
// on watermill or gocloud, and not in go.work: a workspace selects one
// version of every module for all its members, so joining it would raise
// the root module's dependencies (testify, x/sys, otel...) to these
// libraries' versions. tools.go keeps the test-only imports of the two
// packages required.
//
// Pinned: watermill-amqp v3.0.2 (with watermill v1.3.7, whose pubsub/tests
// holds the suite) and gocloud.dev/pubsub/rabbitpubsub v0.49.0 (with
// gocloud.dev v0.49.0, whose pubsub/drivertest holds the conformance
// tests). They ask for amqp091-go v1.10.0 and v1.15.0; the replace
// below makes every build use the patched tree of the pinned release (upstream/PIN).
module github.com/amqp091-drainer/amqp091-drainer/thirdparty

go 1.26.0

require (
	github.com/ThreeDotsLabs/watermill v1.3.7
	github.com/ThreeDotsLabs/watermill-amqp/v3 v3.0.2
	github.com/rabbitmq/amqp091-go v1.17.0
	github.com/stretchr/testify v1.12.1
	gocloud.dev v0.49.0
	gocloud.dev/pubsub/rabbitpubsub v0.49.0
)

require (
	github.com/cenkalti/backoff/v3 v3.2.2 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/googleapis/gax-go/v2 v2.27.0 // indirect
	github.com/hashicorp/errwrap v1.1.0 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/xerrors v0.0.0-20240903120638-7835f813f4da // indirect
	google.golang.org/api v0.308.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b // indirect
	google.golang.org/grpc v1.84.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/rabbitmq/amqp091-go => ../upstream/amqp091-go
