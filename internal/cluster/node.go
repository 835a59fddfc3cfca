package cluster

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// rmqBin holds the unwrapped scripts. The /usr/sbin wrappers switch to
	// the rabbitmq user and would use the system node's cookie.
	rmqBin    = "/usr/lib/rabbitmq/bin"
	rmqServer = rmqBin + "/rabbitmq-server"
	rmqCtl    = rmqBin + "/rabbitmqctl"

	// prefix marks every namespace, node name and bridge of ours, apart
	// from the shared script's rmqc-*.
	prefix = "amqpd-"
	hubNS  = prefix + "hub"
	// bridge lives in a layout's hub namespace, so every layout may use
	// the same name.
	bridge = "amqpdbr0"

	stateFile = "cluster.json"

	// gracefulStop bounds `rabbitmqctl stop` in Stop before kill -9.
	gracefulStop = 30 * time.Second
)

// state is what Start records in Dir for Attach.
type state struct {
	PartitionHandling string `json:"partition_handling"`
	NetTicktime       int    `json:"net_ticktime"`
	// Standalone says, for a standalone node's Dir, which layout Attach
	// must rebuild: a three-node layout over it would stop the cluster.
	Standalone *Standalone `json:"standalone,omitempty"`
}

func nodeName(n Node) string { return "rabbit@" + prefix + string(n) }
func nodeNS(n Node) string   { return prefix + string(n) }

func (c *Cluster) nodeDir(n Node) string { return filepath.Join(c.o.Dir, string(n)) }
func (c *Cluster) pidFile(n Node) string { return filepath.Join(c.nodeDir(n), "beam.pid") }

// env is the whole environment of every server and CLI process of n: no
// variable of ours leaks in, in particular no HOME (whose cookie would be
// the caller's) and no RABBITMQ_* of the system install.
func (c *Cluster) env(n Node) []string {
	d := c.nodeDir(n)
	return []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		// The CLI is Elixir, which warns and misbehaves without UTF-8.
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"HOME=" + filepath.Join(c.o.Dir, "home"),
		// Empty, so that /etc/rabbitmq/rabbitmq-env.conf (which names
		// rabbit@localhost) is never read.
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(c.o.Dir, "rabbitmq-env.conf"),
		"RABBITMQ_NODENAME=" + nodeName(n),
		"RABBITMQ_NODE_IP_ADDRESS=" + c.layout().nodeIP(n),
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(c.layout().amqpPort(n)),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(c.layout().distPort(n)),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(d, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(d, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(d, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(d, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(d, "log"),
		"RABBITMQ_PID_FILE=" + c.pidFile(n),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel net_ticktime " + strconv.Itoa(c.o.NetTicktime),
		// Host names amqpd-a… resolve through this file, so /etc/hosts is
		// never touched.
		"ERL_INETRC=" + filepath.Join(c.o.Dir, "inetrc"),
	}
}

// writeFiles creates a fresh Dir: cookie, env file, inetrc, and per node
// config, plugins file, and empty data and log directories.
func (c *Cluster) writeFiles() error {
	if err := c.clearDir(); err != nil {
		return err
	}
	home := filepath.Join(c.o.Dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	// The state first: it also marks Dir as ours for the next Start, even
	// if this one fails half-way.
	if err := c.writeState(); err != nil {
		return err
	}
	if err := writeCookie(home); err != nil {
		return err
	}
	for _, n := range c.layout().nodes {
		for _, sub := range []string{"log", "mnesia"} {
			if err := os.MkdirAll(filepath.Join(c.nodeDir(n), sub), 0o755); err != nil {
				return err
			}
		}
	}
	for name, body := range c.configFiles() {
		if err := os.WriteFile(filepath.Join(c.o.Dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// clearDir removes Dir and all it holds. Dir is wiped, so it must be ours:
// missing, empty, or holding an earlier cluster's state. A mistaken Dir
// (a home, the checkout) must not be deleted.
func (c *Cluster) clearDir() error {
	d := c.o.Dir
	if ents, err := os.ReadDir(d); err == nil && len(ents) > 0 {
		if _, err := os.Stat(filepath.Join(d, stateFile)); err != nil {
			return fmt.Errorf("cluster: %s is not empty and holds no cluster state (%s); not wiping it",
				d, stateFile)
		}
	}
	if err := os.RemoveAll(d); err != nil {
		return fmt.Errorf("cluster: clear %s: %w", d, err)
	}
	return nil
}

// writeState records the boot options in Dir, for Attach.
func (c *Cluster) writeState() error {
	st, err := json.Marshal(state{
		PartitionHandling: c.o.PartitionHandling,
		NetTicktime:       c.o.NetTicktime,
		Standalone:        c.o.Standalone,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.o.Dir, stateFile), st, 0o644)
}

// writeCookie writes a fresh random Erlang cookie into home, the nodes'
// and the CLI's HOME: the nodes share it with each other and with no one
// else (the system broker's cookie is never read).
func writeCookie(home string) error {
	cookie := make([]byte, 20)
	if _, err := rand.Read(cookie); err != nil {
		return err
	}
	// Erlang refuses a cookie file that others can read.
	text := strings.ToUpper(hex.EncodeToString(cookie))
	return os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(text), 0o400)
}

// configFiles returns the text files of Dir, by path within it: the empty
// env file, the inetrc that resolves the nodes' host names, and each
// node's config, advanced config and plugins file (a standalone node's
// own additions included).
func (c *Cluster) configFiles() map[string]string {
	var inetrc strings.Builder
	for _, n := range c.layout().nodes {
		fmt.Fprintf(&inetrc, "{host, {%s}, [%q]}.\n", strings.ReplaceAll(c.layout().nodeIP(n), ".", ","), nodeNS(n))
	}
	inetrc.WriteString("{lookup, [file, native]}.\n")
	files := map[string]string{
		"rabbitmq-env.conf": "",
		"inetrc":            inetrc.String(),
	}
	var s Standalone
	if c.o.Standalone != nil {
		s = *c.o.Standalone
	}
	advanced := cmp.Or(s.AdvancedConfig, "[].\n")
	plugins := "[" + strings.Join(s.Plugins, ",") + "].\n"
	for _, n := range c.layout().nodes {
		files[filepath.Join(string(n), "rabbitmq.conf")] = fmt.Sprintf(
			`# written by amqp091-drainer's internal/cluster
listeners.tcp.default = %s
# clients connect from the hub namespace, not from loopback
loopback_users = none
cluster_partition_handling = %s
log.file.level = info
log.console = false
`, c.layout().amqpAddr(n), c.o.PartitionHandling) + s.Config
		files[filepath.Join(string(n), "advanced.config")] = advanced
		files[filepath.Join(string(n), "enabled_plugins")] = plugins
	}
	return files
}

// boot starts rabbitmq-server for n inside its namespace, in a session of
// its own, and returns at once. A goroutine reaps the launcher so a killed
// node leaves no zombie behind.
func (c *Cluster) boot(n Node) error {
	if err := os.WriteFile(c.pidFile(n), nil, 0o644); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(c.nodeDir(n), "log", "stdout.log"),
		os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(ipCmd(), "netns", "exec", nodeNS(n), rmqServer)
	cmd.Env = c.env(n)
	cmd.Dir = c.nodeDir(n)
	cmd.Stdout, cmd.Stderr = out, out
	// A session of its own: a ^C meant for a test must not reach the node.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cluster: boot %s: %w", n, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	c.mu.Lock()
	c.launched[n] = done
	c.mu.Unlock()
	c.log.Debug("booting", "node", n, "launcher", cmd.Process.Pid)
	return nil
}

// await waits until n has written its pid file and then until
// `rabbitmqctl await_startup` succeeds, within BootTimeout.
func (c *Cluster) await(ctx context.Context, n Node) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.BootTimeout)
	defer cancel()
	log := filepath.Join(c.nodeDir(n), "log")
	c.mu.Lock()
	done := c.launched[n]
	c.mu.Unlock()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(c.pidFile(n)); err == nil && len(bytes.TrimSpace(b)) > 0 {
			break
		}
		select {
		case <-done: // nil for an attached node: never ready
			return fmt.Errorf("cluster: node %s exited while booting; see %s", n, log)
		case <-ctx.Done():
			return fmt.Errorf("cluster: node %s wrote no pid file: %w; see %s", n, ctx.Err(), log)
		case <-tick.C:
		}
	}
	secs := int(time.Until(deadline(ctx)).Seconds())
	if _, err := c.Ctl(ctx, n, "await_startup", "--timeout", strconv.Itoa(max(secs, 1))); err != nil {
		return fmt.Errorf("cluster: node %s did not boot: %w; see %s", n, err, log)
	}
	return nil
}

func deadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Minute)
	}
	return d
}

// Ctl runs `rabbitmqctl -n rabbit@amqpd-<n> args...` inside n's namespace
// under n's environment and returns its standard output. ctx bounds it: on
// expiry the whole process group (CLI and its Erlang VM) is killed. The
// error carries standard error.
func (c *Cluster) Ctl(ctx context.Context, n Node, args ...string) (string, error) {
	if err := c.layout().check(n); err != nil {
		return "", err
	}
	argv := append([]string{"netns", "exec", nodeNS(n), rmqCtl, "-n", nodeName(n)}, args...)
	cmd := exec.CommandContext(ctx, ipCmd(), argv...)
	cmd.Env = c.env(n)
	cmd.Dir = c.o.Dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Its own process group, so that cancellation reaches the CLI's VM
	// (the rabbitmqctl script runs erl as a child), not only `ip`.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if ctx.Err() != nil {
			err = ctx.Err() // "signal: killed" would hide why
		}
		return stdout.String(), fmt.Errorf("cluster: rabbitmqctl -n %s %s: %w: %s",
			nodeName(n), strings.Join(args, " "), err, lastLines(msg, 3))
	}
	return stdout.String(), nil
}

func lastLines(s string, k int) string {
	l := strings.Split(s, "\n")
	if len(l) > k {
		l = l[len(l)-k:]
	}
	return strings.Join(l, " | ")
}

// beamPID returns the pid of n's beam.smp, from its pid file, after
// checking that it is ours.
func (c *Cluster) beamPID(n Node) (int, error) {
	b, err := os.ReadFile(c.pidFile(n))
	if err != nil {
		return 0, fmt.Errorf("cluster: node %s: %w", n, err)
	}
	p, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("cluster: node %s is not running (no pid in %s)", n, c.pidFile(n))
	}
	if !c.ours(n, p) {
		return 0, fmt.Errorf("cluster: node %s is not running (pid %d is not its beam.smp)", n, p)
	}
	return p, nil
}

// ours reports whether p is a live beam.smp started with n's node name and
// pid file: never signal a pid on the word of a file alone.
func (c *Cluster) ours(n Node, p int) bool {
	if !alive(p) {
		return false
	}
	env := environ(p)
	return comm(p) == "beam.smp" && env["RABBITMQ_NODENAME"] == nodeName(n) &&
		env["RABBITMQ_PID_FILE"] == c.pidFile(n)
}

func (c *Cluster) killVerified(n Node, p int) error { return c.signalVerified(n, p, syscall.SIGKILL) }

// signalVerified sends sig to p once it is known to be n's beam.smp.
func (c *Cluster) signalVerified(n Node, p int, sig syscall.Signal) error {
	if !c.ours(n, p) {
		return fmt.Errorf("cluster: node %s: pid %d is not our beam.smp; not signalling it", n, p)
	}
	if err := syscall.Kill(p, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("cluster: kill -%d %d (node %s): %w", int(sig), p, n, err)
	}
	return nil
}

// reapLaunchers waits (bounded) for the launchers this process started,
// whose reaping goroutines would otherwise outlive Stop.
func (c *Cluster) reapLaunchers() {
	c.mu.Lock()
	l := c.launched
	c.launched = map[Node]chan struct{}{}
	c.mu.Unlock()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	for n, done := range l {
		select {
		case <-done:
		case <-t.C:
			c.log.Warn("rabbitmq-server launcher still there", "node", n)
			return
		}
	}
}

func comm(p int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/comm")
	return strings.TrimSpace(string(b))
}

func environ(p int) map[string]string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/environ")
	m := map[string]string{}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			m[k] = v
		}
	}
	return m
}

// alive reports whether p exists and is not a zombie.
func alive(p int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces or parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// waitGone polls until p has exited, or ctx ends.
func waitGone(ctx context.Context, p int) bool {
	for alive(p) {
		select {
		case <-ctx.Done():
			return !alive(p)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// cleanStale kills every beam.smp that runs one of l's node names (in any
// Dir: the names are l's alone) and deletes l's namespaces, which kills
// what else ran in them (each node's epmd). Other layouts' nodes and
// namespaces are left alone.
func (l *layout) cleanStale(log *slog.Logger) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var killed []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || comm(p) != "beam.smp" {
			continue
		}
		if _, ok := l.nodeOf(environ(p)["RABBITMQ_NODENAME"]); !ok {
			continue
		}
		if err := syscall.Kill(p, syscall.SIGKILL); err == nil {
			log.Warn("killed a stale node", "pid", p)
			killed = append(killed, p)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range killed {
		if !waitGone(ctx, p) {
			return fmt.Errorf("cluster: stale beam.smp %d survived kill -9", p)
		}
	}
	return l.netDown()
}
