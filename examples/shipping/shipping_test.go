package shipping_test

import (
	"context"
	"testing"
	"time"

	"github.com/protoevents/protoevents/eventstest"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	shippingv1 "github.com/protoevents/protoevents/examples/gen/shop/shipping/v1"
	"github.com/protoevents/protoevents/examples/shipping"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
)

func TestMain(m *testing.M) { eventstest.Main(m) }

// TestShippingWithTheTestKit is the service's test as a user of protoevents
// writes it with eventstest: typed events in, the handler's rows, its
// follow-up events in the outbox and the poison order in the DLQ out.
func TestShippingWithTheTestKit(t *testing.T) {
	ctx := context.Background()
	// Generated topics and the consumer group have fixed names.
	env := eventstest.New(t, eventstest.WithOwnKafka())
	if err := shipping.Migrate(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	svc := shipping.New(env.Writer, "ZZ")
	c, err := svc.NewConsumer(env.DB, env.Brokers,
		consumer.WithMaxAttempts(2), consumer.WithBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// The service consumes OrderPlaced and OrderCancelled; Run refuses to
	// start while a consumed topic or its DLQ is missing.
	env.CreateTopics(t, shippingv1.ShipmentCreatedEvent, ordersv1.OrderCancelledEvent)
	first := env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-1", Country: "DE"}, events.WithCorrelationID("req-1"))
	env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-2", Country: "FR"})
	poison := env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-3", Country: "ZZ"})
	env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-1", Country: "DE"}, events.WithEventID(first)) // a relay re-send

	stop := env.Start(t, c)
	env.WaitApplied(t, shipping.ConsumerName, 2)
	dlq := env.DLQ(t, ordersv1.OrderPlacedDLQTopic, 1)
	// The same consumer handles the cancellation of o-2.
	env.Publish(t, &ordersv1.OrderCancelled{OrderId: "o-2", Reason: "changed my mind"})
	env.WaitApplied(t, shipping.ConsumerName, 3)
	stop()
	if len(dlq) != 1 || dlq[0].EventID != poison.String() || dlq[0].Attempts != 2 {
		t.Fatalf("DLQ = %+v, want the poison order %s after 2 attempts", dlq, poison)
	}

	var shipments int
	if err := env.DB.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&shipments); err != nil {
		t.Fatal(err)
	}
	if shipments != 2 {
		t.Errorf("%d shipments, want 2 (o-1 once despite the re-send, o-2)", shipments)
	}
	var status string
	if err := env.DB.QueryRow(ctx, `SELECT status FROM shipments WHERE order_id = 'o-2'`).Scan(&status); err != nil || status != "cancelled" {
		t.Errorf("shipment of the cancelled o-2: %q, %v; want cancelled", status, err)
	}
	rows := env.OutboxRows(t)
	if len(rows) != 2 {
		t.Fatalf("outbox holds %d rows, want 2 ShipmentCreated", len(rows))
	}
	var created shippingv1.ShipmentCreated
	if err := rows[0].Unmarshal(&created); err != nil {
		t.Fatal(err)
	}
	if rows[0].Envelope.Type != shippingv1.ShipmentCreatedEventType || created.GetOrderId() != "o-1" ||
		rows[0].Envelope.CausationID != first.String() || rows[0].Envelope.CorrelationID != "req-1" {
		t.Errorf("first outbox row: %+v %v; want ShipmentCreated of o-1 caused by %s, correlation req-1", rows[0].Envelope.Metadata, &created, first)
	}

	// The relay ships them; the outbox is drained.
	env.Relay(t)
	for _, r := range env.OutboxRows(t) {
		if !r.Published {
			t.Errorf("row %d not published after Relay", r.ID)
		}
	}
}
