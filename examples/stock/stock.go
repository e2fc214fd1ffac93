// Package stock is the example stock service, a participant of the order
// saga: it reserves units for an order and releases them again, each
// command applied once (idempotent consumer) and answered through its
// outbox in the same transaction.
//
// Release is the compensation of reserve, so it tolerates "never
// happened": releasing an order with no reservation leaves a tombstone, and
// a ReserveStock for that order arriving later (the saga timed out waiting
// and gave up) is refused.
package stock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	stockv1 "github.com/protoevents/protoevents/examples/gen/shop/stock/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// schema: stock levels, one reservation row per order, and an append-only
// log of every applied effect the demo counts.
const schema = `
CREATE TABLE IF NOT EXISTS stock_levels (
	sku     text PRIMARY KEY,
	on_hand bigint NOT NULL CHECK (on_hand >= 0)
);
CREATE TABLE IF NOT EXISTS stock_reservations (
	order_id text PRIMARY KEY,
	sku      text NOT NULL,
	quantity bigint NOT NULL,
	status   text NOT NULL -- reserved | released | tombstone
);
CREATE TABLE IF NOT EXISTS stock_effects (
	seq      bigserial PRIMARY KEY,
	order_id text NOT NULL,
	action   text NOT NULL, -- reserve | release
	quantity bigint NOT NULL,
	event_id text NOT NULL
)`

// Migrate creates the stock tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("stock: migrate: %w", err)
	}
	return nil
}

// Fill puts units of a SKU on the shelf.
func Fill(ctx context.Context, pool *pgxpool.Pool, sku string, units int64) error {
	_, err := pool.Exec(ctx, `INSERT INTO stock_levels (sku, on_hand) VALUES ($1, $2)
		ON CONFLICT (sku) DO UPDATE SET on_hand = stock_levels.on_hand + EXCLUDED.on_hand`, sku, units)
	if err != nil {
		return fmt.Errorf("stock: fill %s: %w", sku, err)
	}
	return nil
}

// ConsumerName is the dedup scope of the service's consumers.
const ConsumerName = "stock"

// Service reserves and releases stock.
type Service struct {
	reserved    *stockv1.StockReservedProducer
	unavailable *stockv1.StockUnavailableProducer
	released    *stockv1.StockReleasedProducer
}

// New returns a Service replying through w.
func New(w *outbox.Writer) *Service {
	return &Service{
		reserved:    stockv1.NewStockReservedProducer(w),
		unavailable: stockv1.NewStockUnavailableProducer(w),
		released:    stockv1.NewStockReleasedProducer(w),
	}
}

// HandleReserveStock reserves the units, or replies StockUnavailable when
// the shelf is short or the order was released already.
func (s *Service) HandleReserveStock(ctx context.Context, tx pgx.Tx, meta events.Meta, cmd *stockv1.ReserveStock) error {
	reply := events.CausedBy(meta)
	var status string
	err := tx.QueryRow(ctx, `SELECT status FROM stock_reservations WHERE order_id = $1 FOR UPDATE`, cmd.GetOrderId()).Scan(&status)
	switch {
	case err == nil && status == "tombstone" || err == nil && status == "released":
		_, err = s.unavailable.Publish(ctx, tx, &stockv1.StockUnavailable{OrderId: cmd.GetOrderId(), Reason: "order already released"}, reply)
		return err
	case err == nil:
		return fmt.Errorf("stock: order %s reserved twice by different commands", cmd.GetOrderId())
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("stock: read reservation: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE stock_levels SET on_hand = on_hand - $2 WHERE sku = $1 AND on_hand >= $2`, cmd.GetSku(), int64(cmd.GetQuantity()))
	if err != nil {
		return fmt.Errorf("stock: take units: %w", err)
	}
	if tag.RowsAffected() == 0 {
		_, err = s.unavailable.Publish(ctx, tx, &stockv1.StockUnavailable{OrderId: cmd.GetOrderId(), Reason: "out of stock: " + cmd.GetSku()}, reply)
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO stock_reservations (order_id, sku, quantity, status) VALUES ($1, $2, $3, 'reserved')`,
		cmd.GetOrderId(), cmd.GetSku(), int64(cmd.GetQuantity())); err != nil {
		return fmt.Errorf("stock: record reservation: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO stock_effects (order_id, action, quantity, event_id) VALUES ($1, 'reserve', $2, $3)`,
		cmd.GetOrderId(), int64(cmd.GetQuantity()), meta.EventID.String()); err != nil {
		return fmt.Errorf("stock: record effect: %w", err)
	}
	_, err = s.reserved.Publish(ctx, tx, &stockv1.StockReserved{OrderId: cmd.GetOrderId(), ReservationId: "res-" + cmd.GetOrderId()}, reply)
	return err
}

// HandleReleaseStock puts an order's reserved units back; for an order
// with no reservation it leaves a tombstone. It always replies
// StockReleased.
func (s *Service) HandleReleaseStock(ctx context.Context, tx pgx.Tx, meta events.Meta, cmd *stockv1.ReleaseStock) error {
	var (
		sku      string
		quantity int64
		status   string
	)
	err := tx.QueryRow(ctx, `SELECT sku, quantity, status FROM stock_reservations WHERE order_id = $1 FOR UPDATE`, cmd.GetOrderId()).Scan(&sku, &quantity, &status)
	released := int64(0)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := tx.Exec(ctx, `INSERT INTO stock_reservations (order_id, sku, quantity, status) VALUES ($1, '', 0, 'tombstone')`, cmd.GetOrderId()); err != nil {
			return fmt.Errorf("stock: tombstone: %w", err)
		}
	case err != nil:
		return fmt.Errorf("stock: read reservation: %w", err)
	case status == "reserved":
		if _, err := tx.Exec(ctx, `UPDATE stock_levels SET on_hand = on_hand + $2 WHERE sku = $1`, sku, quantity); err != nil {
			return fmt.Errorf("stock: put back: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE stock_reservations SET status = 'released' WHERE order_id = $1`, cmd.GetOrderId()); err != nil {
			return fmt.Errorf("stock: release: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO stock_effects (order_id, action, quantity, event_id) VALUES ($1, 'release', $2, $3)`,
			cmd.GetOrderId(), quantity, meta.EventID.String()); err != nil {
			return fmt.Errorf("stock: record effect: %w", err)
		}
		released = quantity
	}
	_, err = s.released.Publish(ctx, tx, &stockv1.StockReleased{OrderId: cmd.GetOrderId(), ReleasedQuantity: uint32(released)}, events.CausedBy(meta))
	return err
}

// Consumers returns the service's two consumers (reserve and release) on
// pool and brokers: both named ConsumerName (one dedup scope), each in a
// group of its own (ConsumerName.reserve, ConsumerName.release).
func (s *Service) Consumers(pool *pgxpool.Pool, brokers []string, opts ...consumer.Option) ([]*consumer.Consumer, error) {
	reserve, err := consumer.New(pool, brokers, ConsumerName, append(opts[:len(opts):len(opts)], consumer.WithGroupID(ConsumerName+".reserve"))...)
	if err != nil {
		return nil, err
	}
	if err := stockv1.HandleReserveStock(reserve, s.HandleReserveStock); err != nil {
		return nil, err
	}
	release, err := consumer.New(pool, brokers, ConsumerName, append(opts[:len(opts):len(opts)], consumer.WithGroupID(ConsumerName+".release"))...)
	if err != nil {
		return nil, err
	}
	if err := stockv1.HandleReleaseStock(release, s.HandleReleaseStock); err != nil {
		return nil, err
	}
	return []*consumer.Consumer{reserve, release}, nil
}
