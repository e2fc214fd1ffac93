// Package topics provisions the Kafka topics events need: each event's
// topic and its dead-letter topic, from the generated descriptors (or the
// per-file registries, e.g. ordersv1.OrdersEvents).
//
//	created, err := topics.Ensure(ctx, brokers, topics.Config{Partitions: 12, ReplicationFactor: 3},
//		ordersv1.OrdersEvents...)
//
// Existing topics are left exactly as they are: changing a topic's
// partition count would move keys between partitions and break per-key
// order, so that stays a deliberate operator action.
package topics

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/events"
)

// Config says how new topics are created.
type Config struct {
	// Partitions of each new topic; default 6. The partition count bounds a
	// consumer group's parallelism and is hard to change later.
	Partitions int
	// ReplicationFactor of each new topic; default 1 (development). Use 3
	// in production.
	ReplicationFactor int
	// Configs are topic configurations (e.g. "retention.ms") applied to new
	// event topics; DLQConfigs to new DLQ topics.
	Configs, DLQConfigs map[string]string
	// Dialer reaches the brokers (TLS, SASL); default kafka.DefaultDialer.
	Dialer *kafka.Dialer
}

// dlqOf is the descriptor's DLQ topic, with the consumer's default.
func dlqOf(d *events.Descriptor) string {
	if d.DLQTopic != "" || d.Topic == "" {
		return d.DLQTopic
	}
	return d.Topic + ".dlq"
}

// Names returns the topics the descriptors need, sorted and without
// duplicates: every event topic and every DLQ topic (default
// "<topic>.dlq", as the consumer uses).
func Names(ds ...*events.Descriptor) []string {
	seen := map[string]bool{}
	for _, d := range ds {
		if d == nil {
			continue
		}
		for _, t := range []string{d.Topic, dlqOf(d)} {
			if t != "" {
				seen[t] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Ensure creates the topic and the DLQ topic of every descriptor that does
// not exist yet and returns the names it created. Topics that exist are
// not touched.
func Ensure(ctx context.Context, brokers []string, cfg Config, ds ...*events.Descriptor) ([]string, error) {
	dlq := map[string]bool{}
	for _, d := range ds {
		if d != nil && dlqOf(d) != "" {
			dlq[dlqOf(d)] = true
		}
	}
	var specs []kafka.TopicConfig
	for _, name := range Names(ds...) {
		configs := cfg.Configs
		if dlq[name] {
			configs = cfg.DLQConfigs
		}
		specs = append(specs, topicConfig(cfg, name, configs))
	}
	return create(ctx, brokers, cfg, specs)
}

// Create creates the named topics that do not exist yet, all alike, and
// returns the names it created.
func Create(ctx context.Context, brokers []string, cfg Config, names ...string) ([]string, error) {
	var specs []kafka.TopicConfig
	for _, name := range names {
		specs = append(specs, topicConfig(cfg, name, cfg.Configs))
	}
	return create(ctx, brokers, cfg, specs)
}

func topicConfig(cfg Config, name string, configs map[string]string) kafka.TopicConfig {
	tc := kafka.TopicConfig{Topic: name, NumPartitions: cfg.Partitions, ReplicationFactor: cfg.ReplicationFactor}
	if tc.NumPartitions <= 0 {
		tc.NumPartitions = 6
	}
	if tc.ReplicationFactor <= 0 {
		tc.ReplicationFactor = 1
	}
	keys := make([]string, 0, len(configs))
	for k := range configs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: configs[k]})
	}
	return tc
}

func create(ctx context.Context, brokers []string, cfg Config, specs []kafka.TopicConfig) ([]string, error) {
	if len(brokers) == 0 {
		return nil, errors.New("topics: no Kafka brokers")
	}
	if len(specs) == 0 {
		return nil, nil
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	if cfg.Dialer != nil {
		cl.Transport = &kafka.Transport{Dial: cfg.Dialer.DialFunc, TLS: cfg.Dialer.TLS, SASL: cfg.Dialer.SASLMechanism, ClientID: cfg.Dialer.ClientID}
	}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: specs})
	if err != nil {
		return nil, fmt.Errorf("topics: create: %w", err)
	}
	var created []string
	var errs []error
	for _, s := range specs {
		switch terr := resp.Errors[s.Topic]; {
		case terr == nil:
			created = append(created, s.Topic)
		case errors.Is(terr, kafka.TopicAlreadyExists):
		default:
			errs = append(errs, fmt.Errorf("topics: create %s: %w", s.Topic, terr))
		}
	}
	return created, errors.Join(errs...)
}
