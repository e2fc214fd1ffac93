package eventstest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/protoevents/protoevents/eventstest"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// TestDatabaseSQLProducerEndToEnd: a service on database/sql (pgx stdlib
// driver) writes its business row and a generated producer's event in one
// *sql.Tx; a rolled-back transaction leaves neither, a committed one both,
// and the event reaches a consumer through the relay.
func TestDatabaseSQLProducerEndToEnd(t *testing.T) {
	ctx := context.Background()
	env := eventstest.New(t, eventstest.WithOwnKafka())
	db := stdlib.OpenDBFromPool(env.DB)
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	placed := ordersv1.NewOrderPlacedProducer(env.Writer)
	place := func(id string, commit bool) events.EventID {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
			t.Fatal(err)
		}
		eid, err := placed.Publish(ctx, outbox.SQLTx(tx), &ordersv1.OrderPlaced{OrderId: id, TotalCents: 990})
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		return eid
	}
	place("o-rolled-back", false)
	id := place("o-1", true)

	rows := env.OutboxRows(t)
	if len(rows) != 1 || rows[0].Envelope.EventID != id {
		t.Fatalf("outbox rows %+v, want only the committed order's event %s", rows, id)
	}
	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil || orders != 1 {
		t.Fatalf("%d orders (%v), want 1", orders, err)
	}
	env.CreateTopics(t, ordersv1.OrderPlacedEvent)
	env.Relay(t)
	var got []string
	c := env.NewConsumer(t, "billing")
	if err := ordersv1.HandleOrderPlaced(c, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
		got = append(got, meta.EventID.String()+" "+ev.GetOrderId())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	env.ConsumeUntil(t, c, "billing", 1)
	if len(got) != 1 || got[0] != id.String()+" o-1" {
		t.Fatalf("consumer saw %v, want %s o-1", got, id)
	}
}
