// Command clusterctl drives package cluster's three-node RabbitMQ cluster
// from a shell; scripts/cluster runs it. Each invocation re-attaches to the
// cluster through the files in its directory, so start, kill, partition and
// stop can come from separate processes.
//
//	clusterctl [flags] start|stop|status|urls|usable|heal
//	clusterctl [flags] kill|restart|stop-app|start-app N
//	clusterctl [flags] partition N [peers|full]
//	clusterctl [flags] leader QUEUE
//	clusterctl [flags] wait [N]
//	clusterctl [flags] ctl N ARGS...
//	clusterctl [flags] exec CMD...
//
// exec runs CMD inside the hub namespace, where the nodes are reachable,
// with AMQP091_CLUSTER_URLS set to the three URLs, comma-separated.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "clusterctl:", err)
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(flag.CommandLine.Output(), `usage: clusterctl [flags] COMMAND [ARGS]
commands:
  start                    boot a, b, c (cleaning up any earlier cluster) and join b, c to a
  stop                     stop the nodes, delete the namespaces
  status                   nodes, what each sees, cuts
  urls                     the three AMQP URLs (reachable from the hub: use exec)
  usable                   exit 0 if this machine can run a cluster, else print why and exit 3
  kill N | restart N       kill -9 node N's VM | boot it again
  stop-app N | start-app N rabbitmqctl stop_app | start_app on N
  partition N [peers|full] cut N from its peers (clients still reach it) | from everyone
  heal                     undo every cut
  leader QUEUE             the quorum queue's leader
  wait [N]                 until N (default 3) nodes run, with no partition recorded
                           (bounded by -boot-timeout)
  ctl N ARGS...            rabbitmqctl -n rabbit@amqpd-N ARGS...
  exec CMD...              run CMD in the hub namespace, AMQP091_CLUSTER_URLS exported
N is a, b or c. flags:`)
	flag.PrintDefaults()
}

// run parses the flags and runs the command. Commands that need no
// cluster run first; every other one attaches to the cluster in -dir.
func run() error {
	o, args := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cmd, args := args[0], args[1:]
	done, err := runDetached(ctx, o, cmd)
	if done {
		return err
	}
	c, err := cluster.Attach(o)
	if err != nil {
		if cmd == "stop" {
			// Nothing recorded here, but namespaces or nodes of an
			// earlier cluster may remain: Stop of an empty cluster
			// removes those.
			return cluster.Cleanup()
		}
		return err
	}
	return runAttached(ctx, c, o, cmd, args)
}

// parseFlags reads the flags into the cluster's options and returns them
// with the command and its arguments; without a command it prints the
// usage and exits 2.
func parseFlags() (cluster.Options, []string) {
	var o cluster.Options
	flag.StringVar(&o.Dir, "dir", os.Getenv("AMQPD_CLUSTER_DIR"),
		"state directory (default $AMQPD_CLUSTER_DIR, else $TMPDIR/amqpd-cluster)")
	flag.StringVar(&o.PartitionHandling, "partition-handling", "ignore",
		"start: ignore, pause_minority or autoheal")
	flag.IntVar(&o.NetTicktime, "net-ticktime", 60, "start: Erlang net_ticktime in seconds")
	flag.DurationVar(&o.BootTimeout, "boot-timeout", 120*time.Second,
		"start, restart: bound on one node's boot")
	quiet := flag.Bool("q", false, "no progress messages")
	flag.Usage = usage
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		usage()
		os.Exit(2)
	}
	level := slog.LevelInfo
	if *quiet {
		level = slog.LevelWarn
	}
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return o, args
}

// runDetached runs the commands that need no attached cluster (usable,
// start, urls); done is false for every other command.
func runDetached(ctx context.Context, o cluster.Options, cmd string) (done bool, err error) {
	switch cmd {
	case "usable":
		if ok, why := cluster.Usable(); !ok {
			fmt.Println(why)
			os.Exit(3)
		}
		return true, nil
	case "start":
		c, err := cluster.Start(ctx, o)
		if err != nil {
			return true, err
		}
		fmt.Println("AMQP091_CLUSTER_URLS=" + strings.Join(c.URLs(), ","))
		return true, nil
	case "urls":
		// The URLs are fixed by the package: a zero Cluster knows them.
		var c cluster.Cluster
		fmt.Println(strings.Join(c.URLs(), ","))
		return true, nil
	}
	return false, nil
}

// runAttached runs a command on the attached cluster c; an unknown command
// prints the usage and exits 2.
func runAttached(ctx context.Context, c *cluster.Cluster, o cluster.Options, cmd string,
	args []string) error {
	switch cmd {
	case "stop":
		return c.Stop()
	case "status":
		fmt.Print(c.Status(ctx))
		return nil
	case "heal":
		return c.Heal()
	case "kill", "restart", "stop-app", "start-app", "partition", "ctl":
		n, rest, err := nodeArg(cmd, args)
		if err != nil {
			return err
		}
		return runOnNode(ctx, c, cmd, n, rest)
	case "wait":
		return waitRunning(ctx, c, o, args)
	case "leader":
		return printLeader(ctx, c, args)
	case "exec":
		return execInHub(ctx, c, args)
	}
	usage()
	os.Exit(2)
	return nil
}

// nodeArg takes the node a command names first from args, and returns
// the arguments after it.
func nodeArg(cmd string, args []string) (cluster.Node, []string, error) {
	if len(args) == 0 {
		return "", nil, fmt.Errorf("%s: which node (a, b or c)?", cmd)
	}
	n := cluster.Node(args[0])
	for _, m := range cluster.Nodes {
		if n == m {
			return n, args[1:], nil
		}
	}
	return "", nil, fmt.Errorf("%s: unknown node %q (a, b or c)", cmd, args[0])
}

// runOnNode runs a command that acts on one node, n.
func runOnNode(ctx context.Context, c *cluster.Cluster, cmd string, n cluster.Node,
	args []string) error {
	switch cmd {
	case "kill":
		return c.Kill(n)
	case "restart":
		return c.Restart(ctx, n)
	case "stop-app":
		return c.StopApp(ctx, n)
	case "start-app":
		return c.StartApp(ctx, n)
	case "partition":
		how := cluster.CutPeers
		if len(args) > 0 {
			switch args[0] {
			case "peers":
			case "full":
				how = cluster.CutFull
			default:
				return fmt.Errorf("partition: %q: want peers or full", args[0])
			}
		}
		return c.Partition(n, how)
	case "ctl":
		out, err := c.Ctl(ctx, n, args...)
		fmt.Print(out)
		return err
	}
	return fmt.Errorf("%s: not a node command", cmd)
}

// waitRunning waits, within -boot-timeout, until as many nodes as args
// says (default all) run with no partition recorded.
func waitRunning(ctx context.Context, c *cluster.Cluster, o cluster.Options, args []string) error {
	want := len(cluster.Nodes)
	if len(args) > 0 {
		var err error
		if want, err = strconv.Atoi(args[0]); err != nil {
			return fmt.Errorf("wait: %q is not a number of nodes", args[0])
		}
	}
	wctx, cancel := context.WithTimeout(ctx, o.BootTimeout)
	defer cancel()
	return c.WaitRunning(wctx, want)
}

// printLeader prints the leader of the quorum queue args names.
func printLeader(ctx context.Context, c *cluster.Cluster, args []string) error {
	if len(args) != 1 {
		return errors.New("leader: which queue?")
	}
	l, err := c.Leader(ctx, args[0])
	if err != nil {
		return err
	}
	fmt.Println(l)
	return nil
}

// execInHub runs the command args names in the hub namespace, where the
// nodes are reachable, with AMQP091_CLUSTER_URLS set and the terminal's
// standard streams; its exit status becomes clusterctl's (see main).
func execInHub(ctx context.Context, c *cluster.Cluster, args []string) error {
	if len(args) == 0 {
		return errors.New("exec: which command?")
	}
	x := c.Exec(ctx, args[0], args[1:]...)
	x.Env = append(os.Environ(), "AMQP091_CLUSTER_URLS="+strings.Join(c.URLs(), ","))
	x.Stdin = os.Stdin
	x.Stdout = os.Stdout
	x.Stderr = os.Stderr
	return x.Run()
}
