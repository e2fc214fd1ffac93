// Package shipping is the example consumer service: it books a shipment for
// every placed order, exactly once, however often Kafka delivers the event,
// and announces it with a ShipmentCreated event written to its own outbox in
// the same transaction; it cancels the shipment of a cancelled order. One
// service consumer (one group, one dedup name) handles both event types.
package shipping

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	shippingv1 "github.com/protoevents/protoevents/examples/gen/shop/shipping/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// schema holds the service's business table and an append-only log of every
// time the handler's side effect ran, which the demo counts to prove that
// each event was applied exactly once.
const schema = `
CREATE TABLE IF NOT EXISTS shipments (
	shipment_id text PRIMARY KEY,
	order_id    text NOT NULL,
	carrier     text NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE shipments ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'booked';
CREATE TABLE IF NOT EXISTS cancelled_orders (
	order_id     text PRIMARY KEY,
	reason       text NOT NULL,
	cancelled_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shipping_effects (
	event_id   text NOT NULL,
	order_id   text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate creates the shipping tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("shipping: migrate: %w", err)
	}
	return nil
}

// ConsumerName is the dedup scope and consumer group of the service.
const ConsumerName = "shipping"

// Service books shipments.
type Service struct {
	// Unserved lists countries no carrier serves; orders to them fail, and
	// after the retries end in the DLQ until an operator fixes the
	// configuration and redrives them.
	Unserved map[string]bool
	created  *shippingv1.ShipmentCreatedProducer
}

// New returns a Service that announces shipments through w.
func New(w *outbox.Writer, unserved ...string) *Service {
	s := &Service{Unserved: map[string]bool{}, created: shippingv1.NewShipmentCreatedProducer(w)}
	for _, c := range unserved {
		s.Unserved[strings.ToUpper(c)] = true
	}
	return s
}

// HandleOrderPlaced books the shipment of one order inside the consumer's
// dedup transaction. OrderPlaced and OrderCancelled travel on different
// topics, so a cancellation may arrive first: an order already cancelled
// gets no shipment.
func (s *Service) HandleOrderPlaced(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
	if s.Unserved[strings.ToUpper(ev.GetCountry())] {
		return fmt.Errorf("shipping: no carrier serves country %q (order %s)", ev.GetCountry(), ev.GetOrderId())
	}
	var cancelled bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM cancelled_orders WHERE order_id = $1)`, ev.GetOrderId()).Scan(&cancelled); err != nil {
		return fmt.Errorf("shipping: look up cancellation: %w", err)
	}
	if cancelled {
		return nil
	}
	carrier := "parcelco"
	shipmentID := "shp-" + ev.GetOrderId()
	if _, err := tx.Exec(ctx, `INSERT INTO shipments (shipment_id, order_id, carrier) VALUES ($1, $2, $3)`,
		shipmentID, ev.GetOrderId(), carrier); err != nil {
		return fmt.Errorf("shipping: book shipment: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shipping_effects (event_id, order_id) VALUES ($1, $2)`,
		meta.EventID.String(), ev.GetOrderId()); err != nil {
		return fmt.Errorf("shipping: record effect: %w", err)
	}
	_, err := s.created.Publish(ctx, tx, &shippingv1.ShipmentCreated{
		OrderId: ev.GetOrderId(), ShipmentId: shipmentID, Carrier: carrier,
	}, events.CausedBy(meta))
	return err
}

// HandleOrderCancelled cancels the shipment of one order, or records the
// cancellation for an OrderPlaced still to come.
func (s *Service) HandleOrderCancelled(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderCancelled) error {
	if _, err := tx.Exec(ctx, `INSERT INTO cancelled_orders (order_id, reason) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		ev.GetOrderId(), ev.GetReason()); err != nil {
		return fmt.Errorf("shipping: record cancellation: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE shipments SET status = 'cancelled' WHERE order_id = $1 AND status = 'booked'`, ev.GetOrderId()); err != nil {
		return fmt.Errorf("shipping: cancel shipment: %w", err)
	}
	return nil
}

// NewConsumer returns the consumer of the shipping service on pool and
// brokers: one consumer group and dedup name (ConsumerName) for
// OrderPlaced (v1) and OrderCancelled, each with its own DLQ.
func (s *Service) NewConsumer(pool *pgxpool.Pool, brokers []string, opts ...consumer.Option) (*consumer.Consumer, error) {
	c, err := consumer.New(pool, brokers, ConsumerName, opts...)
	if err != nil {
		return nil, err
	}
	if err := ordersv1.HandleOrderPlaced(c, s.HandleOrderPlaced); err != nil {
		return nil, err
	}
	if err := ordersv1.HandleOrderCancelled(c, s.HandleOrderCancelled); err != nil {
		return nil, err
	}
	return c, nil
}
