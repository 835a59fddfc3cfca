package testenv

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// localAddr and localURL are a broker started on this machine with
	// rabbitmq-server and its default guest account, which RabbitMQ only
	// accepts from loopback.
	localAddr = "127.0.0.1:5672"
	localURL  = "amqp://guest:guest@" + localAddr + "/"
	localMgmt = "http://127.0.0.1:15672"

	// dialTimeout bounds each TCP probe. Loopback answers or refuses at
	// once; the bound only matters for a remote AMQP_URL that drops SYNs.
	dialTimeout = time.Second
)

// A broker is where discovery found RabbitMQ.
type broker struct {
	amqpURL  string // for amqp.Dial
	amqpAddr string // host:port of amqpURL
	mgmtURL  string // management API base URL, without credentials
	source   string // what found it, for messages
}

// probes are discover's view of the world. Tests replace them to reach
// every branch, including "nothing found", without touching the machine.
type probes struct {
	getenv func(key string) string
	dial   func(addr string, timeout time.Duration) error
	// container starts a broker container, or says why it cannot.
	container func() (broker, error)
}

// systemProbes are the real ones.
var systemProbes = probes{
	getenv: os.Getenv,
	dial: func(addr string, timeout time.Duration) error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		return c.Close()
	},
	container: startContainer,
}

// discover finds a broker; see the package documentation for the order.
func discover(p probes) (broker, error) {
	mgmtOverride := p.getenv("RABBITMQ_MANAGEMENT_URL")
	withMgmt := func(b broker, mgmt string) broker {
		b.mgmtURL = mgmt
		if mgmtOverride != "" {
			b.mgmtURL = strings.TrimSuffix(mgmtOverride, "/")
		}
		return b
	}

	// An explicit AMQP_URL is final: falling back to another broker would
	// run the tests against something the user did not ask for.
	if u := p.getenv("AMQP_URL"); u != "" {
		uri, err := amqp.ParseURI(u)
		if err != nil {
			return broker{}, fmt.Errorf("testenv: AMQP_URL=%q is not an AMQP URL: %v", redact(u), err)
		}
		addr := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
		if err := p.dial(addr, dialTimeout); err != nil {
			return broker{}, fmt.Errorf("testenv: AMQP_URL is set to %s, but nothing answers at %s: %v\n"+
				"Start that broker, or unset AMQP_URL to use one on %s or a testcontainers one",
				redact(u), addr, err, localAddr)
		}
		b := broker{amqpURL: u, amqpAddr: addr, source: "broker at AMQP_URL"}
		return withMgmt(b, "http://"+net.JoinHostPort(uri.Host, "15672")), nil
	}

	localErr := p.dial(localAddr, dialTimeout)
	if localErr == nil {
		b := broker{amqpURL: localURL, amqpAddr: localAddr, source: "local broker"}
		return withMgmt(b, localMgmt), nil
	}

	b, containerErr := p.container()
	if containerErr == nil {
		return withMgmt(b, b.mgmtURL), nil
	}

	return broker{}, fmt.Errorf(`testenv: no RabbitMQ broker for the integration tests. Tried, in order:
  1. AMQP_URL: not set
  2. a local broker at %s: %v
  3. a testcontainers broker (%s): %v
Provide one of:
  - a local broker:    rabbitmq-server -detached && rabbitmq-plugins enable rabbitmq_management
  - any other broker:  export AMQP_URL=amqp://user:password@host:5672/vhost
  - a Docker engine, for testcontainers to run RABBITMQ_IMAGE (default %s)`,
		localAddr, localErr, imageName(p.getenv), containerErr, defaultImage)
}
