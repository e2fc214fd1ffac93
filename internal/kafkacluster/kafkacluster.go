// Package kafkacluster forwards to the public eventstest/kafkacluster, where
// the in-process Kafka cluster now lives; it remains so that code written
// against the internal path keeps compiling. New code imports
// github.com/protoevents/protoevents/eventstest/kafkacluster.
package kafkacluster

import (
	"context"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
)

// EnvBrokers is kafkacluster.EnvBrokers.
const EnvBrokers = kafkacluster.EnvBrokers

// Cluster is kafkacluster.Cluster.
type Cluster = kafkacluster.Cluster

// Start is kafkacluster.Start.
func Start(opts ...kfake.Opt) (*Cluster, error) { return kafkacluster.Start(opts...) }

// StartFake is kafkacluster.StartFake.
func StartFake(opts ...kfake.Opt) (*Cluster, error) { return kafkacluster.StartFake(opts...) }

// CreateTopics is kafkacluster.CreateTopics.
func CreateTopics(ctx context.Context, brokers []string, partitions int, names ...string) error {
	return kafkacluster.CreateTopics(ctx, brokers, partitions, names...)
}
