// Package apachekafka runs real Apache Kafka brokers for tests, the demo and
// the bench: the broker's jars fetched once through Maven into a cache
// outside the repository, storage formatted, and the broker started in KRaft
// mode (no ZooKeeper) on free loopback ports, as a JVM process owned by the
// caller. A cluster is a single node (broker and controller in one process)
// or three such nodes with replication factor 3, min.insync.replicas=2 and
// unclean leader election off; each node can be killed with SIGKILL, stopped
// and started again on its ports and data, for fault tests.
//
// It needs java (17 or later) and mvn on PATH; without them Start returns an
// error that names them, never a silent skip.
package apachekafka

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultVersion is the broker version Start runs when neither Config nor
// $PROTOEVENTS_KAFKA_VERSION names one: the newest line the project is
// tested on (see the README's compatibility table).
const DefaultVersion = "4.4.0"

// EnvVersion names the variable that picks the broker version.
const EnvVersion = "PROTOEVENTS_KAFKA_VERSION"

// EnvLogLevel names the variable that sets the brokers' log level (trace,
// debug, info, warn: the default, error), for a failure worth a closer look.
const EnvLogLevel = "PROTOEVENTS_KAFKA_LOG"

// Config says what cluster Start runs. The zero value is one node of
// DefaultVersion in a temporary directory.
type Config struct {
	// Version is the Apache Kafka version (org.apache.kafka:kafka_2.13).
	Version string
	// Nodes is 1 (one combined broker and controller) or 3 (three combined
	// nodes: a quorum that survives the loss of one).
	Nodes int
	// Ports fixes the client port of each node (0 or absent: a free one).
	Ports []int
	// Dir keeps the cluster's data and logs there across Stop and a later
	// Start with the same Dir (a dev environment); empty uses a temporary
	// directory that Stop removes.
	Dir string
	// Settings adds or overrides broker settings (server.properties).
	Settings map[string]string
	// Heap is the JVM's maximum heap per node (default 512m).
	Heap string
}

// Cluster is a running Apache Kafka cluster. Stop it when done.
type Cluster struct {
	// Version is the broker version running.
	Version string

	nodes     []*Node
	dir       string
	temporary bool
}

// Start fetches the broker (if not cached), formats storage and starts the
// cluster, returning once every node answers and the cluster's metadata
// lists them all.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Version == "" {
		cfg.Version = os.Getenv(EnvVersion)
	}
	if cfg.Version == "" {
		cfg.Version = DefaultVersion
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 1
	}
	if cfg.Nodes != 1 && cfg.Nodes != 3 {
		return nil, fmt.Errorf("apachekafka: %d nodes: a cluster has 1 or 3", cfg.Nodes)
	}
	if len(cfg.Ports) > cfg.Nodes {
		return nil, fmt.Errorf("apachekafka: %d ports for %d nodes", len(cfg.Ports), cfg.Nodes)
	}
	if cfg.Heap == "" {
		cfg.Heap = "512m"
	}
	if err := Prerequisites(); err != nil {
		return nil, err
	}
	classpath, err := Fetch(ctx, cfg.Version)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Version: cfg.Version, dir: cfg.Dir}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "protoevents-kafka-"); err != nil {
			return nil, fmt.Errorf("apachekafka: %w", err)
		}
		c.temporary = true
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("apachekafka: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	if err := c.layOut(cfg, classpath); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if err := n.format(ctx); err != nil {
			return nil, err
		}
	}
	for _, n := range c.nodes {
		if err := n.launch(); err != nil {
			return nil, err
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// layOut gives each node its ports, directory and server.properties. A
// directory kept from an earlier Start keeps its cluster ID and ports.
func (c *Cluster) layOut(cfg Config, classpath string) error {
	id, err := c.clusterID()
	if err != nil {
		return err
	}
	type ports struct{ client, controller int }
	all := make([]ports, cfg.Nodes)
	for i := range all {
		p, err := c.keptPorts(i + 1)
		if err != nil {
			return err
		}
		if p[0] == 0 {
			if i < len(cfg.Ports) && cfg.Ports[i] != 0 {
				p[0] = cfg.Ports[i]
			} else if p[0], err = freePort(); err != nil {
				return err
			}
			if p[1], err = freePort(); err != nil {
				return err
			}
		}
		all[i] = ports{p[0], p[1]}
	}
	var voters []string
	for i, p := range all {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, p.controller))
	}
	for i, p := range all {
		n := &Node{id: i + 1, port: p.client, controllerPort: p.controller, dir: filepath.Join(c.dir, "node-"+strconv.Itoa(i+1)),
			clusterID: id, classpath: classpath, heap: cfg.Heap}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return fmt.Errorf("apachekafka: %w", err)
		}
		props := settings(cfg.Nodes)
		props["node.id"] = strconv.Itoa(n.id)
		props["controller.quorum.voters"] = strings.Join(voters, ",")
		props["listeners"] = fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", p.client, p.controller)
		props["advertised.listeners"] = fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", p.client)
		props["log.dirs"] = filepath.Join(n.dir, "data")
		for k, v := range cfg.Settings {
			props[k] = v
		}
		if err := writeProperties(filepath.Join(n.dir, "server.properties"), props); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
	}
	return nil
}

// settings are the broker settings of a cluster of n nodes: loopback
// plaintext, KRaft with combined nodes, and the durability a production
// cluster of that size has (three nodes: replication factor 3, two in sync
// to acknowledge acks=all, no unclean election). Two settings are for tests:
// auto-created topics get 3 partitions, the group coordinator accepts
// session timeouts down to 100ms and starts a new group's first rebalance at
// once (the broker's own defaults, 6s and 3s, would only slow tests down),
// and the controller fences a broker that stopped heartbeating after 4s
// instead of 9s, so a killed node's partitions move sooner.
func settings(n int) map[string]string {
	rf := strconv.Itoa(n)
	isr := "1"
	if n == 3 {
		isr = "2"
	}
	return map[string]string{
		"process.roles":                            "broker,controller",
		"controller.listener.names":                "CONTROLLER",
		"listener.security.protocol.map":           "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"inter.broker.listener.name":               "PLAINTEXT",
		"num.partitions":                           "3",
		"default.replication.factor":               rf,
		"min.insync.replicas":                      isr,
		"offsets.topic.replication.factor":         rf,
		"offsets.topic.num.partitions":             "10",
		"transaction.state.log.replication.factor": rf,
		"transaction.state.log.min.isr":            isr,
		"unclean.leader.election.enable":           "false",
		"group.initial.rebalance.delay.ms":         "0",
		"group.min.session.timeout.ms":             "100",
		"auto.create.topics.enable":                "true",
		"broker.session.timeout.ms":                "4000",
		"broker.heartbeat.interval.ms":             "500",
		"log.flush.interval.messages":              "9223372036854775807",
		"num.network.threads":                      "2",
		"num.io.threads":                           "4",
	}
}

// clusterID returns the ID kept in the cluster's directory, or a new one.
func (c *Cluster) clusterID() (string, error) {
	path := filepath.Join(c.dir, "cluster.id")
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	id := base64.RawURLEncoding.EncodeToString(u[:])
	if err := os.WriteFile(path, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	return id, nil
}

// keptPorts returns the client and controller ports node id had in an
// earlier Start in the same directory, or zeros.
func (c *Cluster) keptPorts(id int) ([2]int, error) {
	var p [2]int
	b, err := os.ReadFile(filepath.Join(c.dir, "node-"+strconv.Itoa(id), "server.properties"))
	if errors.Is(err, os.ErrNotExist) {
		return p, nil
	} else if err != nil {
		return p, fmt.Errorf("apachekafka: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(line, "listeners="); found {
			_, err := fmt.Sscanf(v, "PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", &p[0], &p[1])
			if err != nil {
				return [2]int{}, fmt.Errorf("apachekafka: kept listeners %q: %w", v, err)
			}
		}
	}
	return p, nil
}

func writeProperties(path string, props map[string]string) error {
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# written by protoevents/eventstest/apachekafka\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("apachekafka: %w", err)
	}
	return nil
}

// Brokers returns the bootstrap addresses of every node (host:port).
func (c *Cluster) Brokers() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Nodes returns the cluster's nodes, by node ID from 1.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node with the given broker ID (1-based).
func (c *Cluster) Node(id int) *Node {
	if id < 1 || id > len(c.nodes) {
		return nil
	}
	return c.nodes[id-1]
}

// Dir is the directory holding the nodes' data, settings and logs.
func (c *Cluster) Dir() string { return c.dir }

// WaitReady waits until every running node answers and reports the whole
// cluster in its metadata.
func (c *Cluster) WaitReady(ctx context.Context) error {
	var running []*Node
	for _, n := range c.nodes {
		if n.Running() {
			running = append(running, n)
		}
	}
	for _, n := range running {
		if err := n.waitReady(ctx, len(running)); err != nil {
			return err
		}
	}
	return nil
}

// StartAll starts every node that is not running (after a Kill or Stop of
// them all, say) and waits until the cluster is whole again.
func (c *Cluster) StartAll(ctx context.Context) error {
	for _, n := range c.nodes {
		if !n.Running() {
			if err := n.launch(); err != nil {
				return err
			}
		}
	}
	return c.WaitReady(ctx)
}

// Stop ends the cluster. A temporary cluster is killed at once and its
// directory removed: its data is thrown away, so a controlled shutdown
// would only cost time (the last node of a quorum waits for peers that are
// gone). A cluster in a kept Dir is shut down cleanly, every node at once.
func (c *Cluster) Stop() error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.temporary {
				errs[i] = n.Kill()
			} else {
				errs[i] = n.Stop(context.Background())
			}
		}()
	}
	wg.Wait()
	if c.temporary {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Logs returns the last lines of every node's log, for a failing test.
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "--- node %d (%s) ---\n%s\n", n.id, n.Addr(), n.Log(lines))
	}
	return b.String()
}

// freePort asks the kernel for a free TCP port on the loopback interface.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("apachekafka: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pollEvery is how often readiness is asked.
const pollEvery = 100 * time.Millisecond
