package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/pgcluster"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/events"
)

// env is what every measurement shares: one Postgres server and one
// Kafka cluster ($PROTOEVENTS_KAFKA_BROKERS, else in-process), for both
// systems.
type env struct {
	url     string
	walURL  string // the logical server of the WAL measurements (wal.go); "" unless -only has wal
	brokers []string
	stops   []func()
}

func startEnv(ctx context.Context, wal bool) (*env, error) {
	e := &env{url: os.Getenv("PROTOEVENTS_TEST_DATABASE_URL")}
	if e.url == "" {
		pg, err := pgcluster.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("no PROTOEVENTS_TEST_DATABASE_URL and no throwaway Postgres: %w", err)
		}
		e.url = pg.URL
		e.stops = append(e.stops, func() { _ = pg.Stop() })
	}
	// The brokers in PROTOEVENTS_KAFKA_BROKERS (make bench-kafka: a real
	// Apache Kafka node), else in-process.
	k, err := kafkacluster.Start()
	if err != nil {
		e.stop()
		return nil, err
	}
	e.brokers = k.Brokers
	e.stops = append(e.stops, k.Close)
	if wal {
		if err := startLogical(ctx, e); err != nil {
			e.stop()
			return nil, err
		}
	}
	return e, nil
}

// stop stops what startEnv started, last first.
func (e *env) stop() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
}

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// schema is one measurement's own Postgres schema, dropped afterwards, so
// rounds never see each other's tables.
type schema struct {
	name string
	pool *pgxpool.Pool
	url  string
}

func (e *env) newSchema(ctx context.Context, prefix string) (*schema, error) {
	return e.newSchemaOn(ctx, e.url, prefix)
}

// newSchemaOn is newSchema on the server at url.
func (e *env) newSchemaOn(ctx context.Context, url, prefix string) (*schema, error) {
	name := prefix + "_" + suffix()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = name
	cfg.MaxConns = 24
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &schema{name: name, pool: pool, url: url}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, order_id text NOT NULL, customer text NOT NULL,
		amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		s.drop()
		return nil, err
	}
	return s, nil
}

func (s *schema) drop() {
	s.pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s.name}.Sanitize()+" CASCADE")
}

// analyze gathers the statistics of every table in the schema, as
// autovacuum would have by the time a relay meets a backlog, and sets the
// rows' hint bits: each drain starts from a table in the same state
// (the claim-and-mark baseline needs the statistics for its plan).
// checkpointRefused is set once a CHECKPOINT was refused (a role without
// pg_checkpoint or superuser), so the note is printed once.
var checkpointRefused sync.Once

// checkpoint asks Postgres for a checkpoint and waits for it, so that an
// end-to-end run does not share the machine with a checkpoint that the
// earlier phases' write-ahead log started (they write hundreds of
// megabytes; a checkpoint spreads its writes over minutes, and its fsyncs
// and full-page images lengthen commits). Both systems get one before each
// of their runs. Best effort: a role that may not checkpoint gets a note.
func (s *schema) checkpoint(ctx context.Context) {
	if _, err := s.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		checkpointRefused.Do(func() {
			fmt.Fprintf(os.Stderr, "watermill bench: CHECKPOINT refused (%v): end-to-end runs may overlap a checkpoint\n", err)
		})
	}
}

func (s *schema) analyze(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1`, s.name)
	if err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	for _, t := range tables {
		if _, err := s.pool.Exec(ctx, "ANALYZE "+pgx.Identifier{s.name, t}.Sanitize()); err != nil {
			return fmt.Errorf("analyze %s: %w", t, err)
		}
	}
	return nil
}

// insertOrder is the business write both systems' producers make.
func insertOrder(ctx context.Context, tx pgx.Tx, o *ordersv1.OrderPlaced) error {
	_, err := tx.Exec(ctx, `INSERT INTO orders (order_id, customer, amount_cents) VALUES ($1, $2, $3)`, o.OrderId, o.CustomerId, o.TotalCents)
	return err
}

// orderEvent is the generated OrderPlaced event, published on a topic of
// the measurement's own: the descriptor is the generated one with the topic
// changed.
type orderEvent struct {
	*ordersv1.OrderPlaced
	d *events.Descriptor
}

func (e orderEvent) EventDescriptor() *events.Descriptor { return e.d }

func descriptorFor(topic string) *events.Descriptor {
	d := *ordersv1.OrderPlacedEvent
	d.Topic, d.DLQTopic = topic, topic+".dlq"
	dp := &d
	dp.New = func() events.Event { return orderEvent{OrderPlaced: &ordersv1.OrderPlaced{}, d: dp} }
	return dp
}

// order returns the n-th order of a run; its ID is the event key, unique.
func order(n int) *ordersv1.OrderPlaced {
	return &ordersv1.OrderPlaced{
		OrderId:    fmt.Sprintf("o-%d", n),
		CustomerId: fmt.Sprintf("customer-%d", n%100),
		TotalCents: int64(1250 + n),
		Currency:   "EUR",
		Country:    "DE",
		Items:      []*ordersv1.LineItem{{Sku: "sku-1", Quantity: 2}},
	}
}

// orderJSON is the payload Watermill's messages carry: the same event as
// JSON (Watermill has no schema of its own).
func orderJSON(o *ordersv1.OrderPlaced) []byte {
	b, err := protojson.Marshal(o)
	if err != nil {
		panic(err) // a constant message shape: cannot fail
	}
	return b
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
