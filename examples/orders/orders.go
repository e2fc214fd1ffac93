// Package orders is the example producer service: it places orders, and in
// the same Postgres transaction writes the OrderPlaced events to the
// outbox, so an order never exists without its event, nor an event without
// its order.
//
// It is mid-migration from orders.v1.OrderPlaced to orders.v2.OrderPlaced:
// every order publishes v2 and, side by side, the v1 event down-converted
// from it, until the last v1 consumer has moved.
package orders

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	ordersv2 "github.com/protoevents/protoevents/examples/gen/shop/orders/v2"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// schema is the service's own business table.
const schema = `
CREATE TABLE IF NOT EXISTS orders (
	order_id    text PRIMARY KEY,
	customer_id text NOT NULL,
	total_cents bigint NOT NULL,
	currency    text NOT NULL,
	country     text NOT NULL,
	placed_at   timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE orders ADD COLUMN IF NOT EXISTS cancelled_at timestamptz`

// Migrate creates the orders table.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("orders: migrate: %w", err)
	}
	return nil
}

// Order is a request to place an order.
type Order struct {
	ID         string
	CustomerID string
	TotalCents int64
	Currency   string
	Country    string
	Items      []*ordersv2.LineItem
	// CorrelationID ties the order's events to the request that placed it.
	CorrelationID string
}

// Service places orders.
type Service struct {
	pool      *pgxpool.Pool
	placed    *ordersv2.OrderPlacedProducer
	cancelled *ordersv1.OrderCancelledProducer
}

// New returns a Service writing events through w.
func New(pool *pgxpool.Pool, w *outbox.Writer) *Service {
	return &Service{pool: pool, placed: ordersv2.NewOrderPlacedProducer(w), cancelled: ordersv1.NewOrderCancelledProducer(w)}
}

// ErrDuplicateOrder reports an order ID that was already placed.
var ErrDuplicateOrder = errors.New("orders: order already placed")

// PlaceOrder stores the order and its OrderPlaced events (v2 and v1) in one
// transaction and returns the events' IDs.
func (s *Service) PlaceOrder(ctx context.Context, o Order) ([]events.EventID, error) {
	var ids []events.EventID
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO orders (order_id, customer_id, total_cents, currency, country)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, o.ID, o.CustomerID, o.TotalCents, o.Currency, o.Country)
		if err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrDuplicateOrder
		}
		ev := &ordersv2.OrderPlaced{
			OrderId:  o.ID,
			Customer: &ordersv2.Customer{Id: o.CustomerID, Segment: "retail"},
			Total:    &ordersv2.Money{Currency: o.Currency, Units: o.TotalCents},
			Items:    o.Items,
			Country:  o.Country,
		}
		ids, err = s.placed.PublishWithSuperseded(ctx, tx, ev, DownConvert, events.WithCorrelationID(o.CorrelationID))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("orders: place order %s: %w", o.ID, err)
	}
	return ids, nil
}

// ErrNotCancellable reports an order that does not exist or was already
// cancelled.
var ErrNotCancellable = errors.New("orders: no such order, or already cancelled")

// CancelOrder marks the order cancelled and writes its OrderCancelled event
// in the same transaction, returning the event's ID.
func (s *Service) CancelOrder(ctx context.Context, orderID, reason, by, correlationID string) (events.EventID, error) {
	var id events.EventID
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE orders SET cancelled_at = now() WHERE order_id = $1 AND cancelled_at IS NULL`, orderID)
		if err != nil {
			return fmt.Errorf("update order: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrNotCancellable
		}
		ev := &ordersv1.OrderCancelled{OrderId: orderID, Reason: reason}
		if by != "" {
			ev.CancelledBy = &by
		}
		id, err = s.cancelled.Publish(ctx, tx, ev, events.WithCorrelationID(correlationID))
		return err
	})
	if err != nil {
		return events.EventID{}, fmt.Errorf("orders: cancel order %s: %w", orderID, err)
	}
	return id, nil
}

// DownConvert turns a v2 OrderPlaced into the v1 event that consumers not
// yet migrated read. It is lossless for everything v1 knows about.
func DownConvert(v2 *ordersv2.OrderPlaced) (*ordersv1.OrderPlaced, error) {
	if v2.GetTotal() == nil {
		return nil, errors.New("orders: down-convert: v2 OrderPlaced has no total")
	}
	v1 := &ordersv1.OrderPlaced{
		OrderId:    v2.GetOrderId(),
		CustomerId: v2.GetCustomer().GetId(),
		TotalCents: v2.GetTotal().GetUnits(),
		Currency:   v2.GetTotal().GetCurrency(),
		Country:    v2.GetCountry(),
	}
	for _, it := range v2.GetItems() {
		v1.Items = append(v1.Items, &ordersv1.LineItem{Sku: it.GetSku(), Quantity: it.GetQuantity()})
	}
	return v1, nil
}
