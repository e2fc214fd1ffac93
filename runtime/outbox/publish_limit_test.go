package outbox_test

import (
	"context"
	"errors"
	"log"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/servers"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// TestPublishRefusesOversizedEvent publishes a 1.2 MB event through a
// generated producer with the default limit: Publish and PublishBatch
// refuse it with an error naming the type, size, limit and fix, and the
// committed transaction holds only the business-sized event.
func TestPublishRefusesOversizedEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	p := ordersv1.NewOrderPlacedProducer(w)
	small := &ordersv1.OrderPlaced{OrderId: "o-1", CustomerId: "c-1", TotalCents: 1250, Currency: "EUR"}
	big := &ordersv1.OrderPlaced{OrderId: "o-2", CustomerId: strings.Repeat("x", 1_200_000), TotalCents: 1, Currency: "EUR"}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := p.Publish(ctx, tx, small); err != nil {
			return err
		}
		_, err := p.Publish(ctx, tx, big)
		var tooLarge *outbox.EventTooLargeError
		if !errors.As(err, &tooLarge) {
			t.Fatalf("oversized Publish: %v, want an *outbox.EventTooLargeError", err)
		}
		if tooLarge.Type != "shop.orders.v1.OrderPlaced" || tooLarge.Limit != outbox.DefaultMaxEventBytes || tooLarge.Size <= 1_200_000 {
			t.Fatalf("error fields %+v", tooLarge)
		}
		for _, want := range []string{"shop.orders.v1.OrderPlaced", "1000000 bytes", "max.message.bytes", "WithMaxEventBytes", "slim the event"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		if _, err := p.PublishBatch(ctx, tx, []*ordersv1.OrderPlaced{small, big}); !errors.Is(err, outbox.ErrEventTooLarge) {
			t.Fatalf("oversized PublishBatch: %v, want ErrEventTooLarge", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var n, maxLen int
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(length(value)), 0) FROM outbox`).Scan(&n, &maxLen); err != nil {
		t.Fatal(err)
	}
	if n != 1 || maxLen > 10_000 {
		t.Fatalf("%d rows (largest value %d bytes), want only the small event", n, maxLen)
	}
}

// A topic whose max.message.bytes was raised to 4 MiB takes larger events;
// the writer's limit is raised to match, and an event over it is told
// apart from other failures.
func ExampleWithMaxEventBytes() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	w, err := outbox.NewWriter(outbox.WithMaxEventBytes(4 << 20))
	if err != nil {
		log.Fatal(err)
	}
	orders := ordersv1.NewOrderPlacedProducer(w)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := orders.Publish(ctx, tx, &ordersv1.OrderPlaced{OrderId: "o-1", CustomerId: "c-7"})
		return err
	})
	var tooLarge *outbox.EventTooLargeError
	if errors.As(err, &tooLarge) {
		log.Printf("order event of %d bytes refused (limit %d): nothing was written", tooLarge.Size, tooLarge.Limit)
	}
}
