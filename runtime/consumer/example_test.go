package consumer_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
)

// orderPlaced stands in for a generated event type.
var orderPlaced = &events.Descriptor{Type: "orders.v1.OrderPlaced", Topic: "orders.order-placed.v1", Version: 1}

// A consumer as generated code wires it: migrate the dedup table once,
// register a handler, run until SIGTERM. The handler writes through tx, so its
// effects commit together with the dedup row.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/shipping")
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(pool, []string{"localhost:9092"}, "shipping",
		consumer.WithMaxAttempts(8),
		// Dedup rows outlive the topics' 7 days of retention plus a segment:
		// Run refuses to start if a topic keeps messages longer.
		consumer.WithPruning(time.Hour, 14*24*time.Hour),
		// At most 50 fetched messages wait per partition: a slow handler
		// pauses fetching rather than growing memory.
		consumer.WithFetchLimits(50, 4<<20),
		consumer.WithHooks(consumer.Hooks{
			DeadLettered: func(dl consumer.DeadLetter) {
				log.Printf("ALERT: %s gave up on %s at %s/%d/%d: %v", dl.Consumer, dl.EventID,
					dl.Original.Topic, dl.Original.Partition, dl.Original.Offset, dl.Err)
			},
			Lag: func(topic string, partition int, messages int64, age time.Duration) {
				if age > time.Minute {
					log.Printf("WARN: %s/%d is %d messages, %s behind", topic, partition, messages, age)
				}
			},
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Handle(c, orderPlaced, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_key, event_id) VALUES ($1, $2)`, ev.EventKey(), meta.EventID.String())
		return err
	}); err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Operators list a DLQ and redrive chosen entries once the handler is fixed.
func ExampleRedrive() {
	ctx := context.Background()
	brokers := []string{"localhost:9092"}
	entries, err := consumer.ListDLQ(ctx, brokers, "orders.order-placed.v1.dlq")
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range entries {
		log.Printf("%d/%d %s %s attempts=%d: %s", e.Partition, e.Offset, e.EventType, e.EventID, e.Attempts, e.Error)
	}
	if _, err := consumer.Redrive(ctx, brokers, "orders.order-placed.v1.dlq", consumer.SelectOffsets(0, 17, 18)); err != nil {
		log.Fatal(err)
	}
}

// orderCancelled stands in for a second generated event type.
var orderCancelled = &events.Descriptor{Type: "orders.v1.OrderCancelled", Topic: "orders.order-cancelled.v1", Version: 1}

// One consumer for a service: one group and one dedup name for every event
// type the service handles, a middleware around every handler, and a
// readiness signal. Generated code offers Handle<Event>(c, h) for each
// event.
func ExampleHandle() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/shipping")
	if err != nil {
		log.Fatal(err)
	}
	logEvents := func(next consumer.HandlerFunc) consumer.HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
			err := next(ctx, tx, meta, ev)
			log.Printf("%s %s attempt %d: %v", meta.Type, meta.EventID, meta.Attempt, err)
			return err
		}
	}
	c, err := consumer.New(pool, []string{"localhost:9092"}, "shipping",
		consumer.WithMiddleware(logEvents), consumer.WithDrainTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	book := func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_key) VALUES ($1)`, ev.EventKey())
		return err
	}
	cancel := func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
		_, err := tx.Exec(ctx, `UPDATE shipments SET status = 'cancelled' WHERE order_key = $1`, ev.EventKey())
		return err
	}
	if err := consumer.Handle(c, orderPlaced, book); err != nil {
		log.Fatal(err)
	}
	if err := consumer.Handle(c, orderCancelled, cancel); err != nil {
		log.Fatal(err)
	}
	go func() {
		<-c.Ready()
		log.Printf("consumer %s ready (group %s)", c.Name(), c.GroupID())
	}()
	if err := c.Run(ctx); err != nil {
		log.Fatal(err) // e.g. a *consumer.MissingTopicsError naming the topics to create
	}
}
