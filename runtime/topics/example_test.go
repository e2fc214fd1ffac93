package topics_test

import (
	"context"
	"fmt"
	"log"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/topics"
)

// A deploy step checks that the cluster has every topic the events need,
// with the planned settings, and fails on any drift.
func ExampleCheck() {
	ctx := context.Background()
	brokers := []string{"localhost:9092"}
	var registry []*events.Descriptor // a generated registry, e.g. ordersv1.OrdersEvents
	specs, err := topics.Plan(topics.Config{Partitions: 12, ReplicationFactor: 3,
		Configs: map[string]string{"retention.ms": "604800000"}}, registry...)
	if err != nil {
		log.Fatal(err)
	}
	drift, err := topics.Check(ctx, brokers, nil, specs)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range drift {
		fmt.Println(d)
	}
	if len(drift) > 0 {
		log.Fatalf("%d topic(s) differ from the plan: run eventsctl topics create, or fix them by hand", len(drift))
	}
}
