package topics_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/topics"
)

func TestEnsureCreatesTopicsAndDLQsOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := testenv.Kafka(t)
	a := testenv.Topic(t, "topics-a")
	b := testenv.Topic(t, "topics-b")
	ds := []*events.Descriptor{
		{Type: "x.A", Topic: a, DLQTopic: a + ".dlq"},
		{Type: "x.B", Topic: b, DLQTopic: "shared-dlq-" + b},
		{Type: "x.C", Topic: b + "-c"}, // no DLQ topic: the consumer's default
		nil,
	}
	want := []string{a, a + ".dlq", b, "shared-dlq-" + b, b + "-c", b + "-c.dlq"}
	slices.Sort(want)
	if got := topics.Names(ds...); !slices.Equal(got, want) {
		t.Fatalf("Names = %v, want %v", got, want)
	}
	created, err := topics.Ensure(ctx, k.Brokers, topics.Config{Partitions: 4, DLQConfigs: map[string]string{"retention.ms": "1209600000"}}, ds...)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(created)
	if !slices.Equal(created, want) {
		t.Fatalf("created %v, want %v", created, want)
	}
	conn, err := kafka.DialContext(ctx, "tcp", k.Brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, topic := range want {
		parts, err := conn.ReadPartitions(topic)
		if err != nil {
			t.Fatalf("%s: %v", topic, err)
		}
		if len(parts) != 4 {
			t.Errorf("%s has %d partitions, want 4", topic, len(parts))
		}
	}
	again, err := topics.Ensure(ctx, k.Brokers, topics.Config{Partitions: 8}, ds...)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Ensure: created %v, err %v; want nothing", again, err)
	}
	if parts, _ := conn.ReadPartitions(a); len(parts) != 4 {
		t.Errorf("an existing topic was changed: %d partitions", len(parts))
	}
}

func TestCreateRefusesNoBrokers(t *testing.T) {
	if _, err := topics.Create(context.Background(), nil, topics.Config{}, "t"); err == nil {
		t.Fatal("Create without brokers succeeded")
	}
}
