module github.com/amqp091-drainer/amqp091-drainer

go 1.26.0

require (
	github.com/bluekeyes/go-gitdiff v0.8.1
	github.com/rabbitmq/amqp091-go v1.16.0
	go.uber.org/goleak v1.3.0
	golang.org/x/mod v0.43.0
)

require github.com/stretchr/testify v1.12.1 // indirect
