// Package payments is the example payments service, a participant of the
// order saga: it charges cards (some are declined) and refunds them, each
// command applied once and answered through its outbox in the same
// transaction.
//
// Refund is the compensation of charge, so it tolerates "never happened":
// refunding an order never charged voids it, and a ChargeCard for that
// order arriving later is declined. A refund can fail for a while (the
// card network is down): the saga retries it, and parks the order when the
// outage outlasts its budget.
package payments

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	paymentsv1 "github.com/protoevents/protoevents/examples/gen/shop/payments/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

const schema = `
CREATE TABLE IF NOT EXISTS payments (
	order_id     text PRIMARY KEY,
	amount_cents bigint NOT NULL,
	status       text NOT NULL -- charged | refunded | void
);
CREATE TABLE IF NOT EXISTS payment_effects (
	seq          bigserial PRIMARY KEY,
	order_id     text NOT NULL,
	action       text NOT NULL, -- charge | refund
	amount_cents bigint NOT NULL,
	event_id     text NOT NULL
)`

// Migrate creates the payments tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	return nil
}

// ConsumerName is the dedup scope of the service's consumers.
const ConsumerName = "payments"

// Service charges and refunds cards.
type Service struct {
	// Declines decides whether the issuer declines a charge.
	Declines func(cmd *paymentsv1.ChargeCard) bool

	mu sync.Mutex
	// refundFailures counts, per order, how many more refunds fail.
	refundFailures map[string]int

	charged  *paymentsv1.CardChargedProducer
	declined *paymentsv1.CardDeclinedProducer
	refunded *paymentsv1.CardRefundedProducer
	failed   *paymentsv1.RefundFailedProducer
}

// New returns a Service replying through w.
func New(w *outbox.Writer) *Service {
	return &Service{
		Declines:       func(*paymentsv1.ChargeCard) bool { return false },
		refundFailures: map[string]int{},
		charged:        paymentsv1.NewCardChargedProducer(w),
		declined:       paymentsv1.NewCardDeclinedProducer(w),
		refunded:       paymentsv1.NewCardRefundedProducer(w),
		failed:         paymentsv1.NewRefundFailedProducer(w),
	}
}

// FailRefunds makes the next n refunds of an order fail (a card-network
// outage for that order); n < 0 fails them until FailRefunds(order, 0).
func (s *Service) FailRefunds(orderID string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refundFailures[orderID] = n
}

func (s *Service) refundFails(orderID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.refundFailures[orderID]
	if n > 0 {
		s.refundFailures[orderID] = n - 1
	}
	return n != 0
}

// HandleChargeCard charges the card, or replies CardDeclined.
func (s *Service) HandleChargeCard(ctx context.Context, tx pgx.Tx, meta events.Meta, cmd *paymentsv1.ChargeCard) error {
	reply := events.CausedBy(meta)
	var status string
	err := tx.QueryRow(ctx, `SELECT status FROM payments WHERE order_id = $1 FOR UPDATE`, cmd.GetOrderId()).Scan(&status)
	switch {
	case err == nil:
		_, err = s.declined.Publish(ctx, tx, &paymentsv1.CardDeclined{OrderId: cmd.GetOrderId(), Reason: "order is " + status}, reply)
		return err
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("payments: read payment: %w", err)
	}
	if s.Declines(cmd) {
		_, err = s.declined.Publish(ctx, tx, &paymentsv1.CardDeclined{OrderId: cmd.GetOrderId(), Reason: "insufficient funds"}, reply)
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount_cents, status) VALUES ($1, $2, 'charged')`, cmd.GetOrderId(), cmd.GetAmountCents()); err != nil {
		return fmt.Errorf("payments: record charge: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO payment_effects (order_id, action, amount_cents, event_id) VALUES ($1, 'charge', $2, $3)`,
		cmd.GetOrderId(), cmd.GetAmountCents(), meta.EventID.String()); err != nil {
		return fmt.Errorf("payments: record effect: %w", err)
	}
	_, err = s.charged.Publish(ctx, tx, &paymentsv1.CardCharged{OrderId: cmd.GetOrderId(), ChargeId: "ch-" + cmd.GetOrderId()}, reply)
	return err
}

// HandleRefundCard refunds an order's charge, voids an order never
// charged, or replies RefundFailed during an outage.
func (s *Service) HandleRefundCard(ctx context.Context, tx pgx.Tx, meta events.Meta, cmd *paymentsv1.RefundCard) error {
	reply := events.CausedBy(meta)
	if s.refundFails(cmd.GetOrderId()) {
		_, err := s.failed.Publish(ctx, tx, &paymentsv1.RefundFailed{OrderId: cmd.GetOrderId(), Reason: "card network unavailable"}, reply)
		return err
	}
	var (
		amount int64
		status string
	)
	err := tx.QueryRow(ctx, `SELECT amount_cents, status FROM payments WHERE order_id = $1 FOR UPDATE`, cmd.GetOrderId()).Scan(&amount, &status)
	refunded := int64(0)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount_cents, status) VALUES ($1, 0, 'void')`, cmd.GetOrderId()); err != nil {
			return fmt.Errorf("payments: void: %w", err)
		}
	case err != nil:
		return fmt.Errorf("payments: read payment: %w", err)
	case status == "charged":
		if _, err := tx.Exec(ctx, `UPDATE payments SET status = 'refunded' WHERE order_id = $1`, cmd.GetOrderId()); err != nil {
			return fmt.Errorf("payments: refund: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payment_effects (order_id, action, amount_cents, event_id) VALUES ($1, 'refund', $2, $3)`,
			cmd.GetOrderId(), amount, meta.EventID.String()); err != nil {
			return fmt.Errorf("payments: record effect: %w", err)
		}
		refunded = amount
	}
	_, err = s.refunded.Publish(ctx, tx, &paymentsv1.CardRefunded{OrderId: cmd.GetOrderId(), RefundedCents: refunded}, reply)
	return err
}

// Consumers returns the service's two consumers (charge and refund) on
// pool and brokers: both named ConsumerName (one dedup scope), each in a
// group of its own (ConsumerName.charge, ConsumerName.refund).
func (s *Service) Consumers(pool *pgxpool.Pool, brokers []string, opts ...consumer.Option) ([]*consumer.Consumer, error) {
	charge, err := consumer.New(pool, brokers, ConsumerName, append(opts[:len(opts):len(opts)], consumer.WithGroupID(ConsumerName+".charge"))...)
	if err != nil {
		return nil, err
	}
	if err := paymentsv1.HandleChargeCard(charge, s.HandleChargeCard); err != nil {
		return nil, err
	}
	refund, err := consumer.New(pool, brokers, ConsumerName, append(opts[:len(opts):len(opts)], consumer.WithGroupID(ConsumerName+".refund"))...)
	if err != nil {
		return nil, err
	}
	if err := paymentsv1.HandleRefundCard(refund, s.HandleRefundCard); err != nil {
		return nil, err
	}
	return []*consumer.Consumer{charge, refund}, nil
}
