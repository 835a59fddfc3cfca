package testenv

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// defaultImage is the broker image testcontainers runs; RABBITMQ_IMAGE
// overrides it. The management variant serves ManagementURL too.
const defaultImage = "rabbitmq:4.3-management"

func imageName(getenv func(string) string) string {
	if img := getenv("RABBITMQ_IMAGE"); img != "" {
		return img
	}
	return defaultImage
}

// dockerHealthTimeout bounds the Docker engine check, which runs on every
// machine without a local broker, Docker or not.
const dockerHealthTimeout = 5 * time.Second

// dockerHealth reports whether testcontainers can reach a Docker engine.
//
// It runs testcontainers in its own goroutine because, depending on the
// version and the environment, it may panic or block instead of returning
// an error when there is no engine. A blocked check is abandoned; that
// goroutine leaks, but the run fails anyway for want of a broker.
func dockerHealth(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res := make(chan error, 1) // buffered: an abandoned check must not block
	go func() {
		defer func() {
			if r := recover(); r != nil {
				res <- fmt.Errorf("testcontainers panicked: %v", r)
			}
		}()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			res <- err
			return
		}
		res <- p.Health(ctx) // Health closes p
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer from the Docker engine within %v", timeout)
	}
}

// startContainer runs a broker container for the rest of the test binary.
func startContainer() (b broker, err error) {
	if err := dockerHealth(dockerHealthTimeout); err != nil {
		return broker{}, fmt.Errorf("no Docker engine: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers panicked: %v", r)
		}
	}()

	// Register the termination before starting anything, so that no
	// container is ever started without an owner. Terminate stops and
	// removes it; Ryuk would too, but only after this process is gone,
	// which can overlap the next run.
	var ctr testcontainers.Container
	if err := AtExit(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = testcontainers.TerminateContainer(ctr, testcontainers.StopContext(ctx))
	}); err != nil {
		return broker{}, err
	}

	// Generous: the first run on a machine pulls the image.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img := imageName(os.Getenv)
	ctr, err = testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        img,
			ExposedPorts: []string{"5672/tcp", "15672/tcp"},
			// RabbitMQ opens its AMQP listener last in its boot, so a
			// listening 5672 means the broker is ready for clients.
			WaitingFor: wait.ForListeningPort("5672/tcp").WithStartupTimeout(3 * time.Minute),
		},
		Started: true,
	})
	if err != nil {
		// The container may exist even though starting it failed; the
		// registered terminate removes it at exit.
		return broker{}, fmt.Errorf("start %s: %w", img, err)
	}
	amqpAddr, err := ctr.PortEndpoint(ctx, "5672/tcp", "")
	if err != nil {
		return broker{}, fmt.Errorf("%s: mapped AMQP port: %w", img, err)
	}
	mgmtURL, err := ctr.PortEndpoint(ctx, "15672/tcp", "http")
	if err != nil {
		return broker{}, fmt.Errorf("%s: mapped management port: %w", img, err)
	}
	return broker{
		amqpURL:  "amqp://guest:guest@" + amqpAddr + "/",
		amqpAddr: amqpAddr,
		mgmtURL:  mgmtURL,
		source:   "testcontainers broker " + img,
	}, nil
}
