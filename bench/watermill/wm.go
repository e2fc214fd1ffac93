package main

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protojson"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
)

// Watermill's configuration, as a user tuning it for this workload would
// set it (see README.md beside this file):
const (
	// wmBatch is the SQL subscriber's SubscribeBatchSize: rows read per
	// query (default 100).
	wmBatch = 500
	// wmPoll is the SQL subscriber's PollInterval when the table is empty
	// (default 1s, far too slow for the latency measurements).
	wmPoll = 10 * time.Millisecond
)

var wmLogger = watermill.NopLogger{}

// wm is Watermill on one schema: a forwarder topic (its SQL table) in the
// same database as the orders.
type wm struct {
	s        *schema
	fwdTopic string
	schema   wmsql.DefaultPostgreSQLSchema
}

func newWM(ctx context.Context, s *schema) (*wm, error) {
	w := &wm{s: s, fwdTopic: "fwd_" + suffix(), schema: wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: wmBatch}}
	// Publishers in the user's transaction may not create the table (CREATE
	// TABLE would commit it): create it up front, as a deployment would.
	qs, err := w.schema.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: w.fwdTopic})
	if err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, q := range qs {
			if _, err := tx.Exec(ctx, q.Query, q.Args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("watermill: initialize schema: %w", err)
	}
	return w, nil
}

// withWM runs fn on Watermill in a schema of its own (named after prefix),
// dropped afterwards.
func (e *env) withWM(ctx context.Context, prefix string, fn func(*wm) error) error {
	return e.withWMOn(ctx, e.url, prefix, fn)
}

// withWMOn is withWM on the server at url.
func (e *env) withWMOn(ctx context.Context, url, prefix string, fn func(*wm) error) error {
	s, err := e.newSchemaOn(ctx, url, prefix)
	if err != nil {
		return err
	}
	defer s.drop()
	w, err := newWM(ctx, s)
	if err != nil {
		return err
	}
	return fn(w)
}

// message builds the Watermill message of an order: JSON payload, the key
// in the metadata for the partitioning marshaler.
func wmMessage(o *ordersv1.OrderPlaced) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), orderJSON(o))
	m.Metadata.Set("key", o.OrderId)
	return m
}

// publish is the documented transactional outbox with Watermill: a SQL
// publisher on the user's transaction, wrapped by the forwarder's
// publisher, which records the destination topic in an envelope.
func (w *wm) publish(ctx context.Context, tx pgx.Tx, topic string, o *ordersv1.OrderPlaced) error {
	p, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: w.schema}, wmLogger)
	if err != nil {
		return err
	}
	return forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: w.fwdTopic}).Publish(topic, wmMessage(o))
}

// prefill writes n messages for topic, 1000 per INSERT.
func (w *wm) prefill(ctx context.Context, topic string, n int) error {
	p, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(w.s.pool), wmsql.PublisherConfig{SchemaAdapter: w.schema}, wmLogger)
	if err != nil {
		return err
	}
	fp := forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: w.fwdTopic})
	for i := 0; i < n; i += 1000 {
		msgs := make([]*message.Message, 0, 1000)
		for j := i; j < min(i+1000, n); j++ {
			msgs = append(msgs, wmMessage(order(j)))
		}
		if err := fp.Publish(topic, msgs...); err != nil {
			return fmt.Errorf("watermill prefill: %w", err)
		}
	}
	return nil
}

// saramaProducer is a synchronous producer with acks=all, as the outbox
// guarantee needs (the default is acks=1).
func saramaProducer() *sarama.Config {
	c := wmkafka.DefaultSaramaSyncPublisherConfig()
	c.Version = sarama.V2_1_0_0
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Backoff = 10 * time.Millisecond
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	return c
}

func wmKafkaPublisher(brokers []string) (*wmkafka.Publisher, error) {
	return wmkafka.NewPublisher(wmkafka.PublisherConfig{
		Brokers:               brokers,
		Marshaler:             wmkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) { return m.Metadata.Get("key"), nil }),
		OverwriteSaramaConfig: saramaProducer(),
	}, wmLogger)
}

// startForwarder runs Watermill's Forwarder: the SQL subscriber on the
// forwarder topic, each message unwrapped and sent with the Kafka
// publisher; p counts the messages whose publish returned and records
// when the first one was in hand.
func (w *wm) startForwarder(brokers []string, p *progress) (stop func() error, err error) {
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(w.s.pool), wmsql.SubscriberConfig{
		SchemaAdapter:    w.schema,
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		PollInterval:     wmPoll,
		ResendInterval:   10 * time.Millisecond,
		RetryInterval:    10 * time.Millisecond,
		InitializeSchema: true,
	}, wmLogger)
	if err != nil {
		return nil, err
	}
	pub, err := wmKafkaPublisher(brokers)
	if err != nil {
		return nil, err
	}
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			p.markReady() // set up: its first message is in hand
			out, err := h(m)
			if err == nil {
				p.delivered.Add(1)
			}
			return out, err
		}
	}
	f, err := forwarder.NewForwarder(sub, pub, wmLogger, forwarder.Config{
		ForwarderTopic: w.fwdTopic,
		Middlewares:    []message.HandlerMiddleware{count},
		CloseTimeout:   5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	stopRun := runUntilStopped(f.Run)
	return func() error {
		err := stopRun()
		_ = f.Close()
		_ = pub.Close()
		return err
	}, nil
}

// drain measures how fast the Forwarder empties a table of n messages.
func (w *wm) drain(ctx context.Context, brokers []string, n int) (drainResult, error) {
	topic := "wm-drain-" + suffix()
	if err := createTopics(ctx, brokers, topic); err != nil {
		return drainResult{}, err
	}
	if err := w.prefill(ctx, topic, n); err != nil {
		return drainResult{}, err
	}
	if err := w.s.analyze(ctx); err != nil {
		return drainResult{}, err
	}
	return timeDrain(ctx, brokers, topic, n, "watermill forwarder", 5*time.Minute,
		func(p *progress) (func() error, error) { return w.startForwarder(brokers, p) })
}

// consume measures a Watermill router on the Kafka subscriber with the
// hand-written deduplication a user writes: in one transaction, insert the
// message UUID (ON CONFLICT DO NOTHING) and, if new, the business row; ack
// after commit. n messages are produced first; events/s from the first
// handled message to the last.
func (w *wm) consume(ctx context.Context, brokers []string, n int) (float64, error) {
	if _, err := w.s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS wm_processed (consumer text NOT NULL, message_uuid text NOT NULL,
		processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, message_uuid));
		CREATE TABLE IF NOT EXISTS wm_seen (order_id text PRIMARY KEY, amount_cents bigint NOT NULL)`); err != nil {
		return 0, err
	}
	topic := "wm-consume-" + suffix()
	if err := createTopics(ctx, brokers, topic); err != nil {
		return 0, err
	}
	pub, err := wmKafkaPublisher(brokers)
	if err != nil {
		return 0, err
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = wmMessage(order(i))
	}
	for i := 0; i < n; i += 1000 {
		if err := pub.Publish(topic, msgs[i:min(i+1000, n)]...); err != nil {
			_ = pub.Close()
			return 0, err
		}
	}
	_ = pub.Close()

	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Version = sarama.V2_1_0_0
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           wmkafka.DefaultMarshaler{},
		ConsumerGroup:         "wm-bench-" + suffix(),
		OverwriteSaramaConfig: sc,
		NackResendSleep:       10 * time.Millisecond,
	}, wmLogger)
	if err != nil {
		return 0, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, wmLogger)
	if err != nil {
		return 0, err
	}
	clock := newHandledClock(n)
	const consumerName = "bench"
	router.AddConsumerHandler("dedup", topic, sub, func(m *message.Message) error {
		var o ordersv1.OrderPlaced
		if err := protojson.Unmarshal(m.Payload, &o); err != nil {
			return err
		}
		err := pgx.BeginFunc(m.Context(), w.s.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(m.Context(), `INSERT INTO wm_processed (consumer, message_uuid) VALUES ($1, $2) ON CONFLICT DO NOTHING`, consumerName, m.UUID)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			_, err = tx.Exec(m.Context(), `INSERT INTO wm_seen (order_id, amount_cents) VALUES ($1, $2)`, o.OrderId, o.TotalCents)
			return err
		})
		if err != nil {
			return err
		}
		clock.handled()
		return nil
	})
	// What the router returns once stopped is not checked (an early stop is).
	return consumeRate(ctx, "watermill router", clock, func(ctx context.Context) error {
		if err := router.Run(ctx); ctx.Err() == nil {
			return err
		}
		return nil
	})
}

// endToEnd is Watermill's end-to-end run at rate: its publisher in the
// producers' transactions, its Forwarder to Kafka.
func (w *wm) endToEnd(ctx context.Context, e *env, c config, rate int) (e2eResult, error) {
	topic := "e2e-wm-" + suffix()
	if err := createTopics(ctx, e.brokers, topic); err != nil {
		return e2eResult{}, err
	}
	r, err := endToEnd(ctx, e.brokers, topic, rate, e2eProducers, c.e2e, w.s,
		producer{publish: func(ctx context.Context, tx pgx.Tx, ord *ordersv1.OrderPlaced) error {
			return w.publish(ctx, tx, topic, ord)
		}},
		func(p *progress) (func() error, error) { return w.startForwarder(e.brokers, p) })
	if err != nil {
		return e2eResult{}, fmt.Errorf("watermill at %d/s: %w", rate, err)
	}
	return r, nil
}
