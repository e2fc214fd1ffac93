// Package otelmetrics reports the relay's and the consumers' measurements
// through the OpenTelemetry metrics API, beside runtime/prommetrics: it
// adapts outbox.Hooks and consumer.Hooks to instruments of a
// metric.MeterProvider, so they reach whatever exporter the program set up
// (OTLP, Prometheus through the OTel bridge, stdout).
//
//	m, _ := otelmetrics.New(otel.GetMeterProvider())
//	relay, _ := outbox.NewRelay(pool, brokers, outbox.WithHooks(m.Relay()))
//	c, _ := consumer.New(pool, brokers, "billing", consumer.WithHooks(m.Consumer("billing")))
package otelmetrics

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// ScopeName is the instrumentation scope of the instruments.
const ScopeName = "github.com/protoevents/protoevents/runtime/otelmetrics"

// Metrics holds the protoevents instruments.
type Metrics struct {
	relayBatch     metric.Int64Histogram
	relayPublished metric.Int64Counter
	relayErrors    metric.Int64Counter
	outboxPending  metric.Int64Gauge
	outboxOldest   metric.Float64Gauge
	relayLanes     metric.Int64Gauge
	processed      metric.Int64Counter
	duplicates     metric.Int64Counter
	retries        metric.Int64Counter
	deadLettered   metric.Int64Counter
	processTime    metric.Float64Histogram
	lag            metric.Int64Gauge
	lagAge         metric.Float64Gauge
}

// New creates the instruments on a meter of mp. The names follow the
// Prometheus adapter's series, in OpenTelemetry's dotted form
// (protoevents.relay.published, protoevents.consumer.processed, …).
func New(mp metric.MeterProvider) (*Metrics, error) {
	mt := mp.Meter(ScopeName, metric.WithInstrumentationVersion(events.Version))
	var (
		m    Metrics
		errs []error
		err  error
	)
	collect := func(e error) { errs = append(errs, e) }
	m.relayBatch, err = mt.Int64Histogram("protoevents.relay.batch.size", metric.WithUnit("{row}"),
		metric.WithDescription("Rows per batch the relay claimed from the outbox."),
		metric.WithExplicitBucketBoundaries(1, 5, 10, 50, 100, 250, 500, 1000, 5000))
	collect(err)
	m.relayPublished, err = mt.Int64Counter("protoevents.relay.published", metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows the broker acknowledged and the relay marked published."))
	collect(err)
	m.relayErrors, err = mt.Int64Counter("protoevents.relay.publish.errors", metric.WithUnit("{batch}"),
		metric.WithDescription("Batches whose publishing failed and was retried after a backoff."))
	collect(err)
	m.outboxPending, err = mt.Int64Gauge("protoevents.outbox.pending", metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows not yet published."))
	collect(err)
	m.outboxOldest, err = mt.Float64Gauge("protoevents.outbox.oldest_pending.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unpublished outbox row; alert when it grows."))
	collect(err)
	m.relayLanes, err = mt.Int64Gauge("protoevents.relay.lanes", metric.WithUnit("{lane}"),
		metric.WithDescription("Key-hash lanes of the outbox this relay owns."))
	collect(err)
	m.processed, err = mt.Int64Counter("protoevents.consumer.processed", metric.WithUnit("{event}"),
		metric.WithDescription("Events applied: the handler ran and its transaction committed."))
	collect(err)
	m.duplicates, err = mt.Int64Counter("protoevents.consumer.duplicates", metric.WithUnit("{event}"),
		metric.WithDescription("Redelivered events the dedup table absorbed (handler skipped)."))
	collect(err)
	m.retries, err = mt.Int64Counter("protoevents.consumer.retries", metric.WithUnit("{attempt}"),
		metric.WithDescription("Failed attempts that will be retried."))
	collect(err)
	m.deadLettered, err = mt.Int64Counter("protoevents.consumer.dead_lettered", metric.WithUnit("{message}"),
		metric.WithDescription("Messages given up on and published to their DLQ topic."))
	collect(err)
	m.processTime, err = mt.Float64Histogram("protoevents.consumer.process.duration", metric.WithUnit("s"),
		metric.WithDescription("Time of a successful attempt: dedup insert, handler and commit."))
	collect(err)
	m.lag, err = mt.Int64Gauge("protoevents.consumer.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Messages in the partition after the last fetched one."))
	collect(err)
	m.lagAge, err = mt.Float64Gauge("protoevents.consumer.lag.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message of the partition not yet handled (0 once its last known message is handled)."))
	collect(err)
	if err := errors.Join(errs...); err != nil {
		return nil, errors.New("otelmetrics: create instruments: " + err.Error())
	}
	return &m, nil
}

// Relay returns the hooks to pass to outbox.WithHooks.
func (m *Metrics) Relay() outbox.Hooks {
	ctx := context.Background()
	return outbox.Hooks{
		Batch:         func(rows int) { m.relayBatch.Record(ctx, int64(rows)) },
		Published:     func(rows int) { m.relayPublished.Add(ctx, int64(rows)) },
		PublishFailed: func(error) { m.relayErrors.Add(ctx, 1) },
		Pending: func(rows int64, oldest time.Duration) {
			m.outboxPending.Record(ctx, rows)
			m.outboxOldest.Record(ctx, oldest.Seconds())
		},
		Lanes: func(owned int) { m.relayLanes.Record(ctx, int64(owned)) },
	}
}

// Consumer returns the hooks to pass to consumer.WithHooks of the consumer
// named name (the name given to consumer.New), recorded with the attribute
// protoevents.consumer so several consumers in one process stay apart.
// alert, if not nil, is also called for every dead-lettered message.
func (m *Metrics) Consumer(name string, alert ...func(consumer.DeadLetter)) consumer.Hooks {
	ctx := context.Background()
	who := attribute.String("protoevents.consumer", name)
	topic := func(t string) attribute.KeyValue { return attribute.String("messaging.destination.name", t) }
	typ := func(t string) attribute.KeyValue { return attribute.String("protoevents.event_type", t) }
	return consumer.Hooks{
		Processed: func(d events.Delivery, eventType string, latency time.Duration) {
			m.processed.Add(ctx, 1, metric.WithAttributes(who, topic(d.Topic), typ(eventType)))
			m.processTime.Record(ctx, latency.Seconds(), metric.WithAttributes(who, topic(d.Topic)))
		},
		Duplicate: func(d events.Delivery, eventType string) {
			m.duplicates.Add(ctx, 1, metric.WithAttributes(who, topic(d.Topic), typ(eventType)))
		},
		Retry: func(d events.Delivery, _ error, _ time.Duration) {
			m.retries.Add(ctx, 1, metric.WithAttributes(who, topic(d.Topic)))
		},
		DeadLettered: func(dl consumer.DeadLetter) {
			m.deadLettered.Add(ctx, 1, metric.WithAttributes(who, topic(dl.Original.Topic)))
			for _, a := range alert {
				if a != nil {
					a(dl)
				}
			}
		},
		Lag: func(t string, partition int, lag int64, age time.Duration) {
			attrs := metric.WithAttributes(who, topic(t), attribute.String("messaging.destination.partition.id", strconv.Itoa(partition)))
			m.lag.Record(ctx, lag, attrs)
			m.lagAge.Record(ctx, age.Seconds(), attrs)
		},
	}
}
