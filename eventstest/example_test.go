package eventstest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/eventstest"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/events"
)

// testHandler is the test a service writes for its OrderPlaced handler:
// publish typed events, run the consumer until it applied them, assert on
// the tables.
func testHandler(t *testing.T) {
	ctx := context.Background()
	env := eventstest.New(t, eventstest.WithInProcessKafka())
	if _, err := env.DB.Exec(ctx, `CREATE TABLE seen (order_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	c, err := ordersv1.NewOrderPlacedConsumer(env.ConsumerConfig("billing"),
		func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1)`, ev.GetOrderId())
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-1"})
	env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-2"})
	env.ConsumeUntil(t, c, "billing", 2)
	var n int
	if err := env.DB.QueryRow(ctx, `SELECT count(*) FROM seen`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("seen %d orders (%v), want 2", n, err)
	}
}

// Example shows a handler test; in your code, testHandler is a
// TestXxx(t *testing.T) function. TestExample runs it.
func Example() {
	_ = testHandler
}

func TestExample(t *testing.T) { testHandler(t) }
