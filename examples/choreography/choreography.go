// Package choreography is the order flow of examples/ordersaga without an
// orchestrator: each service reacts to the others' typed events and
// publishes its own, through its outbox, in the transaction of its change.
//
//	orders    → OrderPlaced
//	stock     OrderPlaced       → reserve → StockReserved | StockUnavailable
//	payments  StockReserved     → charge  → CardCharged | CardDeclined
//	shipping  CardCharged       → book    → ShippingScheduled | ShippingRefused
//	stock     CardDeclined, ShippingRefused → release
//	payments  ShippingRefused   → refund
//	orders    ShippingScheduled → confirmed; StockUnavailable, CardDeclined, ShippingRefused → cancelled
//
// Every hop is an idempotent consumer plus an outbox write, so each step
// has the orchestrated saga's crash guarantees. What is missing is a place
// that knows the flow: payments and shipping keep their own copy of the
// order (from OrderPlaced) because the event that triggers them does not
// carry what they need, and must wait when the trigger overtakes the copy
// (another topic, no order between them); every new failure case adds
// subscriptions in several services; no one times a step out; and the path
// of one order is reassembled from correlation IDs. See docs/sagas.md,
// "Choreography: the same flow without an orchestrator", for when to
// prefer which.
package choreography

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	paymentsv1 "github.com/protoevents/protoevents/examples/gen/shop/payments/v1"
	shippingv1 "github.com/protoevents/protoevents/examples/gen/shop/shipping/v1"
	stockv1 "github.com/protoevents/protoevents/examples/gen/shop/stock/v1"
	"github.com/protoevents/protoevents/examples/payments"
	"github.com/protoevents/protoevents/examples/scheduling"
	"github.com/protoevents/protoevents/examples/stock"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// schema: the orders service's status table and the copies of the order
// that payments and shipping keep (each service would keep its own in its
// own database).
const schema = `
CREATE TABLE IF NOT EXISTS choreo_orders (
	order_id text PRIMARY KEY,
	status   text NOT NULL -- pending | confirmed | cancelled
);
CREATE TABLE IF NOT EXISTS choreo_payment_orders (
	order_id text PRIMARY KEY, customer_id text NOT NULL, amount_cents bigint NOT NULL, currency text NOT NULL
);
CREATE TABLE IF NOT EXISTS choreo_shipping_orders (
	order_id text PRIMARY KEY, country text NOT NULL
)`

// Migrate creates the tables of the flow and of the participating services.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("choreography: migrate: %w", err)
	}
	for _, m := range []func(context.Context, *pgxpool.Pool) error{stock.Migrate, payments.Migrate, scheduling.Migrate} {
		if err := m(ctx, pool); err != nil {
			return err
		}
	}
	return nil
}

// Flow is the four services, reacting to each other.
type Flow struct {
	pool     *pgxpool.Pool
	placed   *ordersv1.OrderPlacedProducer
	Stock    *stock.Service
	Payments *payments.Service
	Shipping *scheduling.Service
}

// New returns the flow writing every event through w.
func New(pool *pgxpool.Pool, w *outbox.Writer, unserved ...string) *Flow {
	return &Flow{pool: pool, placed: ordersv1.NewOrderPlacedProducer(w), Stock: stock.New(w), Payments: payments.New(w), Shipping: scheduling.New(w, unserved...)}
}

// PlaceOrder is the orders service: the order row and OrderPlaced, in one
// transaction. Everything else follows from the event.
func (f *Flow) PlaceOrder(ctx context.Context, o *ordersv1.OrderPlaced) error {
	return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO choreo_orders (order_id, status) VALUES ($1, 'pending')`, o.GetOrderId()); err != nil {
			return err
		}
		_, err := f.placed.Publish(ctx, tx, o, events.WithCorrelationID(o.GetOrderId()))
		return err
	})
}

// errNotYet makes the consumer retry an event that overtook the one it
// depends on.
var errNotYet = errors.New("choreography: the order's OrderPlaced has not arrived here yet; retrying")

func (f *Flow) stockOnOrderPlaced(ctx context.Context, tx pgx.Tx, m events.Meta, ev *ordersv1.OrderPlaced) error {
	item := ev.GetItems()[0]
	return f.Stock.HandleReserveStock(ctx, tx, m, &stockv1.ReserveStock{OrderId: ev.GetOrderId(), Sku: item.GetSku(), Quantity: item.GetQuantity()})
}

func (f *Flow) stockOnCardDeclined(ctx context.Context, tx pgx.Tx, m events.Meta, ev *paymentsv1.CardDeclined) error {
	return f.Stock.HandleReleaseStock(ctx, tx, m, &stockv1.ReleaseStock{OrderId: ev.GetOrderId()})
}

func (f *Flow) stockOnShippingRefused(ctx context.Context, tx pgx.Tx, m events.Meta, ev *shippingv1.ShippingRefused) error {
	return f.Stock.HandleReleaseStock(ctx, tx, m, &stockv1.ReleaseStock{OrderId: ev.GetOrderId()})
}

func (f *Flow) paymentsOnOrderPlaced(ctx context.Context, tx pgx.Tx, _ events.Meta, ev *ordersv1.OrderPlaced) error {
	_, err := tx.Exec(ctx, `INSERT INTO choreo_payment_orders VALUES ($1, $2, $3, $4)`, ev.GetOrderId(), ev.GetCustomerId(), ev.GetTotalCents(), ev.GetCurrency())
	return err
}

func (f *Flow) paymentsOnStockReserved(ctx context.Context, tx pgx.Tx, m events.Meta, ev *stockv1.StockReserved) error {
	c := &paymentsv1.ChargeCard{OrderId: ev.GetOrderId()}
	err := tx.QueryRow(ctx, `SELECT customer_id, amount_cents, currency FROM choreo_payment_orders WHERE order_id = $1`, ev.GetOrderId()).Scan(&c.CustomerId, &c.AmountCents, &c.Currency)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotYet
	}
	if err != nil {
		return err
	}
	return f.Payments.HandleChargeCard(ctx, tx, m, c)
}

func (f *Flow) paymentsOnShippingRefused(ctx context.Context, tx pgx.Tx, m events.Meta, ev *shippingv1.ShippingRefused) error {
	return f.Payments.HandleRefundCard(ctx, tx, m, &paymentsv1.RefundCard{OrderId: ev.GetOrderId()})
}

func (f *Flow) shippingOnOrderPlaced(ctx context.Context, tx pgx.Tx, _ events.Meta, ev *ordersv1.OrderPlaced) error {
	_, err := tx.Exec(ctx, `INSERT INTO choreo_shipping_orders VALUES ($1, $2)`, ev.GetOrderId(), ev.GetCountry())
	return err
}

func (f *Flow) shippingOnCardCharged(ctx context.Context, tx pgx.Tx, m events.Meta, ev *paymentsv1.CardCharged) error {
	var country string
	err := tx.QueryRow(ctx, `SELECT country FROM choreo_shipping_orders WHERE order_id = $1`, ev.GetOrderId()).Scan(&country)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotYet
	}
	if err != nil {
		return err
	}
	return f.Shipping.HandleScheduleShipping(ctx, tx, m, &shippingv1.ScheduleShipping{OrderId: ev.GetOrderId(), Country: country})
}

// status is the orders service's reaction to the flow's last events.
func status[E interface{ GetOrderId() string }](s string) func(ctx context.Context, tx pgx.Tx, _ events.Meta, ev E) error {
	return func(ctx context.Context, tx pgx.Tx, _ events.Meta, ev E) error {
		_, err := tx.Exec(ctx, `UPDATE choreo_orders SET status = $2 WHERE order_id = $1 AND status = 'pending'`, ev.GetOrderId(), s)
		return err
	}
}

// Consumers returns every subscription of the flow: one consumer per
// service (its own group and dedup name, "choreo-<service>"), twelve
// handlers in all.
func (f *Flow) Consumers(brokers []string, opts ...consumer.Option) ([]*consumer.Consumer, error) {
	var errs []error
	service := func(name string) *consumer.Consumer {
		c, err := consumer.New(f.pool, brokers, "choreo-"+name, opts...)
		errs = append(errs, err)
		return c
	}
	stock, payments, shipping, orders := service("stock"), service("payments"), service("shipping"), service("orders")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	err := errors.Join(
		ordersv1.HandleOrderPlaced(stock, f.stockOnOrderPlaced),
		paymentsv1.HandleCardDeclined(stock, f.stockOnCardDeclined),
		shippingv1.HandleShippingRefused(stock, f.stockOnShippingRefused),
		ordersv1.HandleOrderPlaced(payments, f.paymentsOnOrderPlaced),
		stockv1.HandleStockReserved(payments, f.paymentsOnStockReserved),
		shippingv1.HandleShippingRefused(payments, f.paymentsOnShippingRefused),
		ordersv1.HandleOrderPlaced(shipping, f.shippingOnOrderPlaced),
		paymentsv1.HandleCardCharged(shipping, f.shippingOnCardCharged),
		shippingv1.HandleShippingScheduled(orders, status[*shippingv1.ShippingScheduled]("confirmed")),
		stockv1.HandleStockUnavailable(orders, status[*stockv1.StockUnavailable]("cancelled")),
		paymentsv1.HandleCardDeclined(orders, status[*paymentsv1.CardDeclined]("cancelled")),
		shippingv1.HandleShippingRefused(orders, status[*shippingv1.ShippingRefused]("cancelled")),
	)
	if err != nil {
		return nil, err
	}
	return []*consumer.Consumer{stock, payments, shipping, orders}, nil
}
