package eventstest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/eventstest"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/events"
)

// Example is the test a service writes for its OrderPlaced handler, in a
// _test.go file whose TestMain calls eventstest.Main: publish typed events,
// run the consumer until it applied them, assert on the tables.
// TestKitExample runs the same steps.
func Example() {
	TestBilling := func(t *testing.T) {
		ctx := context.Background()
		env := eventstest.New(t, eventstest.WithOwnKafka())
		if _, err := env.DB.Exec(ctx, `CREATE TABLE billed (order_id text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		c := env.NewConsumer(t, "billing")
		if err := ordersv1.HandleOrderPlaced(c, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
			_, err := tx.Exec(ctx, `INSERT INTO billed VALUES ($1)`, ev.GetOrderId())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-1"})
		env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-2"})
		env.ConsumeUntil(t, c, "billing", 2)
		var n int
		if err := env.DB.QueryRow(ctx, `SELECT count(*) FROM billed`).Scan(&n); err != nil || n != 2 {
			t.Fatalf("billed %d orders (%v), want 2", n, err)
		}
	}
	_ = TestBilling
}

// TestKitExample runs Example's steps.
func TestKitExample(t *testing.T) {
	ctx := context.Background()
	env := eventstest.New(t, eventstest.WithOwnKafka())
	if _, err := env.DB.Exec(ctx, `CREATE TABLE billed (order_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, "billing")
	if err := ordersv1.HandleOrderPlaced(c, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO billed VALUES ($1)`, ev.GetOrderId())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-1"})
	env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-2"})
	env.ConsumeUntil(t, c, "billing", 2)
	var n int
	if err := env.DB.QueryRow(ctx, `SELECT count(*) FROM billed`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("billed %d orders (%v), want 2", n, err)
	}
}
