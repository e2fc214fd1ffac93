package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// The raw write variants put the floor under ours: the same outbox row
// (table, INSERT, lane expression, a value of the envelope's size) written
// with pgx alone, no protoevents code. raw-plain sends the INSERT on a plain
// pgx.Tx, a round trip of its own, as ours-plain does; raw-batch sends it
// with the COMMIT in one pgx.Batch, as a CommitTx does. What ours costs
// above them is our code; what they cost above bare is pgx and Postgres.

// rawInsert is the Writer's INSERT on a table of outbox.DefaultLanes lanes.
var rawInsert = fmt.Sprintf(`INSERT INTO outbox (event_id, event_type, topic, key, value, headers, lane)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, (hashtext(encode($4::bytea, 'hex')) & 2147483647) %% %d)`, outbox.DefaultLanes)

// rawValue stands for the encoded envelope: the JSON envelope of the demo's
// OrderPlaced is 450 bytes (BenchmarkWireSize).
var rawValue = make([]byte, 450)

const rawHeaders = `[["content-type","application/json"]]`

func rawArgs(topic string, o *ordersv1.OrderPlaced) []any {
	return []any{ulid.Make().String(), "shop.orders.v1.OrderPlaced", topic, []byte(o.OrderId), rawValue, rawHeaders}
}

// rawRoundTrip is raw-roundtrip's publish: a SELECT 1 on the plain
// transaction, no row and no message. It is the floor under any event
// written by a statement of its own on a plain pgx.Tx: one more round trip
// and nothing else.
func rawRoundTrip(ctx context.Context, tx pgx.Tx, _ *ordersv1.OrderPlaced) error {
	_, err := tx.Exec(ctx, "SELECT 1")
	return err
}

// rawPlain is raw-plain's publish: the INSERT at once.
func rawPlain(topic string) publishFunc {
	return func(ctx context.Context, tx pgx.Tx, o *ordersv1.OrderPlaced) error {
		_, err := tx.Exec(ctx, rawInsert, rawArgs(topic, o)...)
		return err
	}
}

// rawBatchTx holds raw-batch's statements until its COMMIT.
type rawBatchTx struct {
	pgx.Tx
	held []rawHeld
}

// rawHeld is one held statement.
type rawHeld struct {
	sql  string
	args []any
}

// rawBatchHold is raw-batch's publish: the row waits for the COMMIT.
func rawBatchHold(topic string) publishFunc {
	return func(_ context.Context, tx pgx.Tx, o *ordersv1.OrderPlaced) error {
		rt, ok := tx.(*rawBatchTx)
		if !ok {
			return fmt.Errorf("raw-batch: publish on a %T, not its own transaction", tx)
		}
		rt.held = append(rt.held, rawHeld{sql: rawInsert, args: rawArgs(topic, o)})
		return nil
	}
}

// rawBatchBegin is raw-batch's transaction: pgx's BEGIN, fn, then the held
// INSERTs and the COMMIT in one batch.
func rawBatchBegin(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	tx, err := c.Begin(ctx)
	if err != nil {
		return err
	}
	rt := &rawBatchTx{Tx: tx}
	if err := fn(rt); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	var b pgx.Batch
	for _, h := range rt.held {
		b.Queue(h.sql, h.args...)
	}
	b.Queue("COMMIT")
	if err := c.SendBatch(ctx, &b).Close(); err != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("raw-batch: commit: %w", err)
	}
	return nil
}
