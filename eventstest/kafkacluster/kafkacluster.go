// Package kafkacluster gives tests (yours and ours) and the demo a Kafka cluster reached over
// the real wire protocol: the brokers named in $PROTOEVENTS_KAFKA_BROKERS, or
// an in-process kfake cluster listening on loopback TCP. (Real Apache Kafka
// brokers that a test starts itself are package apachekafka.)
package kafkacluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/runtime/topics"
)

// EnvBrokers names the environment variable holding a comma-separated
// broker list of a real cluster to use instead of an in-process one.
const EnvBrokers = "PROTOEVENTS_KAFKA_BROKERS"

// Cluster is a reachable Kafka cluster.
type Cluster struct {
	// Brokers are the bootstrap addresses (host:port).
	Brokers []string
	// Fake is the in-process cluster, or nil when Brokers name a real one.
	// Tests use it for fault injection.
	Fake *kfake.Cluster

	namespace string

	mu        sync.Mutex
	transport *kafka.Transport // Client's, made on first use and closed by Close
}

// Shared returns a handle on the cluster at brokers for one test among
// others: its Group names carry a suffix of their own, so tests that run
// at once (or again, on a cluster that keeps committed offsets) never join
// each other's consumer groups.
func Shared(brokers []string, namespace string) *Cluster {
	return &Cluster{Brokers: brokers, namespace: namespace}
}

// Namespace is the suffix of the test's group IDs ("" on a cluster of the
// test's own), for a child process to build the same handle with Shared.
func (c *Cluster) Namespace() string { return c.namespace }

// Group returns the consumer group ID a test uses for name: name itself on
// a cluster of the test's own, name with the test's suffix on a shared one.
func (c *Cluster) Group(name string) string {
	if c.namespace == "" {
		return name
	}
	return name + "." + c.namespace
}

// Start returns the cluster named by $PROTOEVENTS_KAFKA_BROKERS, or starts
// an in-process one with the given kfake options added to sane defaults
// (one broker, topics auto-created with 3 partitions).
func Start(opts ...kfake.Opt) (*Cluster, error) {
	if brokers := EnvBrokerList(); brokers != nil {
		return &Cluster{Brokers: brokers}, nil
	}
	return StartFake(opts...)
}

// EnvBrokerList returns the brokers named in $PROTOEVENTS_KAFKA_BROKERS, or
// nil.
func EnvBrokerList() []string {
	env := strings.TrimSpace(os.Getenv(EnvBrokers))
	if env == "" {
		return nil
	}
	return strings.Split(env, ",")
}

// StartFake starts an in-process kfake cluster regardless of the
// environment.
func StartFake(opts ...kfake.Opt) (*Cluster, error) {
	all := append([]kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3)}, opts...)
	f, err := kfake.NewCluster(all...)
	if err != nil {
		return nil, fmt.Errorf("kafkacluster: start in-process cluster: %w", err)
	}
	return &Cluster{Brokers: f.ListenAddrs(), Fake: f}, nil
}

// Close stops an in-process cluster (a real one is left alone) and closes
// the connections of Client.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.transport != nil {
		c.transport.CloseIdleConnections()
		c.transport = nil
	}
	c.mu.Unlock()
	if c.Fake != nil {
		c.Fake.Close()
	}
}

// Client returns a kafka-go admin client for the cluster, on a transport
// of this handle's own (kafka-go's default transport pools connections
// across every caller in the process) that Close closes.
func (c *Cluster) Client() *kafka.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.transport == nil {
		c.transport = &kafka.Transport{}
	}
	return &kafka.Client{Addr: kafka.TCP(c.Brokers...), Transport: c.transport, Timeout: 10 * time.Second}
}

// CreateTopics creates topics with the given number of partitions; topics
// that already exist are left as they are.
func (c *Cluster) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	return CreateTopics(ctx, c.Brokers, partitions, topics...)
}

// CreateTopics creates topics on the cluster reached through brokers;
// topics that already exist are left as they are. A connection dropped
// under the request (a real broker shared by parallel tests answers so now
// and then) is retried: creating is idempotent.
func CreateTopics(ctx context.Context, brokers []string, partitions int, names ...string) error {
	for {
		_, err := topics.Create(ctx, brokers, topics.Config{Partitions: partitions}, names...)
		if err == nil {
			return nil
		}
		if !(errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) || ctx.Err() != nil {
			return fmt.Errorf("kafkacluster: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkacluster: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
