package nemesis_test

import (
	"fmt"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/nemesis"
)

// A seed's schedule, printed before it runs; the same seed prints the
// same lines on every machine.
func ExampleGenerate() {
	s := nemesis.Generate(7, nemesis.Options{Duration: 2 * time.Minute})
	fmt.Print(s)
	// Output:
	// nemesis: seed 7, 2m0s, 3 faults (at most 2 at once, at most one node out)
	//     19.0s  client-link   workload held 11.3s
	//     55.6s  partition     b        held 7.3s
	//    106.9s  stop-app      c        held 3.6s
}
