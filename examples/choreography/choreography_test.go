package choreography

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/protoevents/protoevents/eventstest/servers"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	paymentsv1 "github.com/protoevents/protoevents/examples/gen/shop/payments/v1"
	"github.com/protoevents/protoevents/examples/ordersaga"
	"github.com/protoevents/protoevents/examples/stock"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/topics"
)

func TestMain(m *testing.M) { servers.Main(m) }

// TestChoreography runs the order flow as services reacting to each
// other's events, on Postgres and Kafka (kfake over TCP): a good order is
// confirmed and shipped; a declined card, an empty shelf and an unserved
// country each cancel the order and undo what had happened.
func TestChoreography(t *testing.T) {
	ctx := context.Background()
	pool, _ := servers.DB(t)
	k := servers.OwnKafka(t)
	for _, err := range []error{outbox.Migrate(ctx, pool), consumer.Migrate(ctx, pool), Migrate(ctx, pool),
		stock.Fill(ctx, pool, "sku-1", 100), stock.Fill(ctx, pool, "sku-none", 0)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := topics.Ensure(ctx, k.Brokers, topics.Config{Partitions: 2}, append(ordersaga.Events(), ordersv1.OrdersEvents...)...); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	f := New(pool, w, "ZZ")
	f.Payments.Declines = func(c *paymentsv1.ChargeCard) bool { return c.GetCustomerId() == "broke" }
	relay, err := outbox.NewRelay(pool, k.Brokers, outbox.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := f.Consumers(k.Brokers, consumer.WithBackoff(20*time.Millisecond, 200*time.Millisecond), consumer.WithMaxAttempts(50))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range append([]interface{ Run(context.Context) error }{relay}, runnersOf(cs)...) {
		wg.Go(func() {
			if err := r.Run(runCtx); err != nil && runCtx.Err() == nil {
				t.Errorf("%T: %v", r, err)
			}
		})
	}
	defer func() { stop(); wg.Wait() }()

	orders := []*ordersv1.OrderPlaced{
		{OrderId: "c-good", CustomerId: "ann", TotalCents: 500, Currency: "EUR", Country: "DE", Items: []*ordersv1.LineItem{{Sku: "sku-1", Quantity: 2}}},
		{OrderId: "c-declined", CustomerId: "broke", TotalCents: 700, Currency: "EUR", Country: "DE", Items: []*ordersv1.LineItem{{Sku: "sku-1", Quantity: 3}}},
		{OrderId: "c-empty", CustomerId: "ann", TotalCents: 900, Currency: "EUR", Country: "DE", Items: []*ordersv1.LineItem{{Sku: "sku-none", Quantity: 1}}},
		{OrderId: "c-unserved", CustomerId: "ann", TotalCents: 1100, Currency: "EUR", Country: "ZZ", Items: []*ordersv1.LineItem{{Sku: "sku-1", Quantity: 4}}},
	}
	for _, o := range orders {
		if err := f.PlaceOrder(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{
		"c-good":     "confirmed reserve:2 charge:500 pickup",
		"c-declined": "cancelled reserve:3 release:3",
		"c-empty":    "cancelled",
		"c-unserved": "cancelled reserve:4 release:4 charge:1100 refund:1100",
	}
	got := map[string]string{}
	deadline := time.Now().Add(60 * time.Second)
	for {
		for id := range want {
			got[id] = outcome(t, f, id)
		}
		if mapsEqual(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("outcomes %v, want %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var onHand int64
	if err := pool.QueryRow(ctx, `SELECT on_hand FROM stock_levels WHERE sku = 'sku-1'`).Scan(&onHand); err != nil || onHand != 98 {
		t.Fatalf("sku-1 on hand %d (%v), want 98: only the confirmed order holds stock", onHand, err)
	}
}

// outcome sums up one order across the services' tables.
func outcome(t *testing.T, f *Flow, id string) string {
	t.Helper()
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT status
		|| coalesce((SELECT string_agg(' ' || action || ':' || quantity, '' ORDER BY seq) FROM stock_effects WHERE order_id = $1), '')
		|| coalesce((SELECT string_agg(' ' || action || ':' || amount_cents, '' ORDER BY seq) FROM payment_effects WHERE order_id = $1), '')
		|| CASE WHEN EXISTS (SELECT 1 FROM pickups WHERE order_id = $1) THEN ' pickup' ELSE '' END
		FROM choreo_orders WHERE order_id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func runnersOf(cs []*consumer.Consumer) []interface{ Run(context.Context) error } {
	out := make([]interface{ Run(context.Context) error }, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}
