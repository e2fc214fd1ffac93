package topics_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/topics"
)

func TestEnsureCreatesTopicsAndDLQsOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := servers.Kafka(t)
	a := servers.Topic(t, "topics-a")
	b := servers.Topic(t, "topics-b")
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

// TestPlanAndCheckFromRegistry: a registry's descriptors plan each topic
// and its effective DLQ (a custom one respected); Check finds nothing to
// report after Ensure and names each difference when the plan changes.
func TestPlanAndCheckFromRegistry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := servers.Kafka(t)
	a := servers.Topic(t, "plan-a")
	ds := []*events.Descriptor{{Type: "x.A", Topic: a, DLQTopic: a + "-dead"}}
	cfg := topics.Config{Partitions: 2, Configs: map[string]string{"retention.ms": "3600000"}}
	specs, err := topics.Plan(cfg, ds...)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 || specs[0].Name != a || specs[0].DLQ || specs[1].Name != a+"-dead" || !specs[1].DLQ {
		t.Fatalf("plan %+v", specs)
	}
	drift, err := topics.Check(ctx, k.Brokers, nil, specs)
	if err != nil || len(drift) != 2 || drift[0].Field != "missing" {
		t.Fatalf("check before creating: %v, %v", drift, err)
	}
	if _, err := topics.Ensure(ctx, k.Brokers, cfg, ds...); err != nil {
		t.Fatal(err)
	}
	if drift, err := topics.Check(ctx, k.Brokers, nil, specs); err != nil || len(drift) != 0 {
		t.Fatalf("check after Ensure: %v, %v", drift, err)
	}
	specs, _ = topics.Plan(topics.Config{Partitions: 3, Configs: map[string]string{"retention.ms": "60000"}}, ds...)
	drift, err = topics.Check(ctx, k.Brokers, nil, specs)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range drift {
		got = append(got, d.String())
	}
	want := []string{a + ": partitions is 2, want 3", a + ": retention.ms is 3600000, want 60000",
		a + "-dead: partitions is 2, want 3", a + "-dead: retention.ms is 3600000, want 60000"}
	if !slices.Equal(got, want) {
		t.Fatalf("drift\n%v\nwant\n%v", got, want)
	}
}

func TestPlanRefusesInvalidNamesAndCounts(t *testing.T) {
	for _, c := range []struct {
		cfg  topics.Config
		ds   []*events.Descriptor
		want string
	}{
		{topics.Config{}, []*events.Descriptor{{Topic: "bad topic"}}, `"bad topic" has ' '`},
		{topics.Config{}, []*events.Descriptor{{Topic: "ok", DLQTopic: "dlq/x"}}, `"dlq/x" has '/'`},
		{topics.Config{Partitions: -1}, []*events.Descriptor{{Topic: "ok"}}, "-1 partitions"},
		{topics.Config{Configs: map[string]string{"": "1"}}, []*events.Descriptor{{Topic: "ok"}}, "empty config name"},
	} {
		if _, err := topics.Plan(c.cfg, c.ds...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Plan(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := topics.Create(context.Background(), []string{"127.0.0.1:1"}, topics.Config{}, "bad topic"); err == nil {
		t.Error("Create accepted a bad name")
	}
}
