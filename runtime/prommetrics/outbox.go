package prommetrics

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/protoevents/protoevents/runtime/outbox"
)

// OutboxCollector reports an outbox table's backlog per topic, read from
// the database at every scrape (outbox.Status), so every relay instance and
// any other process report the same numbers: pending rows, the oldest
// one's age, the keys the relay is backing off because the broker refused
// them, and the rows operators parked or dropped.
type OutboxCollector struct {
	pool    *pgxpool.Pool
	opts    []outbox.Option
	timeout time.Duration

	up, pending, oldest, failingKeys, parked, dropped *prometheus.Desc
}

// NewOutboxCollector returns the collector of the outbox table the options
// name (outbox.WithTable); register it on the registry served at /metrics.
// A scrape waits at most 5 seconds for the database.
func NewOutboxCollector(pool *pgxpool.Pool, opts ...outbox.Option) *OutboxCollector {
	topic := []string{"topic"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("protoevents", "outbox", name), help, labels, nil)
	}
	return &OutboxCollector{
		pool: pool, opts: opts, timeout: 5 * time.Second,
		up:          d("status_up", "1 if the last scrape read the outbox's status, 0 if the database failed it.", nil),
		pending:     d("topic_pending_rows", "Outbox rows of the topic not yet published.", topic),
		oldest:      d("topic_oldest_pending_seconds", "Age of the topic's oldest unpublished row.", topic),
		failingKeys: d("topic_failing_keys", "Keys of the topic whose oldest pending row failed to publish (held back by the relay; see eventsctl outbox list --stuck).", topic),
		parked:      d("topic_parked_rows", "Rows of the topic an operator parked (moved to <outbox>_dead, to retry).", topic),
		dropped:     d("topic_dropped_rows", "Rows of the topic an operator dropped (kept in <outbox>_dead).", topic),
	}
}

// Describe implements prometheus.Collector.
func (c *OutboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.pending, c.oldest, c.failingKeys, c.parked, c.dropped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *OutboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := outbox.Status(ctx, c.pool, c.opts...)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, ts := range st.Topics {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(ts.Pending), ts.Topic)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, ts.OldestPending.Seconds(), ts.Topic)
		ch <- prometheus.MustNewConstMetric(c.failingKeys, prometheus.GaugeValue, float64(ts.FailingKeys), ts.Topic)
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(ts.Parked), ts.Topic)
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.GaugeValue, float64(ts.Dropped), ts.Topic)
	}
}
