package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// ours is protoevents on one schema: the outbox, its writer and a relay.
type ours struct {
	s *schema
	w *outbox.Writer
}

func newOurs(ctx context.Context, s *schema) (*ours, error) {
	if err := outbox.Migrate(ctx, s.pool); err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter()
	if err != nil {
		return nil, err
	}
	return &ours{s: s, w: w}, nil
}

// withOurs runs fn on protoevents in a schema of its own (named after
// prefix), dropped afterwards.
func (e *env) withOurs(ctx context.Context, prefix string, fn func(*ours) error) error {
	s, err := e.newSchema(ctx, prefix)
	if err != nil {
		return err
	}
	defer s.drop()
	o, err := newOurs(ctx, s)
	if err != nil {
		return err
	}
	return fn(o)
}

// publish is the producer's side of a business transaction: the event in
// the same transaction as the order.
func (o *ours) publish(ctx context.Context, tx pgx.Tx, d *events.Descriptor, ord *ordersv1.OrderPlaced) error {
	_, err := o.w.Write(ctx, tx, orderEvent{OrderPlaced: ord, d: d})
	return err
}

// prefill writes n events in transactions of 1000 (WriteBatch).
func (o *ours) prefill(ctx context.Context, d *events.Descriptor, n int) error {
	for i := 0; i < n; i += 1000 {
		batch := make([]events.Event, 0, 1000)
		for j := i; j < min(i+1000, n); j++ {
			batch = append(batch, orderEvent{OrderPlaced: order(j), d: d})
		}
		if err := pgx.BeginFunc(ctx, o.s.pool, func(tx pgx.Tx) error {
			_, err := o.w.WriteBatch(ctx, tx, batch)
			return err
		}); err != nil {
			return fmt.Errorf("prefill outbox: %w", err)
		}
	}
	return nil
}

// startRelay runs a relay with its defaults but the given lane workers; p
// counts the rows it marked and records when a session first held lanes.
// stop cancels it and waits.
func (o *ours) startRelay(brokers []string, workers int, p *progress) (stop func() error, err error) {
	r, err := outbox.NewRelay(o.s.pool, brokers, outbox.WithLogger(quietLogger()), outbox.WithWorkers(workers),
		outbox.WithHooks(outbox.Hooks{
			Published: func(n int) { p.delivered.Add(int64(n)) },
			// Set up once a session holds lanes: the claims start.
			Lanes: func(owned int) {
				if owned > 0 {
					p.markReady()
				}
			},
		}))
	if err != nil {
		return nil, err
	}
	return runUntilStopped(r.Run), nil
}

// drain measures how fast the relay, with the given lane workers
// (outbox.WithWorkers; -workers, default 2, the fastest on a 2-core
// machine), empties an analysed outbox of n events once set up.
func (o *ours) drain(ctx context.Context, brokers []string, n, workers int) (drainResult, error) {
	topic := "ours-drain-" + suffix()
	if err := createTopics(ctx, brokers, topic); err != nil {
		return drainResult{}, err
	}
	d := descriptorFor(topic)
	if err := o.prefill(ctx, d, n); err != nil {
		return drainResult{}, err
	}
	if err := o.s.analyze(ctx); err != nil {
		return drainResult{}, err
	}
	return timeDrain(ctx, brokers, topic, n, "our relay", 2*time.Minute,
		func(p *progress) (func() error, error) {
			return o.startRelay(brokers, workers, p)
		})
}

// consume measures our consumer with deduplication over n events already
// on a topic: one business insert per event in the dedup transaction;
// events/s from the first handled event to the last, as the Go benchmark
// does, so the group join is left out.
func (o *ours) consume(ctx context.Context, brokers []string, n int) (float64, error) {
	if err := consumer.Migrate(ctx, o.s.pool); err != nil {
		return 0, err
	}
	if _, err := o.s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS seen (order_id text PRIMARY KEY, amount_cents bigint NOT NULL)`); err != nil {
		return 0, err
	}
	topic := "ours-consume-" + suffix()
	if err := createTopics(ctx, brokers, topic, topic+".dlq"); err != nil {
		return 0, err
	}
	d := descriptorFor(topic)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		env, err := envelope.New(orderEvent{OrderPlaced: order(i), d: d}, events.PublishOptions{}, envelope.Options{Format: envelope.FormatJSON})
		if err != nil {
			return 0, err
		}
		value, hs, err := env.Encode()
		if err != nil {
			return 0, err
		}
		recs[i] = &kgo.Record{Topic: topic, Key: env.Key, Value: value, Headers: kgoHeaders(hs)}
	}
	if err := produce(ctx, brokers, recs); err != nil {
		return 0, err
	}
	clock := newHandledClock(n)
	c, err := consumer.New(o.s.pool, brokers, "bench-"+suffix(),
		consumer.WithLogger(quietLogger()),
		consumer.WithHooks(consumer.Hooks{Processed: func(events.Delivery, string, time.Duration) { clock.handled() }}))
	if err != nil {
		return 0, err
	}
	if err := consumer.Handle(c, d, func(ctx context.Context, tx pgx.Tx, _ events.Meta, ev orderEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO seen (order_id, amount_cents) VALUES ($1, $2)`, ev.OrderId, ev.TotalCents)
		return err
	}); err != nil {
		return 0, err
	}
	return consumeRate(ctx, "our consumer", clock, c.Run)
}

func kgoHeaders(hs []kafka.Header) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}
