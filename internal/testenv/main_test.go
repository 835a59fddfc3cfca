package testenv_test

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	amqp "github.com/rabbitmq/amqp091-go"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestDialConfigOpensChannel is the end-to-end check that the discovered
// URL reaches a working broker.
func TestDialConfigOpensChannel(t *testing.T) {
	conn, err := amqp.DialConfig(testenv.AMQPURL(t), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("DialConfig: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("Channel: %v", err)
	}
	// A server-named, exclusive queue proves the channel is usable
	// without leaving anything behind on the broker.
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("QueueDeclare: %v", err)
	}
	if q.Name == "" {
		t.Error("QueueDeclare returned an empty queue name")
	}
	if err := ch.Close(); err != nil {
		t.Errorf("channel Close: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("connection Close: %v", err)
	}
}

func TestDialClosesOnCleanup(t *testing.T) {
	var conn *amqp.Connection
	t.Run("inner", func(t *testing.T) {
		conn = testenv.Dial(t, amqp.Config{})
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("Channel: %v", err)
		}
		_ = ch.Close()
	})
	if !conn.IsClosed() {
		t.Error("connection still open after the test that dialled it finished")
	}
}

func TestAMQPAddrMatchesURL(t *testing.T) {
	uri, err := amqp.ParseURI(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	want := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	if got := testenv.AMQPAddr(t); got != want {
		t.Errorf("AMQPAddr = %q, want %q from AMQPURL", got, want)
	}
}

func TestManagementURLAnswers(t *testing.T) {
	base := testenv.ManagementURL(t)
	amqpURL, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/overview", nil)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := amqpURL.User.Password()
	req.SetBasicAuth(amqpURL.User.Username(), pass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", req.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s", req.URL, resp.Status)
	}
}
