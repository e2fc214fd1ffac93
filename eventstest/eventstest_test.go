package eventstest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/eventstest"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

func TestMain(m *testing.M) { eventstest.Main(m) }

// TestProduceRelayConsume goes through the kit the long way round: a
// producer's transaction that rolls back leaves no row, one that commits
// leaves exactly its row, the relay sends it, and a consumer applies it, in
// every wire format (the envelopes and the CloudEvents binary modes).
func TestProduceRelayConsume(t *testing.T) {
	for _, f := range envelope.Formats {
		t.Run(f.String(), func(t *testing.T) {
			ctx := context.Background()
			env := eventstest.New(t, eventstest.WithOwnKafka(), eventstest.WithFormat(f))
			placed := ordersv1.NewOrderPlacedProducer(env.Writer)
			rollback := errors.New("rollback")
			err := pgx.BeginFunc(ctx, env.DB, func(tx pgx.Tx) error {
				if _, err := placed.Publish(ctx, tx, &ordersv1.OrderPlaced{OrderId: "o-0"}); err != nil {
					return err
				}
				return rollback
			})
			if !errors.Is(err, rollback) {
				t.Fatal(err)
			}
			if rows := env.OutboxRows(t); len(rows) != 0 {
				t.Fatalf("a rolled-back publish left %d outbox rows", len(rows))
			}
			id := env.Produce(t, &ordersv1.OrderPlaced{OrderId: "o-1", TotalCents: 1250})
			rows := env.OutboxRows(t)
			var got ordersv1.OrderPlaced
			if len(rows) != 1 || rows[0].Envelope.EventID != id || rows[0].Published || rows[0].Unmarshal(&got) != nil || got.GetTotalCents() != 1250 {
				t.Fatalf("outbox rows %+v, want one pending OrderPlaced %s of 1250 cents", rows, id)
			}
			env.Relay(t)
			if rows := env.OutboxRows(t); !rows[0].Published {
				t.Fatal("row not published after Relay")
			}
			var seen []events.EventID
			c := env.NewConsumer(t, "audit")
			if err := ordersv1.HandleOrderPlaced(c, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
				seen = append(seen, meta.EventID)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			env.ConsumeUntil(t, c, "audit", 1)
			if n, err := env.Applied(ctx, "audit"); err != nil || n != 1 || len(seen) != 1 || seen[0] != id {
				t.Fatalf("applied %d (%v), handler saw %v; want %s once", n, err, seen, id)
			}
		})
	}
}

// TestDLQWaitsForEntries checks that DLQ returns the dead-lettered message
// with the consumer's headers decoded.
func TestDLQWaitsForEntries(t *testing.T) {
	env := eventstest.New(t, eventstest.WithOwnKafka())
	c := env.NewConsumer(t, "strict")
	if err := ordersv1.HandleOrderPlaced(c, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
		return consumer.Permanent(errors.New("refused"))
	}); err != nil {
		t.Fatal(err)
	}
	id := env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-9"})
	stop := env.Start(t, c)
	dlq := env.DLQ(t, ordersv1.OrderPlacedDLQTopic, 1)
	stop()
	if dlq[0].EventID != id.String() || dlq[0].Consumer != "strict" || string(dlq[0].Key) != "o-9" {
		t.Fatalf("DLQ entry %+v, want %s from consumer strict", dlq[0], id)
	}
}
