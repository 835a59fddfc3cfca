package cluster

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A layout is what a set of nodes owns on this machine: their namespaces
// (whose names are also their Erlang host names), their hub, their subnet
// and their ports. The three-node cluster and each standalone node have
// layouts that share none of these, so that they can run at the same
// time: the cleanup of one (cleanStale, netDown) kills only the VMs
// running its own node names and deletes only its own namespaces.
type layout struct {
	nodes    []Node
	hub      string // the hub namespace, where clients dial from
	subnet   string // "10.201.0.": node i is .(1+i), the hub .254, clients .101–.200
	amqpBase int    // node i listens for AMQP on amqpBase+i…
	distBase int    // …and for Erlang distribution on distBase+i
}

// three is the three-node cluster's layout.
var three = &layout{
	nodes:    Nodes,
	hub:      hubNS,
	subnet:   "10.201.0.",
	amqpBase: 5681,
	distBase: 25681,
}

func (l *layout) check(n Node) error {
	if slices.Contains(l.nodes, n) {
		return nil
	}
	return fmt.Errorf("cluster: unknown node %q (want one of %v)", string(n), l.nodes)
}

// idx is the node's position in l.nodes; its address and ports are 1+idx
// and base+idx.
func (l *layout) idx(n Node) int {
	if i := slices.Index(l.nodes, n); i >= 0 {
		return i
	}
	panic("cluster: unknown node " + string(n))
}

func (l *layout) nodeIP(n Node) string   { return l.subnet + strconv.Itoa(1+l.idx(n)) }
func (l *layout) hubIP() string          { return l.subnet + "254" }
func (l *layout) amqpPort(n Node) int    { return l.amqpBase + l.idx(n) }
func (l *layout) distPort(n Node) int    { return l.distBase + l.idx(n) }
func (l *layout) amqpAddr(n Node) string { return l.nodeIP(n) + ":" + strconv.Itoa(l.amqpPort(n)) }

// namespaces lists every namespace of the layout, the hub last.
func (l *layout) namespaces() []string {
	var ns []string
	for _, n := range l.nodes {
		ns = append(ns, nodeNS(n))
	}
	return append(ns, l.hub)
}

// nodeOf maps an Erlang node name ("rabbit@amqpd-b") to the layout's Node.
func (l *layout) nodeOf(erl string) (Node, bool) {
	for _, n := range l.nodes {
		if erl == nodeName(n) {
			return n, true
		}
	}
	return "", false
}

// Standalone describes the one node that [Start] boots instead of the
// three-node cluster when [Options.Standalone] is set: a node with
// configuration of its own (another auth backend, plugins) for tests that
// must not reconfigure the system broker or the cluster.
//
// It owns its namespaces (amqpd-<Name>, and amqpd-<Name>-hub where clients
// dial from), its subnet, its ports and its Dir (default
// $TMPDIR/amqpd-<Name>), so it runs beside a three-node cluster and the
// system broker: starting or stopping either never touches the other.
// Two standalone nodes coexist if their names differ.
type Standalone struct {
	// Name is the node's [Node], also in its namespaces and Erlang node
	// name (rabbit@amqpd-<Name>): 1 to 12 lower-case letters and digits,
	// not "a", "b", "c" or "hub", which are the cluster's.
	Name string `json:"name"`
	// Subnet is the node's /24 as its first three octets and a dot: the
	// node is .1, its hub .254. Default 10.202.0.; never the cluster's
	// 10.201.0., so that an address always says whose it is.
	Subnet string `json:"subnet"`
	// Port is the node's AMQP port (default 5691); its Erlang
	// distribution port is Port+20000.
	Port int `json:"port"`
	// Config is appended to the node's rabbitmq.conf, after the lines
	// this package writes (listener, loopback_users, logging).
	Config string `json:"config,omitempty"`
	// AdvancedConfig is the node's whole advanced.config. Empty: "[].".
	AdvancedConfig string `json:"advanced_config,omitempty"`
	// Plugins are enabled on the node; RabbitMQ brings their
	// dependencies along.
	Plugins []string `json:"plugins,omitempty"`
}

// standaloneName keeps a name short enough for the hub's veth (vh-<Name>,
// 15 bytes at most) and free of anything a namespace or host name forbids.
var standaloneName = regexp.MustCompile(`^[a-z0-9]{1,12}$`)

func (s Standalone) withDefaults() Standalone {
	if s.Subnet == "" {
		s.Subnet = "10.202.0."
	}
	if s.Port == 0 {
		s.Port = 5691
	}
	return s
}

func (s Standalone) validate() error {
	if !standaloneName.MatchString(s.Name) || slices.Contains(Nodes, Node(s.Name)) || s.Name == "hub" {
		return fmt.Errorf("cluster: standalone name %q: want 1 to 12 of [a-z0-9], not a, b, c or hub", s.Name)
	}
	if !strings.HasSuffix(s.Subnet, ".") || net.ParseIP(s.Subnet+"1").To4() == nil {
		return fmt.Errorf("cluster: standalone subnet %q: want three octets and a dot (10.202.0.)", s.Subnet)
	}
	if s.Subnet == three.subnet {
		return fmt.Errorf("cluster: standalone subnet %s is the cluster's", s.Subnet)
	}
	if s.Port < 1024 || s.Port > 65535-20000 {
		return fmt.Errorf("cluster: standalone port %d: want 1024 to %d", s.Port, 65535-20000)
	}
	return nil
}

// layout is s's layout: one node in a hub of its own.
func (s Standalone) layout() *layout {
	return &layout{
		nodes:    []Node{Node(s.Name)},
		hub:      prefix + s.Name + "-hub",
		subnet:   s.Subnet,
		amqpBase: s.Port,
		distBase: s.Port + 20000,
	}
}

// defaultDir is where a Standalone keeps its files unless told otherwise.
func (s Standalone) defaultDir(tmp string) string { return filepath.Join(tmp, prefix+s.Name) }
