// Package ordersaga is the example orchestrator: the order saga that
// reserves stock, charges the card (sometimes declined) and schedules
// shipping, releasing the stock and refunding the card when a later step
// fails. It runs in the orders service and keeps its own order status
// with local steps.
package ordersaga

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	paymentsv1 "github.com/protoevents/protoevents/examples/gen/shop/payments/v1"
	shippingv1 "github.com/protoevents/protoevents/examples/gen/shop/shipping/v1"
	stockv1 "github.com/protoevents/protoevents/examples/gen/shop/stock/v1"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/saga"
)

// Name is the saga type.
const Name = "order"

// Order is the saga's data: what the steps' commands are built from, and
// what the replies told it.
type Order struct {
	ID          string `json:"id"`
	CustomerID  string `json:"customer_id"`
	SKU         string `json:"sku"`
	Quantity    uint32 `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Country     string `json:"country"`

	ReservationID string `json:"reservation_id,omitempty"`
	ChargeID      string `json:"charge_id,omitempty"`
	PickupID      string `json:"pickup_id,omitempty"`
}

// schema is the orchestrator's own table: the order's status as the
// customer sees it (pending while the saga runs).
const schema = `
CREATE TABLE IF NOT EXISTS saga_orders (
	order_id   text PRIMARY KEY,
	status     text NOT NULL, -- pending | confirmed | cancelled
	updated_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate creates the orchestrator's tables: its order table and the saga
// tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("ordersaga: migrate: %w", err)
	}
	return saga.Migrate(ctx, pool)
}

// Definition returns the order saga; chargeTimeout bounds the wait for the
// payments service (0: wait forever).
func Definition(chargeTimeout time.Duration) saga.Definition[Order] {
	setStatus := func(status string) func(ctx context.Context, tx pgx.Tx, id string, o *Order) error {
		return func(ctx context.Context, tx pgx.Tx, id string, o *Order) error {
			_, err := tx.Exec(ctx, `INSERT INTO saga_orders (order_id, status) VALUES ($1, $2)
				ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status, updated_at = now()`, o.ID, status)
			return err
		}
	}
	return saga.Definition[Order]{
		Name: Name,
		Steps: []saga.Step[Order]{
			{
				Name: "open-order",
				Local: func(ctx context.Context, tx pgx.Tx, id string, o *Order) (saga.Outcome, error) {
					return saga.Success(), setStatus("pending")(ctx, tx, id, o)
				},
				CompensateLocal: setStatus("cancelled"),
			},
			{
				Name: "reserve-stock",
				Command: func(o *Order) events.Event {
					return &stockv1.ReserveStock{OrderId: o.ID, Sku: o.SKU, Quantity: o.Quantity}
				},
				OnReply: []saga.Reply[Order]{
					saga.Succeeds(stockv1.StockReservedEvent, func(o *Order, r *stockv1.StockReserved) { o.ReservationID = r.GetReservationId() }),
					saga.Fails(stockv1.StockUnavailableEvent, func(o *Order, r *stockv1.StockUnavailable) string { return r.GetReason() }),
				},
				Compensation: func(o *Order) events.Event { return &stockv1.ReleaseStock{OrderId: o.ID} },
				OnCompensationReply: []saga.Reply[Order]{
					saga.Succeeds[Order, *stockv1.StockReleased](stockv1.StockReleasedEvent, nil),
				},
			},
			{
				Name: "charge-card",
				Command: func(o *Order) events.Event {
					return &paymentsv1.ChargeCard{OrderId: o.ID, CustomerId: o.CustomerID, AmountCents: o.AmountCents, Currency: o.Currency}
				},
				OnReply: []saga.Reply[Order]{
					saga.Succeeds(paymentsv1.CardChargedEvent, func(o *Order, r *paymentsv1.CardCharged) { o.ChargeID = r.GetChargeId() }),
					saga.Fails(paymentsv1.CardDeclinedEvent, func(o *Order, r *paymentsv1.CardDeclined) string { return "card declined: " + r.GetReason() }),
				},
				Timeout:      chargeTimeout,
				Compensation: func(o *Order) events.Event { return &paymentsv1.RefundCard{OrderId: o.ID} },
				OnCompensationReply: []saga.Reply[Order]{
					saga.Succeeds[Order, *paymentsv1.CardRefunded](paymentsv1.CardRefundedEvent, nil),
					saga.Fails(paymentsv1.RefundFailedEvent, func(o *Order, r *paymentsv1.RefundFailed) string { return r.GetReason() }),
				},
			},
			{
				Name: "schedule-shipping",
				Command: func(o *Order) events.Event {
					return &shippingv1.ScheduleShipping{OrderId: o.ID, Country: o.Country}
				},
				OnReply: []saga.Reply[Order]{
					saga.Succeeds(shippingv1.ShippingScheduledEvent, func(o *Order, r *shippingv1.ShippingScheduled) { o.PickupID = r.GetPickupId() }),
					saga.Fails(shippingv1.ShippingRefusedEvent, func(o *Order, r *shippingv1.ShippingRefused) string { return r.GetReason() }),
				},
			},
			{
				Name: "confirm-order",
				Local: func(ctx context.Context, tx pgx.Tx, id string, o *Order) (saga.Outcome, error) {
					return saga.Success(), setStatus("confirmed")(ctx, tx, id, o)
				},
			},
		},
	}
}

// Orchestrator places orders by starting their sagas.
type Orchestrator struct {
	pool *pgxpool.Pool
	// Saga is the order saga: run it (Run) to drive the orders.
	Saga *saga.Saga[Order]
}

// New returns the orchestrator writing commands through w.
func New(pool *pgxpool.Pool, w *outbox.Writer, chargeTimeout time.Duration, opts ...saga.Option) (*Orchestrator, error) {
	sg, err := saga.New(Definition(chargeTimeout), w, opts...)
	if err != nil {
		return nil, err
	}
	return &Orchestrator{pool: pool, Saga: sg}, nil
}

// Place starts the order's saga, whose ID is the order ID, in one
// transaction.
func (o *Orchestrator) Place(ctx context.Context, order Order) error {
	return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		return o.Saga.Start(ctx, tx, order.ID, order)
	})
}

// Events lists the events of the saga's participants, for topic
// provisioning.
func Events() []*events.Descriptor {
	return append(append(append([]*events.Descriptor{}, stockv1.StockEvents...), paymentsv1.PaymentsEvents...), shippingv1.SchedulingEvents...)
}
