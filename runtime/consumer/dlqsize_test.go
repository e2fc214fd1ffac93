package consumer

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/topics"
)

// TestDLQTooSmallForTheMessage: a poison message larger than its DLQ
// topic's max.message.bytes is refused by the broker (MESSAGE_TOO_LARGE),
// so the consumer dead-letters its key and headers with dlq_value_dropped
// set to the value's size, commits past it (the original stays in its
// topic), and Redrive refuses the entry, naming where the original is.
// Only a real broker enforces max.message.bytes: kfake accepts any size.
func TestDLQTooSmallForTheMessage(t *testing.T) {
	if !servers.RealKafka() {
		t.Skip("kfake does not enforce max.message.bytes: runs in the real tier (make test-kafka)")
	}
	t.Parallel()
	b := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.d.DLQTopic = b.topic + ".small-dlq"
	if _, err := topics.Create(ctx, b.kafka.Brokers, topics.Config{Partitions: 1, Configs: map[string]string{"max.message.bytes": "2048"}}, b.d.DLQTopic); err != nil {
		t.Fatal(err)
	}
	var dead counter
	c := b.newConsumer(t, "big", b.handler("big", nil), WithCommitInterval(0), WithHooks(Hooks{DeadLettered: func(DeadLetter) { dead.inc() }}))
	start(t, c)
	poison := bytes.Repeat([]byte("{garbage"), 1024) // 8 KiB, not an envelope
	b.produce(t, kafka.Message{Key: []byte("k"), Value: poison}, message(t, b.event(t, "k", 1), nil))
	entries := b.dlqEntries(t, 1, 30*time.Second)
	b.effectsAtLeast(t, 1, 30*time.Second)
	e := entries[0]
	if e.ValueDropped != len(poison) || e.Message.Value != nil || e.OriginalOffset != 0 || e.OriginalTopic != b.topic || dead.get() != 1 {
		t.Fatalf("DLQ entry %+v (%d alerts); want the 8 KiB value dropped, pointing at %s/0/0", e, dead.get(), b.topic)
	}
	if _, err := Redrive(ctx, b.kafka.Brokers, b.d.DLQTopic, SelectAll()); err == nil || !strings.Contains(err.Error(), b.topic) {
		t.Fatalf("redrive of a value-dropped entry: %v, want a refusal naming the original's topic", err)
	}
}
