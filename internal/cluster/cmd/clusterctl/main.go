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
  wait [N]                 until N (default 3) nodes run, with no partition recorded (bounded by -boot-timeout)
  ctl N ARGS...            rabbitmqctl -n rabbit@amqpd-N ARGS...
  exec CMD...              run CMD in the hub namespace, AMQP091_CLUSTER_URLS exported
N is a, b or c. flags:`)
	flag.PrintDefaults()
}

func run() error {
	var o cluster.Options
	flag.StringVar(&o.Dir, "dir", os.Getenv("AMQPD_CLUSTER_DIR"), "state directory (default $AMQPD_CLUSTER_DIR, else $TMPDIR/amqpd-cluster)")
	flag.StringVar(&o.PartitionHandling, "partition-handling", "ignore", "start: ignore, pause_minority or autoheal")
	flag.IntVar(&o.NetTicktime, "net-ticktime", 60, "start: Erlang net_ticktime in seconds")
	flag.DurationVar(&o.BootTimeout, "boot-timeout", 120*time.Second, "start, restart: bound on one node's boot")
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	cmd, args := args[0], args[1:]
	node := func() (cluster.Node, error) {
		if len(args) == 0 {
			return "", fmt.Errorf("%s: which node (a, b or c)?", cmd)
		}
		n := cluster.Node(args[0])
		for _, m := range cluster.Nodes {
			if n == m {
				args = args[1:]
				return n, nil
			}
		}
		return "", fmt.Errorf("%s: unknown node %q (a, b or c)", cmd, args[0])
	}
	switch cmd {
	case "usable":
		if ok, why := cluster.Usable(); !ok {
			fmt.Println(why)
			os.Exit(3)
		}
		return nil
	case "start":
		c, err := cluster.Start(ctx, o)
		if err != nil {
			return err
		}
		fmt.Println("AMQP091_CLUSTER_URLS=" + strings.Join(c.URLs(), ","))
		return nil
	case "urls":
		var c cluster.Cluster
		fmt.Println(strings.Join(c.URLs(), ","))
		return nil
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
	switch cmd {
	case "stop":
		return c.Stop()
	case "status":
		fmt.Print(c.Status(ctx))
		return nil
	case "heal":
		return c.Heal()
	case "kill", "restart", "stop-app", "start-app", "partition", "ctl":
		n, err := node()
		if err != nil {
			return err
		}
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
	case "wait":
		want := len(cluster.Nodes)
		if len(args) > 0 {
			if want, err = strconv.Atoi(args[0]); err != nil {
				return fmt.Errorf("wait: %q is not a number of nodes", args[0])
			}
		}
		wctx, cancel := context.WithTimeout(ctx, o.BootTimeout)
		defer cancel()
		return c.WaitRunning(wctx, want)
	case "leader":
		if len(args) != 1 {
			return errors.New("leader: which queue?")
		}
		l, err := c.Leader(ctx, args[0])
		if err != nil {
			return err
		}
		fmt.Println(l)
		return nil
	case "exec":
		if len(args) == 0 {
			return errors.New("exec: which command?")
		}
		x := c.Exec(ctx, args[0], args[1:]...)
		x.Env = append(os.Environ(), "AMQP091_CLUSTER_URLS="+strings.Join(c.URLs(), ","))
		x.Stdin, x.Stdout, x.Stderr = os.Stdin, os.Stdout, os.Stderr
		return x.Run()
	}
	usage()
	os.Exit(2)
	return nil
}
