package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// WaitRunning trusts the best view without a recorded partition, and in
// it only the nodes that say their app runs.
func TestBestView(t *testing.T) {
	all := []Node{A, B, C}
	parts := map[string][]string{"rabbit@amqpd-a": {"rabbit@amqpd-b"}}
	for _, tc := range []struct {
		name  string
		views []view
		want  []Node
	}{
		{"all agree", []view{
			{from: A, self: true, running: all},
			{from: B, self: true, running: all},
			{from: C, self: true, running: all},
		}, all},
		{"a node whose app is stopped is not counted", []view{
			{from: A, self: true, running: all},
			{from: B, self: false, running: all},
			{from: C, self: true, running: all},
		}, []Node{A, C}},
		{"a view across a partition is ignored", []view{
			{from: A, self: true, running: all, partitions: parts},
			{from: B, self: true, running: []Node{B}},
			{from: C, self: true, running: []Node{B, C}},
		}, []Node{B, C}},
		{"a node down has no view", []view{
			{from: A, err: errors.New("cluster: node a is not running")},
			{from: B, self: true, running: []Node{B, C}},
			{from: C, self: true, running: []Node{B, C}},
		}, []Node{B, C}},
		{"none", []view{{from: A, err: errors.New("down")}, {from: B, err: errors.New("down")},
			{from: C, err: errors.New("down")}}, nil},
	} {
		got, desc := bestView(tc.views)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: bestView = %v, want %v (%s)", tc.name, got, tc.want, desc)
		}
		if n := strings.Count(desc, "; ") + 1; n != len(tc.views) {
			t.Errorf("%s: the description has %d parts, want one a view: %s", tc.name, n, desc)
		}
	}
}

// The CLI may print a warning before its JSON document.
func TestParseClusterStatus(t *testing.T) {
	out := "Warning: something\n{\"running_nodes\": [\"rabbit@amqpd-a\", \"rabbit@amqpd-b\"], " +
		"\"partitions\": {\"rabbit@amqpd-a\": [\"rabbit@amqpd-c\"]}}"
	st, err := parseClusterStatus(out)
	want := clusterStatus{
		RunningNodes: []string{"rabbit@amqpd-a", "rabbit@amqpd-b"},
		Partitions:   map[string][]string{"rabbit@amqpd-a": {"rabbit@amqpd-c"}},
	}
	if err != nil || !reflect.DeepEqual(st, want) {
		t.Fatalf("parseClusterStatus = %+v, %v", st, err)
	}
	if _, err := parseClusterStatus("Error: unable to perform an operation"); err == nil {
		t.Fatal("no JSON, no error")
	}
}

// writeFiles lays out Dir for three nodes, its cookie private, and wipes
// only a Dir that is empty or an earlier cluster's.
func TestWriteFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cluster")
	c := newCluster(Options{Dir: dir}.withDefaults())
	for range 2 { // the second time over the first one's state
		if err := c.writeFiles(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := os.Stat(filepath.Join(dir, "home", ".erlang.cookie"))
	if err != nil || st.Mode().Perm() != 0o400 {
		t.Fatalf("cookie: %v, %v", st, err)
	}
	for _, n := range Nodes {
		for _, f := range []string{
			"rabbitmq.conf", "advanced.config", "enabled_plugins", "log", "mnesia",
		} {
			if _, err := os.Stat(filepath.Join(dir, string(n), f)); err != nil {
				t.Error(err)
			}
		}
	}
	conf, _ := os.ReadFile(filepath.Join(dir, "b", "rabbitmq.conf"))
	if !strings.Contains(string(conf), "listeners.tcp.default = 10.201.0.2:5682\n") ||
		!strings.Contains(string(conf), "cluster_partition_handling = ignore\n") {
		t.Errorf("b's config:\n%s", conf)
	}
	inetrc, _ := os.ReadFile(filepath.Join(dir, "inetrc"))
	if !strings.Contains(string(inetrc), "{host, {10,201,0,3}, [\"amqpd-c\"]}.\n") {
		t.Errorf("inetrc:\n%s", inetrc)
	}

	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c = newCluster(Options{Dir: foreign}.withDefaults())
	if err := c.writeFiles(); err == nil {
		t.Fatal("a directory holding no cluster state was wiped")
	}
	if _, err := os.Stat(filepath.Join(foreign, "notes.txt")); err != nil {
		t.Fatalf("the foreign directory lost its file: %v", err)
	}
}

// Client addresses are 10.201.0.101 to .200, and only those are left to
// RestoreClient by Heal.
func TestClientAddresses(t *testing.T) {
	if a, err := ClientIP(1); err != nil || a != "10.201.0.101" {
		t.Fatalf("ClientIP(1) = %q, %v", a, err)
	}
	for _, k := range []int{0, 101} {
		if _, err := ClientIP(k); err == nil {
			t.Errorf("ClientIP(%d) accepted", k)
		}
	}
	for dst, want := range map[string]bool{"10.201.0.101/32": true, "10.201.0.200": true,
		"10.201.0.2/32": false, "10.201.0.254": false, "10.202.0.101": false, "default": false} {
		if got := three.isClientIP(dst); got != want {
			t.Errorf("isClientIP(%q) = %v, want %v", dst, got, want)
		}
	}
}
