// Package oauthnode runs a throwaway RabbitMQ node that authenticates and
// authorises clients with OAuth 2 tokens only, for tests of token expiry
// and connection.update-secret (issue #41). The node is package cluster's
// standalone node: the machine's own RabbitMQ install, booted with
// rabbitmq_auth_backend_oauth2 as its only auth backend, in a network
// namespace of its own (amqpd-oauth, reached through amqpd-oauth-hub at
// 10.202.0.1:5691). It never touches the system broker, and runs beside
// package cluster's three-node cluster.
//
// The node trusts one symmetric HS256 key, made afresh by every [Start]
// and known only to the [Node]: [Node.Token] mints tokens with it, so no
// identity provider is involved. A token is the password of an ordinary
// PLAIN login; the username is ignored (the broker takes the token's sub):
//
//	tok, _, err := node.Token(10*time.Second)
//	conn, err := amqp.DialConfig(node.URL(), amqp.Config{
//		SASL: []amqp.Authentication{&amqp.PlainAuth{Password: tok}},
//		Dial: node.Dial,
//	})
//
// Running the node needs root, as package cluster does; see [Usable].
package oauthnode

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
)

const (
	// ResourceServerID is the node's resource_server_id: the audience every
	// token must name, and the prefix of every scope.
	ResourceServerID = "rabbitmq"
	// KeyID names the node's signing key, in advanced.config and in the
	// kid header of every token.
	KeyID = "oauthnode"
	// Subject is the sub claim of the tokens Token mints: the username the
	// broker gives the connection, whatever the client sends.
	Subject = "oauthnode-client"

	// subnet and port are the node's own, apart from the cluster's
	// 10.201.0.0/24 and 5681–5683, so that a log line says whose it is.
	subnet = "10.202.0."
	port   = 5691
	plugin = "rabbitmq_auth_backend_oauth2"
)

// pluginGlob finds the plugin in the install package cluster runs.
const pluginGlob = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/" + plugin + "-*"

// rabbitmqConf is appended to the rabbitmq.conf package cluster writes.
// The internal backend is left out: every client logs in with a token, and
// a refused token must be refused by the OAuth 2 backend, with its reason,
// not fall through to the internal database's "invalid credentials". The
// CLI needs no backend (it talks Erlang distribution).
const rabbitmqConf = `
# written by amqp091-drainer's internal/oauthnode
auth_backends.1 = rabbit_auth_backend_oauth2
`

// advancedConfig is the node's advanced.config: the resource server id,
// and the signing key as a JWK of type oct (k is the key, base64url),
// which 3.10.8's uaa_jwt_jwk takes as it is (the UAA form, kty MAC with
// the raw key in value, is converted to this one). Only HS256 is
// accepted, so an unsigned token (alg none) is refused.
const advancedConfig = `[
 {rabbitmq_auth_backend_oauth2, [
   {resource_server_id, <<"%s">>},
   {key_config, [
     {default_key, <<"%s">>},
     {algorithms, [<<"HS256">>]},
     {signing_keys, #{<<"%[2]s">> => {map, #{<<"kty">> => <<"oct">>,
                                            <<"alg">> => <<"HS256">>,
                                            <<"k">> => <<"%s">>}}}}
   ]}
 ]}
].
`

// DefaultName is the name of the node [Start] boots unless told otherwise.
const DefaultName = "oauth"

// Options configures [Start]. The zero value is usable.
type Options struct {
	// Name gives the node its namespaces (amqpd-<Name>, amqpd-<Name>-hub),
	// its Erlang node name and its default Dir: 1 to 12 of [a-z0-9].
	// Start first kills a node of the same name, so two test binaries
	// that may run at once use different names. Default [DefaultName].
	Name string
	// Dir holds the node's cookie, config, data and logs. Default:
	// $TMPDIR/amqpd-<Name>. It is wiped at Start, so it must be missing,
	// empty or an earlier node's.
	Dir string
	// Logger receives progress messages. Nil: silent.
	Logger *slog.Logger
}

// Node is a running OAuth 2 node. Its methods may be called from several
// goroutines.
type Node struct {
	c   *cluster.Cluster
	n   cluster.Node
	key []byte
}

// Usable reports whether this machine can run the node: what package
// cluster needs (Linux, root, ip netns, a RabbitMQ install) and the OAuth
// 2 plugin. reason is one line, for t.Skip.
func Usable() (ok bool, reason string) {
	if ok, why := cluster.Usable(); !ok {
		return false, why
	}
	if m, _ := filepath.Glob(pluginGlob); len(m) == 0 {
		return false, "oauthnode: the RabbitMQ install has no " + plugin + " plugin"
	}
	return true, ""
}

// Start boots the node with a fresh signing key and waits until it runs
// (about 7 s on the reference machine), first removing whatever an earlier node of the same name
// left (its VM, its namespaces, o.Dir's contents). If Start fails, it
// tears down what it built; the error says which log to read.
func Start(ctx context.Context, o Options) (*Node, error) {
	if ok, why := Usable(); !ok {
		return nil, errors.New(why)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	k := base64.RawURLEncoding.EncodeToString(key)
	c, err := cluster.Start(ctx, cluster.Options{
		Dir:    o.Dir,
		Logger: o.Logger,
		Standalone: &cluster.Standalone{
			Name:           cmp.Or(o.Name, DefaultName),
			Subnet:         subnet,
			Port:           port,
			Config:         rabbitmqConf,
			AdvancedConfig: fmt.Sprintf(advancedConfig, ResourceServerID, KeyID, k),
			Plugins:        []string{plugin},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("oauthnode: %w", err)
	}
	return &Node{c: c, n: c.Nodes()[0], key: key}, nil
}

// URL returns the node's AMQP URL, without user info: the credentials are
// a token, given as amqp.PlainAuth's Password in amqp.Config.SASL.
func (n *Node) URL() string { return "amqp://" + n.c.Addr(n.n) + "/" }

// Dial connects to addr from inside the node's hub namespace, the only
// place it is reachable from. It fits amqp.Config.Dial.
func (n *Node) Dial(network, addr string) (net.Conn, error) { return n.c.Dial(network, addr) }

// Dir returns the directory holding the node's files; its logs are in
// <Name>/log below it.
func (n *Node) Dir() string { return n.c.Dir() }

// Ctl runs rabbitmqctl against the node with args, and returns its
// standard output.
func (n *Node) Ctl(ctx context.Context, args ...string) (string, error) {
	return n.c.Ctl(ctx, n.n, args...)
}

// Stop stops the node and deletes its namespaces and data. It is bounded
// and safe to call more than once.
func (n *Node) Stop() error { return n.c.Stop() }
