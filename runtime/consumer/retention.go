package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// The retention guard: a dedup row must outlive every copy of its event on
// the broker, or a replay from the earliest offset (ResetGroup, a new
// group, a lost offset) applies the event again. A consumer that prunes
// its dedup rows (WithPruning) compares how long it keeps them with each
// consumed topic's retention.ms when Run starts.

// TopicRetention is how long a topic keeps its messages, as its
// configuration says.
type TopicRetention struct {
	// Topic is the topic's name.
	Topic string
	// Retention is retention.ms; Forever when it is -1 or the topic is
	// compacted without deletion (cleanup.policy=compact).
	Retention time.Duration
	// Segment is segment.ms: a message is deleted with its segment, once
	// the segment's newest message is older than Retention, so a message
	// can outlive Retention by up to Segment on a quiet topic.
	Segment time.Duration
	// Policy is cleanup.policy ("delete", "compact" or "compact,delete").
	Policy string
}

// Outlives reports whether the topic keeps messages (retention.ms, or for
// ever) longer than dedup rows are kept, for dedup: a replay from the
// earliest offset would apply events whose rows are gone.
func (t TopicRetention) Outlives(dedup time.Duration) bool {
	return t.Retention == Forever || t.Retention > dedup
}

// OutlivesBySegment reports whether the topic's messages outlive dedup rows
// kept for dedup only through the span of a segment (retention.ms +
// segment.ms does, retention.ms alone does not): on a quiet topic a replay
// could apply a message again.
func (t TopicRetention) OutlivesBySegment(dedup time.Duration) bool {
	return !t.Outlives(dedup) && (t.Segment == Forever || t.Retention+t.Segment > dedup)
}

// Forever is TopicRetention.Retention for a topic that never deletes.
const Forever time.Duration = -1

// String renders a retention as "7d", "36h" or "forever".
func formatRetention(d time.Duration) string {
	switch {
	case d == Forever:
		return "forever"
	case d >= 24*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	default:
		return d.String()
	}
}

// DescribeRetention reads the retention configuration of topics
// (DescribeConfigs; it changes nothing), in the order given.
func DescribeRetention(ctx context.Context, brokers []string, topics []string, opts ...GroupOption) ([]TopicRetention, error) {
	s := groupSettingsFrom(opts)
	return describeRetention(ctx, s.dialer, brokers, topics)
}

func describeRetention(ctx context.Context, dialer *kafka.Dialer, brokers []string, topics []string) ([]TopicRetention, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	transport := transportFor(dialer)
	defer transport.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport, Timeout: 30 * time.Second}
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t,
			ConfigNames: []string{"retention.ms", "segment.ms", "cleanup.policy"},
		})
	}
	resp, err := cl.DescribeConfigs(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("consumer: describe the retention of %s: %w", strings.Join(topics, ", "), err)
	}
	byName := map[string]kafka.DescribeConfigResponseResource{}
	for _, r := range resp.Resources {
		byName[r.ResourceName] = r
	}
	out := make([]TopicRetention, 0, len(topics))
	for _, t := range topics {
		r, ok := byName[t]
		if !ok {
			return nil, fmt.Errorf("consumer: describe the retention of %s: no answer for the topic", t)
		}
		if r.Error != nil {
			return nil, fmt.Errorf("consumer: describe the retention of %s: %w", t, r.Error)
		}
		tr, err := parseRetention(t, r.ConfigEntries)
		if err != nil {
			return nil, err
		}
		out = append(out, tr)
	}
	return out, nil
}

// parseRetention reads a topic's retention from its configuration entries;
// a missing entry takes Kafka's default.
func parseRetention(topic string, entries []kafka.DescribeConfigResponseConfigEntry) (TopicRetention, error) {
	tr := TopicRetention{Topic: topic, Retention: 7 * 24 * time.Hour, Segment: 7 * 24 * time.Hour, Policy: "delete"}
	for _, e := range entries {
		switch e.ConfigName {
		case "retention.ms", "segment.ms":
			ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil {
				return tr, fmt.Errorf("consumer: topic %s: %s %q is not a number of milliseconds", topic, e.ConfigName, e.ConfigValue)
			}
			d := time.Duration(ms) * time.Millisecond
			if ms < 0 {
				d = Forever
			}
			if e.ConfigName == "retention.ms" {
				tr.Retention = d
			} else {
				tr.Segment = d
			}
		case "cleanup.policy":
			tr.Policy = e.ConfigValue
		}
	}
	if !slices.Contains(strings.Split(tr.Policy, ","), "delete") {
		// Compaction alone keeps each key's latest message for ever.
		tr.Retention = Forever
	}
	return tr, nil
}

// ErrRetention matches (errors.Is) every *RetentionError.
var ErrRetention = errors.New("dedup retention shorter than the topic's")

// RetentionError is what Run returns (unless WithRetentionCheck says to
// warn) when the consumer prunes dedup rows sooner than a consumed topic
// deletes its messages: a replay from the earliest offset would apply the
// events whose rows are gone a second time.
type RetentionError struct {
	// Consumer is the consumer's name.
	Consumer string
	// Dedup is how long dedup rows are kept (WithPruning's olderThan).
	Dedup time.Duration
	// Topics are the consumed topics that keep messages longer.
	Topics []TopicRetention
}

func (e *RetentionError) Error() string {
	parts := make([]string, len(e.Topics))
	for i, t := range e.Topics {
		parts[i] = fmt.Sprintf("%s keeps messages %s", t.Topic, formatRetention(t.Retention))
	}
	return fmt.Sprintf("consumer %s: %v: dedup rows are pruned after %s but %s, so a replay from the earliest offset would apply events again: "+
		"keep dedup rows at least as long (WithPruning's olderThan, eventsctl prune --older-than), or shorten the topics' retention.ms; "+
		"WithRetentionCheck(RetentionWarn) starts anyway", e.Consumer, ErrRetention, formatRetention(e.Dedup), strings.Join(parts, ", "))
}

// Is makes errors.Is(err, ErrRetention) hold.
func (e *RetentionError) Is(target error) bool { return target == ErrRetention }

// RetentionCheck is what Run does when the dedup retention is shorter than
// a consumed topic's (see WithRetentionCheck).
type RetentionCheck int

const (
	// RetentionRefuse makes Run return a *RetentionError (the default).
	RetentionRefuse RetentionCheck = iota
	// RetentionWarn makes Run log the problem as a warning and start.
	RetentionWarn
)

// WithRetentionCheck sets what Run does when it prunes dedup rows
// (WithPruning) sooner than a consumed topic deletes messages: refuse to
// start (RetentionRefuse, the default) or warn and start (RetentionWarn),
// for topics whose replays are known to stay recent.
func WithRetentionCheck(rc RetentionCheck) Option {
	return func(c *Consumer) {
		if rc != RetentionRefuse && rc != RetentionWarn {
			c.s.fail("unknown retention check %d", int(rc))
			return
		}
		c.s.retentionCheck = rc
	}
}

// retentionRisks compares a dedup retention with topics' retention: the
// topics that keep messages longer (a replay re-applies), and those that
// keep them longer only through their segments' span (a replay of a quiet
// topic may re-apply).
func retentionRisks(dedup time.Duration, trs []TopicRetention) (longer, segment []TopicRetention) {
	for _, t := range trs {
		switch {
		case t.Outlives(dedup):
			longer = append(longer, t)
		case t.OutlivesBySegment(dedup):
			segment = append(segment, t)
		}
	}
	return longer, segment
}

// checkRetention is the guard Run applies before joining the group, when
// the consumer prunes its dedup rows. The brokers being unreachable is
// retried (as the topic check does) until ctx ends.
func (c *Consumer) checkRetention(ctx context.Context) error {
	if c.s.pruneEvery <= 0 {
		return nil // dedup rows are kept until someone else prunes them
	}
	var trs []TopicRetention
	var lastWarn time.Time
	for {
		var err error
		if trs, err = describeRetention(ctx, c.s.dialer, c.brokers, c.topics); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, kafka.TopicAuthorizationFailed) || errors.Is(err, kafka.ClusterAuthorizationFailed) {
			// No retry grants the permission: decide now.
			if c.s.retentionCheck == RetentionWarn {
				c.log.Warn("consumer: cannot read the topics' retention; starting without the retention check (WithRetentionCheck(RetentionWarn))", "err", err)
				return nil
			}
			return fmt.Errorf("consumer %s: %w: cannot read the consumed topics' retention to compare it with the dedup retention (WithPruning): "+
				"grant the consumer's principal DescribeConfigs on the topics, or start with WithRetentionCheck(RetentionWarn): %w", c.name, ErrRetention, err)
		}
		if lastWarn.IsZero() || (c.s.unassignedWarn > 0 && time.Since(lastWarn) >= c.s.unassignedWarn) {
			c.log.Warn("consumer: cannot read the topics' retention, retrying", "err", err)
			lastWarn = time.Now()
		}
		if err := sleep(ctx, c.s.topicPoll); err != nil {
			return nil
		}
	}
	longer, segment := retentionRisks(c.s.pruneOlderThan, trs)
	for _, t := range segment {
		// Kafka's defaults (7 days each) with the default floor land here:
		// a note, not an alarm.
		c.log.Info("consumer: a message of a quiet topic can outlive retention.ms by up to segment.ms, longer than dedup rows are kept; a replay from the earliest offset could apply it again",
			"topic", t.Topic, "retention", formatRetention(t.Retention), "segment", formatRetention(t.Segment), "dedup", formatRetention(c.s.pruneOlderThan))
	}
	if len(longer) == 0 {
		return nil
	}
	e := &RetentionError{Consumer: c.name, Dedup: c.s.pruneOlderThan, Topics: longer}
	if c.s.retentionCheck == RetentionWarn {
		c.log.Warn("consumer: starting despite the retention check (WithRetentionCheck(RetentionWarn))", "err", e.Error())
		return nil
	}
	return e
}
