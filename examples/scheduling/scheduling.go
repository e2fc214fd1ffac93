// Package scheduling is the example shipping scheduler, the last
// participant of the order saga: it books a pickup for a paid order, or
// refuses when no carrier serves the country (and the saga compensates).
package scheduling

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	shippingv1 "github.com/protoevents/protoevents/examples/gen/shop/shipping/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

const schema = `
CREATE TABLE IF NOT EXISTS pickups (
	order_id  text PRIMARY KEY,
	pickup_id text NOT NULL,
	event_id  text NOT NULL
)`

// Migrate creates the scheduler's table.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("scheduling: migrate: %w", err)
	}
	return nil
}

// ConsumerName is the dedup scope and group of the scheduler.
const ConsumerName = "shipping-scheduler"

// Service books pickups.
type Service struct {
	unserved  map[string]bool
	scheduled *shippingv1.ShippingScheduledProducer
	refused   *shippingv1.ShippingRefusedProducer
}

// New returns a Service replying through w; no carrier serves the
// unserved countries.
func New(w *outbox.Writer, unserved ...string) *Service {
	s := &Service{unserved: map[string]bool{}, scheduled: shippingv1.NewShippingScheduledProducer(w), refused: shippingv1.NewShippingRefusedProducer(w)}
	for _, c := range unserved {
		s.unserved[strings.ToUpper(c)] = true
	}
	return s
}

// HandleScheduleShipping books the pickup, or replies ShippingRefused.
func (s *Service) HandleScheduleShipping(ctx context.Context, tx pgx.Tx, meta events.Meta, cmd *shippingv1.ScheduleShipping) error {
	reply := events.CausedBy(meta)
	if s.unserved[strings.ToUpper(cmd.GetCountry())] {
		_, err := s.refused.Publish(ctx, tx, &shippingv1.ShippingRefused{OrderId: cmd.GetOrderId(), Reason: "no carrier serves " + cmd.GetCountry()}, reply)
		return err
	}
	pickup := "pick-" + cmd.GetOrderId()
	if _, err := tx.Exec(ctx, `INSERT INTO pickups (order_id, pickup_id, event_id) VALUES ($1, $2, $3)`, cmd.GetOrderId(), pickup, meta.EventID.String()); err != nil {
		return fmt.Errorf("scheduling: book pickup: %w", err)
	}
	_, err := s.scheduled.Publish(ctx, tx, &shippingv1.ShippingScheduled{OrderId: cmd.GetOrderId(), PickupId: pickup}, reply)
	return err
}

// NewConsumer returns the scheduler's consumer, named ConsumerName, on
// pool and brokers.
func (s *Service) NewConsumer(pool *pgxpool.Pool, brokers []string, opts ...consumer.Option) (*consumer.Consumer, error) {
	c, err := consumer.New(pool, brokers, ConsumerName, opts...)
	if err != nil {
		return nil, err
	}
	if err := shippingv1.HandleScheduleShipping(c, s.HandleScheduleShipping); err != nil {
		return nil, err
	}
	return c, nil
}
