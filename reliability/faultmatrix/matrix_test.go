package faultmatrix

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// modes are the matrix's columns.
var modes = []compat.Mode{compat.Upstream, compat.Legacy, compat.Drainer}

// TestFaultMatrix runs every fault during every phase in every mode,
// sequentially (the goroutine check of a cell must not see another
// cell's), and prints the matrix.
func TestFaultMatrix(t *testing.T) {
	lvl := level.Require(t)
	// How long a fault the connection survives acts before the cell
	// checks that calls still succeed.
	window := level.Pick(lvl, 1500*time.Millisecond, 5*time.Second)

	// Start the Toxiproxy server and the direct connection before any
	// cell takes its goroutine baseline.
	toxi.NewProxy(t, testenv.AMQPAddr(t))
	adminConn := testenv.Dial(t, amqp.Config{})
	admin := testenv.Channel(t, adminConn)

	results := map[string]verdict{}
	for _, f := range faults {
		for _, p := range phases {
			for _, m := range modes {
				key := cellKey(m, f, p)
				t.Run(key, func(t *testing.T) {
					v := runCell(t, m, f, p, admin, window)
					results[key] = v
					if !v.pass {
						t.Errorf("%s", strings.Join(v.why, "; "))
					}
				})
			}
		}
	}
	t.Logf("fault matrix: every call within %s; survivable faults act for %s\n%s", callBound, window, table(results))
}

func cellKey(m compat.Mode, f fault, p phase) string {
	return fmt.Sprintf("%s/%s/%s", m, f.name, p.name)
}

// table prints the matrix: a row per fault and phase, a column per mode,
// each cell its verdict and slowest call.
func table(results map[string]verdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-11s %-11s", "fault", "phase")
	for _, m := range modes {
		fmt.Fprintf(&b, " %-15s", m)
	}
	b.WriteString("\n")
	for _, f := range faults {
		for _, p := range phases {
			fmt.Fprintf(&b, "%-11s %-11s", f.name, p.name)
			for _, m := range modes {
				key := cellKey(m, f, p)
				v, ok := results[key]
				cell := "not run"
				if ok {
					word := "pass"
					if !v.pass {
						word = "FAIL"
					}
					cell = fmt.Sprintf("%s %6.2fs", word, v.worst.Seconds())
				}
				fmt.Fprintf(&b, " %-15s", cell)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
