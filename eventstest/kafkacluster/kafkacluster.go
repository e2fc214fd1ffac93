// Package kafkacluster gives tests (yours and ours) and the demo a Kafka cluster reached over
// the real wire protocol: the brokers named in $PROTOEVENTS_KAFKA_BROKERS, or
// an in-process kfake cluster listening on loopback TCP.
package kafkacluster

import (
	"context"
	"fmt"
	"os"
	"strings"
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
}

// Start returns the cluster named by $PROTOEVENTS_KAFKA_BROKERS, or starts
// an in-process one with the given kfake options added to sane defaults
// (one broker, topics auto-created with 3 partitions).
func Start(opts ...kfake.Opt) (*Cluster, error) {
	if env := strings.TrimSpace(os.Getenv(EnvBrokers)); env != "" {
		return &Cluster{Brokers: strings.Split(env, ",")}, nil
	}
	return StartFake(opts...)
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

// Close stops an in-process cluster; a real one is left alone.
func (c *Cluster) Close() {
	if c.Fake != nil {
		c.Fake.Close()
	}
}

// Client returns a kafka-go admin client for the cluster.
func (c *Cluster) Client() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(c.Brokers...), Timeout: 10 * time.Second}
}

// CreateTopics creates topics with the given number of partitions; topics
// that already exist are left as they are.
func (c *Cluster) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	return CreateTopics(ctx, c.Brokers, partitions, topics...)
}

// CreateTopics creates topics on the cluster reached through brokers;
// topics that already exist are left as they are.
func CreateTopics(ctx context.Context, brokers []string, partitions int, names ...string) error {
	if _, err := topics.Create(ctx, brokers, topics.Config{Partitions: partitions}, names...); err != nil {
		return fmt.Errorf("kafkacluster: %w", err)
	}
	return nil
}
