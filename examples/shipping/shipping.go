// Package shipping is the example consumer service: it books a shipment for
// every placed order, exactly once, however often Kafka delivers the event,
// and announces it with a ShipmentCreated event written to its own outbox in
// the same transaction.
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
// dedup transaction.
func (s *Service) HandleOrderPlaced(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
	if s.Unserved[strings.ToUpper(ev.GetCountry())] {
		return fmt.Errorf("shipping: no carrier serves country %q (order %s)", ev.GetCountry(), ev.GetOrderId())
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

// NewConsumer returns the OrderPlaced (v1) consumer of the service.
func (s *Service) NewConsumer(cfg consumer.Config, opts ...consumer.Option) (*consumer.Consumer, error) {
	if cfg.Name == "" {
		cfg.Name = ConsumerName
	}
	return ordersv1.NewOrderPlacedConsumer(cfg, s.HandleOrderPlaced, opts...)
}
