// Command apachekafka runs a real Apache Kafka cluster on loopback for the
// project's real-broker tier, demo and bench: fetched through Maven on first
// use, KRaft mode, one node or three.
//
//	go run ./internal/cmd/apachekafka                       # until Ctrl-C; prints the env to export
//	go run ./internal/cmd/apachekafka -nodes 3 -port 19092  # ports 19092-19094
//	go run ./internal/cmd/apachekafka -- go test ./...      # runs the command against it, then stops
//
// With a command after "--", the command runs with PROTOEVENTS_KAFKA_BROKERS
// set to the cluster and its exit status is this command's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/protoevents/protoevents/eventstest/apachekafka"
	"github.com/protoevents/protoevents/eventstest/kafkacluster"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "apachekafka:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("apachekafka", flag.ContinueOnError)
	version := fs.String("version", envOr(apachekafka.EnvVersion, apachekafka.DefaultVersion), "Apache Kafka version (env "+apachekafka.EnvVersion+")")
	nodes := fs.Int("nodes", 1, "nodes: 1, or 3 (replication factor 3, min.insync.replicas 2)")
	port := fs.Int("port", 0, "client port of the first node (the others follow); 0 picks free ports")
	dir := fs.String("dir", "", "keep the cluster's data here across runs; empty: a temporary directory")
	fetchOnly := fs.Bool("fetch", false, "only fetch the broker into the cache and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *fetchOnly {
		_, err := apachekafka.Fetch(ctx, *version)
		return err
	}
	cfg := apachekafka.Config{Version: *version, Nodes: *nodes, Dir: *dir}
	if *port != 0 {
		for i := range *nodes {
			cfg.Ports = append(cfg.Ports, *port+i)
		}
	}
	began := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	c, err := apachekafka.Start(startCtx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer c.Stop()
	brokers := strings.Join(c.Brokers(), ",")
	fmt.Fprintf(os.Stderr, "apachekafka: Apache Kafka %s, %d node(s) on %s, ready in %v (logs: %s)\n",
		c.Version, *nodes, brokers, time.Since(began).Round(time.Millisecond), c.Dir())
	if rest := fs.Args(); len(rest) > 0 {
		cmd := exec.CommandContext(ctx, rest[0], rest[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), kafkacluster.EnvBrokers+"="+brokers)
		return cmd.Run()
	}
	fmt.Printf("export %s='%s'\n", kafkacluster.EnvBrokers, brokers)
	fmt.Fprintln(os.Stderr, "apachekafka: Ctrl-C stops it")
	<-ctx.Done()
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
