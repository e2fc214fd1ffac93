package consumer

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// setTopicConfig sets one configuration of a topic on the bundle's cluster.
func (b *bundle) setTopicConfig(t testing.TB, topic, name, value string) {
	t.Helper()
	resp, err := b.kafka.Client().IncrementalAlterConfigs(context.Background(), &kafka.IncrementalAlterConfigsRequest{
		Resources: []kafka.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: topic,
			Configs: []kafka.IncrementalAlterConfigsRequestConfig{{Name: name, Value: value, ConfigOperation: kafka.ConfigOperationSet}},
		}},
	})
	if err == nil && len(resp.Resources) > 0 && resp.Resources[0].Error != nil {
		err = resp.Resources[0].Error
	}
	if err != nil {
		t.Fatalf("set %s=%s on %s: %v", name, value, topic, err)
	}
}

// TestRetentionGuard: a consumer that prunes dedup rows after two hours
// refuses to start on a topic that keeps messages for seven days (a replay
// from the earliest offset would apply events again), starts with a
// warning when told to, and starts quietly once the topic keeps messages
// for less than the dedup rows.
func TestRetentionGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	prune := []Option{WithRetentionFloor(time.Hour), WithPruning(time.Hour, 2*time.Hour)}

	// Run returns at once with the refusal; the timeout only bounds a
	// regression that would start consuming instead.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := b.newConsumer(t, "guarded", b.handler("guarded", nil), prune...).Run(ctx)
	var re *RetentionError
	if !errors.As(err, &re) || !errors.Is(err, ErrRetention) {
		t.Fatalf("Run: %v, want a *RetentionError", err)
	}
	if re.Dedup != 2*time.Hour || len(re.Topics) != 1 || re.Topics[0].Topic != b.topic || re.Topics[0].Retention != 7*24*time.Hour {
		t.Fatalf("retention error %+v, want the topic's 7 days against 2h of dedup rows", re)
	}
	for _, want := range []string{b.topic + " keeps messages 7d", "pruned after 2h0m0s", "WithPruning", "retention.ms", "RetentionWarn"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error text lacks %q: %v", want, err)
		}
	}

	logs := &lockedBuffer{}
	warned := b.newConsumer(t, "warned", b.handler("warned", nil), append(prune, WithRetentionCheck(RetentionWarn),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))))...)
	r := start(t, warned)
	b.produce(t, message(t, b.event(t, "a", 0), nil))
	b.effectsAtLeast(t, 1, 20*time.Second)
	if err := r.stop(); err != nil {
		t.Fatalf("warned consumer: %v", err)
	}
	if !strings.Contains(logs.String(), "starting despite the retention check") || !strings.Contains(logs.String(), "keeps messages 7d") {
		t.Fatalf("no warning logged:\n%s", logs.String())
	}

	// A topic that keeps messages an hour is safe with two hours of dedup
	// rows: the guard passes and the consumer handles the backlog.
	b.setTopicConfig(t, b.topic, "retention.ms", "3600000")
	b.setTopicConfig(t, b.topic, "segment.ms", "600000")
	logs = &lockedBuffer{}
	r = start(t, b.newConsumer(t, "safe", b.handler("safe", nil), append(prune, WithLogger(slog.New(slog.NewTextHandler(logs, nil))))...))
	b.effectsAtLeast(t, 2, 20*time.Second)
	if err := r.stop(); err != nil {
		t.Fatalf("consumer on a topic with a shorter retention: %v", err)
	}
	if strings.Contains(logs.String(), "retention") {
		t.Fatalf("retention logged although the dedup rows outlive the topic's messages:\n%s", logs.String())
	}

	// Compaction keeps each key's last message for ever.
	b.setTopicConfig(t, b.topic, "cleanup.policy", "compact")
	if err := b.newConsumer(t, "compacted", b.handler("compacted", nil), prune...).Run(ctx); !errors.As(err, &re) || re.Topics[0].Retention != Forever ||
		!strings.Contains(err.Error(), "keeps messages forever") {
		t.Fatalf("Run on a compacted topic: %v, want a *RetentionError naming it forever", err)
	}
}

// TestRetentionGuardWithoutPruning: a consumer that does not prune keeps
// its dedup rows, and the guard reads nothing.
func TestRetentionGuardWithoutPruning(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "a", 0), nil))
	r := start(t, b.newConsumer(t, "keeps", b.handler("keeps", nil)))
	b.effectsAtLeast(t, 1, 20*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestParseRetention(t *testing.T) {
	entry := func(k, v string) kafka.DescribeConfigResponseConfigEntry {
		return kafka.DescribeConfigResponseConfigEntry{ConfigName: k, ConfigValue: v}
	}
	for _, tc := range []struct {
		name    string
		entries []kafka.DescribeConfigResponseConfigEntry
		want    TopicRetention
	}{
		{"defaults", nil, TopicRetention{Topic: "t", Retention: 7 * 24 * time.Hour, Segment: 7 * 24 * time.Hour, Policy: "delete"}},
		{"set", []kafka.DescribeConfigResponseConfigEntry{entry("retention.ms", "3600000"), entry("segment.ms", "60000")},
			TopicRetention{Topic: "t", Retention: time.Hour, Segment: time.Minute, Policy: "delete"}},
		{"infinite", []kafka.DescribeConfigResponseConfigEntry{entry("retention.ms", "-1")},
			TopicRetention{Topic: "t", Retention: Forever, Segment: 7 * 24 * time.Hour, Policy: "delete"}},
		{"compact", []kafka.DescribeConfigResponseConfigEntry{entry("retention.ms", "1000"), entry("cleanup.policy", "compact")},
			TopicRetention{Topic: "t", Retention: Forever, Segment: 7 * 24 * time.Hour, Policy: "compact"}},
		{"compact,delete", []kafka.DescribeConfigResponseConfigEntry{entry("retention.ms", "1000"), entry("cleanup.policy", "compact,delete")},
			TopicRetention{Topic: "t", Retention: time.Second, Segment: 7 * 24 * time.Hour, Policy: "compact,delete"}},
	} {
		got, err := parseRetention("t", tc.entries)
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	if _, err := parseRetention("t", []kafka.DescribeConfigResponseConfigEntry{entry("retention.ms", "week")}); err == nil || !strings.Contains(err.Error(), `retention.ms "week"`) {
		t.Errorf("a bad retention.ms: %v", err)
	}
	longer, segment := retentionRisks(8*24*time.Hour, []TopicRetention{
		{Topic: "a", Retention: 7 * 24 * time.Hour, Segment: 7 * 24 * time.Hour},
		{Topic: "b", Retention: 7 * 24 * time.Hour, Segment: time.Hour},
		{Topic: "c", Retention: Forever},
		{Topic: "d", Retention: 9 * 24 * time.Hour},
	})
	if len(longer) != 2 || longer[0].Topic != "c" || longer[1].Topic != "d" || len(segment) != 1 || segment[0].Topic != "a" {
		t.Errorf("risks: longer %+v, segment %+v", longer, segment)
	}
}
