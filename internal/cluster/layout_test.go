package cluster

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A standalone node shares no namespace, node name, subnet or Dir with the
// cluster, so that neither's cleanup touches the other.
func TestStandaloneLayout(t *testing.T) {
	o := Options{Standalone: &Standalone{Name: "oauth"}}.withDefaults()
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	c := newCluster(o)
	if got, want := c.Nodes(), []Node{"oauth"}; !slices.Equal(got, want) {
		t.Fatalf("Nodes() = %v, want %v", got, want)
	}
	if got, want := c.URL("oauth"), "amqp://guest:guest@10.202.0.1:5691/"; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	if got, want := c.layout().namespaces(), []string{"amqpd-oauth", "amqpd-oauth-hub"}; !slices.Equal(got, want) {
		t.Errorf("namespaces = %v, want %v", got, want)
	}
	for _, ns := range c.layout().namespaces() {
		if slices.Contains(three.namespaces(), ns) {
			t.Errorf("namespace %s is also the cluster's", ns)
		}
	}
	if _, ok := three.nodeOf(nodeName("oauth")); ok {
		t.Error("the cluster's cleanup would take the standalone node for its own")
	}
	if _, ok := c.layout().nodeOf(nodeName(A)); ok {
		t.Error("the standalone node's cleanup would take node a for its own")
	}
	if o.Dir != filepath.Join(os.TempDir(), "amqpd-oauth") || c.layout().distPort("oauth") != 25691 {
		t.Errorf("defaults: Dir %s, distribution port %d", o.Dir, c.layout().distPort("oauth"))
	}
	if err := c.layout().check(A); err == nil {
		t.Error("node a accepted by a standalone node")
	}
	for _, s := range []Standalone{
		{Name: "a"}, {Name: "hub"}, {Name: "Oauth"}, {Name: "toolongforaveth"},
		{Name: "x", Subnet: "10.201.0."}, {Name: "x", Subnet: "10.202.0"}, {Name: "x", Port: 80},
	} {
		if err := (Options{Standalone: &s}).withDefaults().validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

// A standalone node's files carry its own configuration, and its state
// says which layout Attach must rebuild.
func TestStandaloneFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "node")
	s := &Standalone{Name: "x", Config: "auth_backends.1 = rabbit_auth_backend_oauth2\n",
		AdvancedConfig: "[{rabbit, []}].\n", Plugins: []string{"p1", "p2"}}
	c := newCluster(Options{Dir: dir, Standalone: s}.withDefaults())
	if err := c.writeFiles(); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	conf := read("x/rabbitmq.conf")
	if !strings.Contains(conf, "listeners.tcp.default = 10.202.0.1:5691\n") || !strings.HasSuffix(conf, s.Config) {
		t.Errorf("rabbitmq.conf:\n%s", conf)
	}
	if got := read("x/advanced.config"); got != s.AdvancedConfig {
		t.Errorf("advanced.config: %q", got)
	}
	if got := read("x/enabled_plugins"); got != "[p1,p2].\n" {
		t.Errorf("enabled_plugins: %q", got)
	}
	if got := read("inetrc"); !strings.Contains(got, `{host, {10,202,0,1}, ["amqpd-x"]}.`) {
		t.Errorf("inetrc:\n%s", got)
	}
	var st state
	if err := json.Unmarshal([]byte(read(stateFile)), &st); err != nil || st.Standalone == nil ||
		st.Standalone.Name != "x" || st.Standalone.Port != 5691 {
		t.Errorf("state %+v, %v: want the standalone node recorded", st, err)
	}
}
