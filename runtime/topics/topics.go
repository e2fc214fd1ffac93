// Package topics provisions the Kafka topics events need: each event's
// topic and its dead-letter topic, from the generated descriptors (or the
// per-file registries, e.g. ordersv1.OrdersEvents).
//
//	created, err := topics.Ensure(ctx, brokers, topics.Config{Partitions: 12, ReplicationFactor: 3},
//		ordersv1.OrdersEvents...)
//
// Existing topics are left exactly as they are: changing a topic's
// partition count would move keys between partitions and break per-key
// order, so that stays a deliberate operator action. Check reports how the
// cluster differs from the plan (Plan, PlanNames): missing topics,
// partition counts, replication factors and configs.
package topics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
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

// Spec is one topic to provision: its name, whether it is a dead-letter
// topic, and the settings it is created (and checked) with.
type Spec struct {
	Name              string
	DLQ               bool
	Partitions        int
	ReplicationFactor int
	Configs           map[string]string
}

// maxNameLen is Kafka's limit on topic names.
const maxNameLen = 249

// ValidateName reports whether name is a legal Kafka topic name: 1 to 249
// characters of [a-zA-Z0-9._-], not "." or "..".
func ValidateName(name string) error {
	switch {
	case name == "":
		return errors.New("topics: empty topic name")
	case name == "." || name == "..":
		return fmt.Errorf("topics: topic name %q is not allowed", name)
	case len(name) > maxNameLen:
		return fmt.Errorf("topics: topic name %q is %d characters long; Kafka allows %d", name, len(name), maxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topics: topic name %q has %q: Kafka allows only letters, digits, '.', '_' and '-'", name, r)
		}
	}
	return nil
}

// validate checks the settings: counts not below 1 once defaulted, config
// names well formed.
func (c Config) validate() error {
	if c.Partitions < 0 {
		return fmt.Errorf("topics: %d partitions: want at least 1", c.Partitions)
	}
	if c.ReplicationFactor < 0 {
		return fmt.Errorf("topics: replication factor %d: want at least 1", c.ReplicationFactor)
	}
	for _, m := range []map[string]string{c.Configs, c.DLQConfigs} {
		for k := range m {
			if err := validateConfigName(k); err != nil {
				return err
			}
		}
	}
	return nil
}

func validateConfigName(k string) error {
	if k == "" {
		return errors.New("topics: empty config name")
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topics: config name %q is not a Kafka topic config (like retention.ms)", k)
		}
	}
	return nil
}

// spec returns the Spec of one topic under cfg.
func (c Config) spec(name string, dlq bool) Spec {
	s := Spec{Name: name, DLQ: dlq, Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor, Configs: c.Configs}
	if dlq && c.DLQConfigs != nil {
		s.Configs = c.DLQConfigs
	}
	if s.Partitions == 0 {
		s.Partitions = 6
	}
	if s.ReplicationFactor == 0 {
		s.ReplicationFactor = 1
	}
	return s
}

// Plan returns the Specs of the topics the descriptors need (every event
// topic and its effective DLQ topic, sorted by name), after validating the
// names and cfg. A topic that is one event's topic and another's DLQ is
// planned as an event topic.
func Plan(cfg Config, ds ...*events.Descriptor) ([]Spec, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	isTopic := map[string]bool{}
	for _, d := range ds {
		if d != nil && d.Topic != "" {
			isTopic[d.Topic] = true
		}
	}
	var specs []Spec
	var errs []error
	for _, name := range Names(ds...) {
		if err := ValidateName(name); err != nil {
			errs = append(errs, err)
			continue
		}
		specs = append(specs, cfg.spec(name, !isTopic[name]))
	}
	return specs, errors.Join(errs...)
}

// PlanNames returns the Specs of the named event topics and, with dlq, of
// each one's "<topic>.dlq", after validating the names and cfg.
func PlanNames(cfg Config, dlq bool, names ...string) ([]Spec, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var specs []Spec
	var errs []error
	for _, name := range names {
		if err := ValidateName(name); err != nil {
			errs = append(errs, err)
			continue
		}
		specs = append(specs, cfg.spec(name, false))
		if dlq {
			if err := ValidateName(name + ".dlq"); err != nil {
				errs = append(errs, err)
				continue
			}
			specs = append(specs, cfg.spec(name+".dlq", true))
		}
	}
	return specs, errors.Join(errs...)
}

// Ensure creates the topic and the DLQ topic of every descriptor that does
// not exist yet and returns the names it created. Topics that exist are
// not touched.
func Ensure(ctx context.Context, brokers []string, cfg Config, ds ...*events.Descriptor) ([]string, error) {
	specs, err := Plan(cfg, ds...)
	if err != nil {
		return nil, err
	}
	return CreateSpecs(ctx, brokers, cfg.Dialer, specs)
}

// Create creates the named topics that do not exist yet, all alike, and
// returns the names it created.
func Create(ctx context.Context, brokers []string, cfg Config, names ...string) ([]string, error) {
	specs, err := PlanNames(cfg, false, names...)
	if err != nil {
		return nil, err
	}
	return CreateSpecs(ctx, brokers, cfg.Dialer, specs)
}

// CreateSpecs creates the topics of specs that do not exist yet and
// returns the names it created; dialer may be nil.
func CreateSpecs(ctx context.Context, brokers []string, dialer *kafka.Dialer, specs []Spec) ([]string, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	cl, err := client(brokers, dialer)
	if err != nil {
		return nil, err
	}
	var tcs []kafka.TopicConfig
	for _, s := range specs {
		if err := ValidateName(s.Name); err != nil {
			return nil, err
		}
		if s.Partitions < 1 || s.ReplicationFactor < 1 {
			return nil, fmt.Errorf("topics: %s: %d partitions, replication factor %d: want at least 1 of each", s.Name, s.Partitions, s.ReplicationFactor)
		}
		tc := kafka.TopicConfig{Topic: s.Name, NumPartitions: s.Partitions, ReplicationFactor: s.ReplicationFactor}
		for _, k := range sortedKeys(s.Configs) {
			tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: s.Configs[k]})
		}
		tcs = append(tcs, tc)
	}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: tcs})
	if err != nil {
		return nil, brokerError(brokers, "create topics", err)
	}
	var created []string
	var errs []error
	for _, s := range specs {
		switch terr := resp.Errors[s.Name]; {
		case terr == nil:
			created = append(created, s.Name)
		case errors.Is(terr, kafka.TopicAlreadyExists):
		case errors.Is(terr, kafka.InvalidReplicationFactor):
			errs = append(errs, fmt.Errorf("topics: create %s: %w: the cluster has fewer brokers than replication factor %d (lower --replication-factor)", s.Name, terr, s.ReplicationFactor))
		case errors.Is(terr, kafka.InvalidConfiguration):
			errs = append(errs, fmt.Errorf("topics: create %s: %w: check the --config names and values %v", s.Name, terr, s.Configs))
		default:
			errs = append(errs, fmt.Errorf("topics: create %s: %w", s.Name, terr))
		}
	}
	return created, errors.Join(errs...)
}

// Drift is one difference between a planned topic and the cluster.
type Drift struct {
	Topic string
	// Field is "missing", "partitions", "replication_factor" or the name
	// of a topic config (e.g. "retention.ms").
	Field string
	// Want is the planned value, Got the cluster's ("" when missing).
	Want, Got string
}

// String renders the drift for people.
func (d Drift) String() string {
	if d.Field == "missing" {
		return fmt.Sprintf("%s: missing", d.Topic)
	}
	return fmt.Sprintf("%s: %s is %s, want %s", d.Topic, d.Field, d.Got, d.Want)
}

// Check compares the planned topics with the cluster: missing topics,
// partition counts, replication factors and the planned configs. An empty
// result means the cluster matches the plan. Topics are never changed.
func Check(ctx context.Context, brokers []string, dialer *kafka.Dialer, specs []Spec) ([]Drift, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	cl, err := client(brokers, dialer)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
	if err != nil {
		return nil, brokerError(brokers, "read topic metadata", err)
	}
	found := map[string]kafka.Topic{}
	for _, t := range md.Topics {
		if t.Error == nil {
			found[t.Name] = t
		}
	}
	var drift []Drift
	var describe []kafka.DescribeConfigRequestResource
	for _, s := range specs {
		t, ok := found[s.Name]
		if !ok {
			drift = append(drift, Drift{Topic: s.Name, Field: "missing", Want: "exists"})
			continue
		}
		if len(t.Partitions) != s.Partitions {
			drift = append(drift, Drift{Topic: s.Name, Field: "partitions", Want: strconv.Itoa(s.Partitions), Got: strconv.Itoa(len(t.Partitions))})
		}
		if len(t.Partitions) > 0 && len(t.Partitions[0].Replicas) != s.ReplicationFactor {
			drift = append(drift, Drift{Topic: s.Name, Field: "replication_factor", Want: strconv.Itoa(s.ReplicationFactor), Got: strconv.Itoa(len(t.Partitions[0].Replicas))})
		}
		if len(s.Configs) > 0 {
			describe = append(describe, kafka.DescribeConfigRequestResource{ResourceType: kafka.ResourceTypeTopic, ResourceName: s.Name, ConfigNames: sortedKeys(s.Configs)})
		}
	}
	if len(describe) > 0 {
		resp, err := cl.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: describe})
		if err != nil {
			return nil, brokerError(brokers, "read topic configs", err)
		}
		got := map[string]map[string]string{}
		for _, r := range resp.Resources {
			if r.Error != nil {
				return nil, fmt.Errorf("topics: read the configs of %s: %w", r.ResourceName, r.Error)
			}
			got[r.ResourceName] = map[string]string{}
			for _, e := range r.ConfigEntries {
				got[r.ResourceName][e.ConfigName] = e.ConfigValue
			}
		}
		for _, s := range specs {
			if _, ok := found[s.Name]; !ok {
				continue
			}
			for _, k := range sortedKeys(s.Configs) {
				if v := got[s.Name][k]; v != s.Configs[k] {
					drift = append(drift, Drift{Topic: s.Name, Field: k, Want: s.Configs[k], Got: v})
				}
			}
		}
	}
	sort.SliceStable(drift, func(i, j int) bool { return drift[i].Topic < drift[j].Topic })
	return drift, nil
}

func client(brokers []string, dialer *kafka.Dialer) (*kafka.Client, error) {
	if len(brokers) == 0 {
		return nil, errors.New("topics: no Kafka brokers given")
	}
	for _, b := range brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			return nil, fmt.Errorf("topics: broker %q is not host:port", b)
		}
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	if dialer != nil {
		cl.Transport = &kafka.Transport{Dial: dialer.DialFunc, TLS: dialer.TLS, SASL: dialer.SASLMechanism, ClientID: dialer.ClientID}
	}
	return cl, nil
}

// brokerError names the brokers a request could not reach.
func brokerError(brokers []string, what string, err error) error {
	if errors.Is(err, kafka.BrokerNotAvailable) {
		return fmt.Errorf("topics: %s: cannot connect to Kafka at %s: %w (are the brokers up, and is the address right?)", what, strings.Join(brokers, ","), kafka.BrokerNotAvailable)
	}
	return fmt.Errorf("topics: %s: Kafka at %s: %w (check the brokers are up and reachable)", what, strings.Join(brokers, ","), err)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
