//go:build tools

// Package thirdparty is never built: this file only names, for `go mod
// tidy`, the packages whose tests scripts/thirdparty-tests runs and the
// packages those tests import, so that go.mod and go.sum keep what
// `go test <library package>` needs. Tidy alone keeps a dependency's
// packages but not its tests' imports. gocloud.dev/internal/testing/setup,
// which rabbitpubsub's tests also import, cannot be named here (internal);
// its requirements are kept explicitly in go.mod.
package thirdparty

import (
	_ "github.com/ThreeDotsLabs/watermill"
	_ "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	_ "github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/ThreeDotsLabs/watermill/pubsub/tests"
	_ "github.com/stretchr/testify/assert"
	_ "github.com/stretchr/testify/require"
	_ "gocloud.dev/gcerrors"
	_ "gocloud.dev/pubsub"
	_ "gocloud.dev/pubsub/driver"
	_ "gocloud.dev/pubsub/drivertest"
	_ "gocloud.dev/pubsub/rabbitpubsub"
)
