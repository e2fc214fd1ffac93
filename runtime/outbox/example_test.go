package outbox_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// A service writes its business change and the event in one transaction;
// the event is published only if the transaction commits.
func ExampleWriter_Write() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	w, err := outbox.NewWriter(outbox.WithProducer("orders-service"))
	if err != nil {
		log.Fatal(err)
	}
	var placed events.Event // a generated event message, e.g. &ordersv1.OrderPlaced{...}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer) VALUES ($1, $2)`, "o-1", "c-7"); err != nil {
			return err
		}
		_, err := w.Write(ctx, tx, placed, events.WithCorrelationID("checkout-42"))
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// BeginFunc replaces pgx.BeginFunc where a transaction writes events: it
// runs fn in a CommitTx, which holds the outbox rows until the next
// statement or the COMMIT, so an event written last costs no round trip of
// its own: this transaction is three round trips, as the business insert
// alone on pgx.BeginFunc.
func ExampleBeginFunc() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	w, err := outbox.NewWriter(outbox.WithProducer("orders-service"))
	if err != nil {
		log.Fatal(err)
	}
	var placed events.Event // a generated event message, e.g. &ordersv1.OrderPlaced{...}
	err = outbox.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer) VALUES ($1, $2)`, "o-1", "c-7"); err != nil {
			return err
		}
		// Held in tx: inserted by BeginFunc's Commit, in one flight with
		// the COMMIT. A statement sent on tx after it would first send
		// the row, so it sees the row as after any other INSERT.
		_, err := w.Write(ctx, tx, placed)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Any number of relay processes may run against one outbox; they share its
// lanes and keep every key's events in order.
func ExampleRelay_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	r, err := outbox.NewRelay(pool, []string{"localhost:9092"}, outbox.WithBatchSize(500))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // returns nil after Ctrl-C
		log.Fatal(err)
	}
}

// A service on database/sql writes its events in its own *sql.Tx through
// SQLTx; the connection uses pgx's stdlib driver.
func ExampleSQLTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	w, _ := outbox.NewWriter()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ($1)`, "o-1"); err != nil {
		log.Fatal(err)
	}
	var ev events.Event // a generated event, e.g. &ordersv1.OrderPlaced{OrderId: "o-1"}
	if _, err := w.Write(ctx, outbox.SQLTx(tx), ev); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// A Writer with a backlog bound refuses new events while the relay cannot
// publish (Kafka down) for long enough that 100,000 rows wait or one has
// waited ten minutes; the service answers "try later" instead of letting
// the outbox grow without limit. Analytics events are refused sooner, so
// they shed first.
func ExampleWithBacklogPolicy() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	w, err := outbox.NewWriter(outbox.WithBacklogPolicy(outbox.BacklogPolicy{
		Table:  outbox.BacklogBound{MaxPending: 100_000, MaxAge: 10 * time.Minute},
		Topics: map[string]outbox.BacklogBound{"analytics.page-viewed.v1": {MaxPending: 10_000}},
	}))
	if err != nil {
		log.Fatal(err)
	}
	var placed events.Event // a generated event message
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, placed)
		return err
	})
	var backlog *outbox.BacklogError
	if errors.As(err, &backlog) {
		// Nothing was written; what was written before is still published
		// once the relay catches up. Tell the caller to retry (HTTP 503).
		log.Printf("refused: %d rows pending, the oldest %s old", backlog.Pending, backlog.OldestPending)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
}
