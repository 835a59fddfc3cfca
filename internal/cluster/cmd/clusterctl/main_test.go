package main

import (
	"reflect"
	"testing"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A node command names its node first; what follows is the command's own.
func TestNodeArg(t *testing.T) {
	for _, tc := range []struct {
		args []string
		n    cluster.Node
		rest []string
		ok   bool
	}{
		{[]string{"b"}, cluster.B, []string{}, true},
		{[]string{"c", "full"}, cluster.C, []string{"full"}, true},
		{[]string{"a", "list_queues", "name"}, cluster.A, []string{"list_queues", "name"}, true},
		{nil, "", nil, false},
		{[]string{"d"}, "", nil, false},
	} {
		n, rest, err := nodeArg("partition", tc.args)
		if (err == nil) != tc.ok || n != tc.n || !reflect.DeepEqual(rest, tc.rest) {
			t.Errorf("nodeArg(%q) = %q, %q, %v", tc.args, n, rest, err)
		}
	}
}
