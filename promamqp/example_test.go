package promamqp_test

import (
	"log"
	"net/http"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/amqp091-drainer/amqp091-drainer/promamqp"
)

// A drainer-mode connection whose Observer counts into the Collector and
// whose Stats are read at every scrape of /metrics. It has no Output
// comment: it needs a broker, so go test compiles it without running it.
func Example() {
	metrics := promamqp.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	conn, err := amqp.DialConfig("amqp://guest:guest@127.0.0.1:5672/", amqp.Config{
		ReadPath: amqp.Drainer(amqp.DrainerOptions{Observer: metrics.Observer()}),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	metrics.Watch("main", conn)
	defer metrics.Unwatch("main")

	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	log.Fatal(http.ListenAndServe("127.0.0.1:2112", nil))
}
