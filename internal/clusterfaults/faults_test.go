package clusterfaults

import (
	"testing"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The records seen after healed cuts of b in the cluster suite's runs.
func TestMostNamedPicksTheNodeOnItsOwn(t *testing.T) {
	for _, tc := range []struct {
		parts map[string][]string
		want  cluster.Node
	}{
		{map[string][]string{
			"rabbit@amqpd-a": {"rabbit@amqpd-b"},
			"rabbit@amqpd-b": {"rabbit@amqpd-a", "rabbit@amqpd-c"},
			"rabbit@amqpd-c": {"rabbit@amqpd-b"},
		}, cluster.B},
		{map[string][]string{
			"rabbit@amqpd-b": {"rabbit@amqpd-a"},
			"rabbit@amqpd-c": {"rabbit@amqpd-a"},
		}, cluster.A},
		{map[string][]string{
			"rabbit@amqpd-a": {"rabbit@amqpd-b", "rabbit@amqpd-c"},
			"rabbit@amqpd-c": {"rabbit@amqpd-a"},
		}, cluster.A},
		{map[string][]string{}, cluster.B},
	} {
		if got := loneNode(tc.parts, cluster.B); got != tc.want {
			t.Errorf("loneNode(%v) = %s, want %s", tc.parts, got, tc.want)
		}
	}
}
