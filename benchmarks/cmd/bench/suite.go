package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
)

// environment is what the report says about the machine.
type environment struct {
	Date      string `json:"date"`
	Broker    string `json:"broker_version"`
	BrokerURL string `json:"-"`
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Upstream  string `json:"upstream"`
	// Builds says, per build, which amqp091-go its binary was built
	// against, as the binary itself reports it.
	Builds map[string]string `json:"builds"`
	Reps   int               `json:"reps"`
	Quick  bool              `json:"quick"`
	Plan   string            `json:"plan,omitempty"` // -plan; empty in results from before plans
	// Command is what generated the results: the plan's make command, or
	// the runner's command line when flags changed the plan.
	Command string `json:"command,omitempty"`
	// Seconds is the wall time from the start to the scenarios' end;
	// TotalSeconds adds the sections after them (micro-benchmarks,
	// failover, Observer overhead).
	Seconds      float64 `json:"seconds"`
	TotalSeconds float64 `json:"total_seconds,omitempty"`
}

// describeEnvironment reads the broker's version from its handshake and
// the machine's from the runtime and /proc.
func describeEnvironment() (environment, error) {
	u := os.Getenv("AMQP_URL")
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
	env := environment{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), BrokerURL: u,
		CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	conn, err := amqp.Dial(u)
	if err != nil {
		return env, fmt.Errorf("no broker at %s (%v); start one with `rabbitmq-server -detached`, or set AMQP_URL", redact(u), err)
	}
	env.Broker, _ = conn.Properties["version"].(string)
	_ = conn.Close()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				env.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("upstream/PIN"); err == nil {
		env.Upstream = strings.Join(strings.Fields(string(b))[:2], " ")
	}
	return env, nil
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

// sweep deletes whatever queues and proxies a killed measurement left
// behind: every one is named with scenario.QueuePrefix. Queues are listed
// through the management API when it answers; a measurement that ends
// normally deletes its own.
func sweep(brokerURL, toxURL string) {
	if proxies, err := toxiproxy.NewClient(toxURL).Proxies(); err == nil {
		for name, p := range proxies {
			if strings.HasPrefix(name, scenario.QueuePrefix) {
				_ = p.Delete()
			}
		}
	}
	u, err := url.Parse(brokerURL)
	if err != nil {
		return
	}
	user := u.User.Username()
	pass, _ := u.User.Password()
	mgmt := os.Getenv("RABBITMQ_MANAGEMENT_URL")
	if mgmt == "" {
		mgmt = "http://" + u.Hostname() + ":15672"
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	client := &http.Client{Timeout: 5 * time.Second}
	req, _ := http.NewRequest("GET", mgmt+"/api/queues/"+url.PathEscape(vhost)+"?columns=name", nil)
	req.SetBasicAuth(user, pass)
	resp, err := client.Do(req)
	if err != nil {
		logf("sweep: management API not reachable (%v); not checking for leftover queues", err)
		return
	}
	defer resp.Body.Close()
	var queues []struct{ Name string }
	if json.NewDecoder(resp.Body).Decode(&queues) != nil {
		return
	}
	for _, q := range queues {
		if !strings.HasPrefix(q.Name, scenario.QueuePrefix) {
			continue
		}
		req, _ := http.NewRequest("DELETE", mgmt+"/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(q.Name), nil)
		req.SetBasicAuth(user, pass)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			logf("sweep: deleted leftover queue %s", q.Name)
		}
	}
}

// suite is everything a run produced, as results.json holds it.
type suite struct {
	Env       environment      `json:"environment"`
	Scenarios []scenarioResult `json:"scenarios"`
	Micro     *microResult     `json:"micro,omitempty"`
	Failover  *failoverResult  `json:"failover,omitempty"`
	Overhead  *overheadResult  `json:"overhead,omitempty"`
}

// scenarioResult is one scenario's results.
type scenarioResult struct {
	Name  string       `json:"name"`
	Title string       `json:"title"`
	About string       `json:"about"`
	Cases []caseResult `json:"cases"`
	// Messages is the message count its runs were given (-n, or the
	// plan's); 0 when they kept the scenario's own.
	Messages int `json:"messages,omitempty"`
	spec     *scenario.Scenario
}

// caseResult is one case's results over variants and repetitions.
type caseResult struct {
	Case     string   `json:"case"`
	Variants []string `json:"variants"`
	// Planned are the variants the plan gave the case, run or not (an
	// interrupted run leaves some unrun): a target needing a variant that
	// is not among them is not judged (scenario.Target.Judge).
	Planned []string                           `json:"planned,omitempty"`
	Agg     scenario.Agg                       `json:"aggregate"`
	Points  map[string]map[string][]hist.Point `json:"points,omitempty"` // variant, latency name: median over reps
	Notes   map[string][]string                `json:"notes,omitempty"`
	Errors  []string                           `json:"errors,omitempty"`
	Runs    []output                           `json:"runs"`
}

// assemble groups the runs by scenario and case and aggregates them.
func assemble(env environment, p plan, runs []run) suite {
	s := suite{Env: env}
	s.Env.Builds = map[string]string{}
	for _, r := range runs {
		if r.out.AMQP091 != "" {
			s.Env.Builds[r.variant.Build] = r.out.AMQP091
		}
	}
	for _, l := range p.scenarios {
		spec, err := scenario.Lookup(l.Name)
		if err != nil {
			continue
		}
		sr := scenarioResult{Name: l.Name, Title: spec.Title, About: spec.About, Messages: p.messages[l.Name], spec: spec}
		for _, c := range l.Cases {
			cr := caseResult{Case: c, Agg: scenario.Agg{}, Points: map[string]map[string][]hist.Point{},
				Notes: map[string][]string{}, Planned: p.variantsOf(l.Name, c)}
			byVariant := map[string][]output{}
			for _, r := range runs {
				if r.scenario.Name != l.Name || r.c != c {
					continue
				}
				cr.Runs = append(cr.Runs, r.out)
				if !slices.Contains(cr.Variants, r.variant.Name) {
					cr.Variants = append(cr.Variants, r.variant.Name)
				}
				if r.out.Error != "" {
					cr.Errors = append(cr.Errors, fmt.Sprintf("%s rep %d: %s", r.variant.Name, r.rep+1, r.out.Error))
				}
				if r.out.Result != nil {
					byVariant[r.variant.Name] = append(byVariant[r.variant.Name], r.out)
				}
			}
			for v, outs := range byVariant {
				var metrics []map[string]float64
				for _, o := range outs {
					metrics = append(metrics, o.Result.Metrics)
					for _, n := range o.Result.Notes {
						if !slices.Contains(cr.Notes[v], n) {
							cr.Notes[v] = append(cr.Notes[v], n)
						}
					}
				}
				cr.Agg[v] = scenario.Aggregate(metrics)
				cr.Points[v] = medianPoints(outs)
			}
			sr.Cases = append(sr.Cases, cr)
		}
		s.Scenarios = append(s.Scenarios, sr)
	}
	return s
}

// planned returns the variants a case was planned in: Planned, or, in
// results from before it was kept, the variants that ran.
func (cr caseResult) planned() []string {
	if len(cr.Planned) > 0 {
		return cr.Planned
	}
	return cr.Variants
}

// medianPoints takes, for each latency distribution and percentile, the
// median over the repetitions.
func medianPoints(outs []output) map[string][]hist.Point {
	res := map[string][]hist.Point{}
	names := map[string]bool{}
	for _, o := range outs {
		for n := range o.Result.Latency {
			names[n] = true
		}
	}
	for n := range names {
		var per [][]hist.Point
		for _, o := range outs {
			if s, ok := o.Result.Latency[n]; ok && len(s.Points) > 0 {
				per = append(per, s.Points)
			}
		}
		if len(per) == 0 {
			continue
		}
		pts := make([]hist.Point, len(per[0]))
		for i := range pts {
			var vs []float64
			for _, p := range per {
				if i < len(p) {
					vs = append(vs, p[i].Millis)
				}
			}
			slices.Sort(vs)
			pts[i] = hist.Point{Percentile: per[0][i].Percentile, Millis: vs[len(vs)/2]}
		}
		res[n] = pts
	}
	return res
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
