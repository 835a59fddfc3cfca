// Command cleanup deletes, through the RabbitMQ management API, the queues
// and exchanges that watermill's test suite declared in the runs whose
// go test -json output it is given. watermill's tests declare durable
// queues and exchanges named after each test's random ID ("topic-<ID>...")
// and leave them behind: hundreds per run, with messages in them. Only names
// that start with "topic-" and one of the IDs those runs used are deleted,
// so nothing another suite declared on a shared broker is touched.
//
//	cleanup [-api http://127.0.0.1:15672] [-user guest] [-password guest] run.json...
//
// RABBITMQ_MANAGEMENT_URL sets the default of -api.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"
)

var uuidRe = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func main() {
	def := os.Getenv("RABBITMQ_MANAGEMENT_URL")
	if def == "" {
		def = "http://127.0.0.1:15672"
	}
	api := flag.String("api", def, "management API base URL")
	user := flag.String("user", "guest", "management API user")
	password := flag.String("password", "guest", "management API password")
	flag.Parse()
	ids := map[string]bool{}
	for _, f := range flag.Args() {
		if err := testIDs(f, ids); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
			os.Exit(1)
		}
	}
	c := &client{base: strings.TrimSuffix(*api, "/"), user: *user, password: *password,
		http: &http.Client{Timeout: 30 * time.Second}}
	for _, kind := range []string{"queues", "exchanges"} {
		n, err := c.deleteOwned(kind, ids)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cleanup: %s: %v\n", kind, err)
			os.Exit(1)
		}
		fmt.Printf("cleanup: deleted %d %s of %d test IDs\n", n, kind, len(ids))
	}
}

// testIDs adds the UUID elements of the test names in a go test -json file.
func testIDs(file string, ids map[string]bool) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e struct{ Test string }
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		for _, p := range strings.Split(e.Test, "/") {
			if uuidRe.MatchString(p) {
				ids[p] = true
			}
		}
	}
	return sc.Err()
}

type client struct {
	base, user, password string
	http                 *http.Client
}

func (c *client) do(method, path string) (*http.Response, error) {
	req, err := http.NewRequest(method, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(c.user, c.password)
	return c.http.Do(req)
}

// deleteOwned deletes the queues or exchanges named "topic-<ID>..." for an
// ID in ids, and returns how many it deleted.
func (c *client) deleteOwned(kind string, ids map[string]bool) (int, error) {
	resp, err := c.do("GET", "/api/"+kind+"?columns=name,vhost")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /api/%s: %s", kind, resp.Status)
	}
	var list []struct{ Name, Vhost string }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return 0, err
	}
	n := 0
	for _, q := range list {
		rest, ok := strings.CutPrefix(q.Name, "topic-")
		if !ok || len(rest) < 36 || !ids[rest[:36]] {
			continue
		}
		r, err := c.do("DELETE", "/api/"+kind+"/"+url.PathEscape(q.Vhost)+"/"+url.PathEscape(q.Name))
		if err != nil {
			return n, err
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusNoContent && r.StatusCode != http.StatusNotFound {
			return n, fmt.Errorf("DELETE %s %q: %s", kind, q.Name, r.Status)
		}
		if r.StatusCode == http.StatusNoContent {
			n++
		}
	}
	return n, nil
}
