package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/events"
)

// missingTopic returns a bundle for a topic of b's cluster that does not
// exist yet (b.topic + "-later", two partitions once created).
func missingTopic(b *bundle) *bundle {
	m := &bundle{pool: b.pool, brokers: b.brokers, parts: 2, topic: b.topic + "-later"}
	m.d = descriptorFor(m.topic)
	return m
}

// TestRelayMissingTopicAtHeadDoesNotStallOthers: more rows of a missing
// topic than one batch holds sit at the head of the lanes; the relay parks
// the topic and publishes the existing topic's events behind them, keeps
// the missing topic's rows pending with the broker's error recorded, and
// delivers them in order once the topic is created.
func TestRelayMissingTopicAtHeadDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	missing := missingTopic(b)
	late, wantLate := sequence(missing.d, 40, 5)
	good, wantGood := sequence(b.d, 10, 5)
	b.write(t, append(append([]events.Event{}, late...), good...))
	b.startRelay(t, WithBatchSize(20))

	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := Status(ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Published == 10 && st.Failing > 0 {
			if st.Pending != 40 || !strings.Contains(st.LastError, "Unknown Topic") {
				t.Fatalf("while the topic is missing: %+v, want its 40 rows pending with the broker's error", st)
			}
			break
		}
		if st.Pending < 40 {
			t.Fatalf("%d pending: events for the missing topic were marked", st.Pending)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the existing topic's events stalled behind the missing topic's: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkDelivery(t, b.readAll(t), wantGood)
	if err := b.kafka.CreateTopics(ctx, 2, missing.topic); err != nil {
		t.Fatal(err)
	}
	b.waitDrained(t, 15*time.Second)
	checkDelivery(t, missing.readAll(t), wantLate)
}

// TestRelayMissingTopicSteadyTrafficDoesNotStallOthers: steady traffic of
// a new event type whose topic was not created yet (a new key per event,
// so key parking alone cannot hold them back) mixed with an existing
// topic's events: every existing-topic event is published.
func TestRelayMissingTopicSteadyTrafficDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	missing := missingTopic(b)
	b.startRelay(t, WithBatchSize(20))
	want := map[string]int{}
	const rounds, each = 25, 10
	for round := range rounds {
		var evs []events.Event
		for i := range each {
			evs = append(evs, newEvent(missing.d, fmt.Sprintf("order-%d-%d", round, i), 0))
		}
		for i := range each {
			k := fmt.Sprintf("good-%d-%d", round, i)
			evs = append(evs, newEvent(b.d, k, 0))
			want[k] = 1
		}
		b.write(t, evs)
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := Status(ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Published == rounds*each {
			if st.Pending != rounds*each {
				t.Fatalf("%+v: want exactly the missing topic's %d rows pending", st, rounds*each)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("existing topic's events held up by the missing topic: %d of %d published (%+v)", st.Published, rounds*each, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkDelivery(t, b.readAll(t), want)
}

// TestRefusedTopicsNeedsEveryMessageRefused pins which failures park a
// topic as a whole: every one of its messages failed with a topic-level
// error, plain or wrapped.
func TestRefusedTopicsNeedsEveryMessageRefused(t *testing.T) {
	t.Parallel()
	row := func(id int64, topic, key string) claimed {
		return claimed{rowMeta: rowMeta{ID: id, Topic: topic, Key: []byte(key)}}
	}
	batch := []claimed{row(1, "gone", "a"), row(2, "ok", "b"), row(3, "denied", "c"), row(4, "gone", "d"), row(5, "sick", "e"), row(6, "sick", "f")}
	wrapped := fmt.Errorf("metadata: %w", kafka.TopicAuthorizationFailed)
	werrs := kafka.WriteErrors{kafka.UnknownTopicOrPartition, nil, wrapped, kafka.UnknownTopicOrPartition, kafka.UnknownTopicOrPartition, kafka.NotEnoughReplicas}
	if got, want := refusedTopics(batch, werrs), []string{"gone", "denied"}; !slices.Equal(got, want) {
		t.Fatalf("refused topics %v, want %v (sick has a partition-level failure)", got, want)
	}
	if got := refusedTopics(batch, kafka.UnknownTopicOrPartition); got != nil {
		t.Fatalf("a whole-call error names no topic, got %v", got)
	}
	if got := refusedTopics(batch, nil); got != nil {
		t.Fatalf("success refuses no topic, got %v", got)
	}
	if !isTopicError(fmt.Errorf("x: %w", kafka.InvalidTopic)) || isTopicError(errors.New("Unknown Topic Or Partition")) || isTopicError(kafka.NotEnoughReplicas) {
		t.Fatal("isTopicError must match kafka-go's topic-level error codes, wrapped or not, and nothing else")
	}
}
