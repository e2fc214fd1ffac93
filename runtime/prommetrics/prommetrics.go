// Package prommetrics exports the relay's and the consumers' measurements
// as Prometheus metrics: it adapts outbox.Hooks and consumer.Hooks to
// collectors registered on a prometheus.Registerer.
//
//	m, _ := prommetrics.New(prometheus.DefaultRegisterer)
//	relay, _ := outbox.NewRelay(pool, brokers, outbox.WithHooks(m.Relay()))
//	c, _ := consumer.New(pool, brokers, "billing", consumer.WithHooks(m.Consumer("billing")))
//	http.Handle("/metrics", promhttp.Handler())
//
// NewOutboxCollector adds the outbox's backlog per topic (pending rows,
// oldest age, failing keys, parked and dropped rows), read from the
// database at each scrape.
package prommetrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

// Metrics holds the protoevents collectors.
type Metrics struct {
	relayBatches   prometheus.Histogram
	relayPublished prometheus.Counter
	relayErrors    prometheus.Counter
	outboxPending  prometheus.Gauge
	outboxOldest   prometheus.Gauge
	relayLanes     prometheus.Gauge
	consumed       *prometheus.CounterVec
	duplicates     *prometheus.CounterVec
	retries        *prometheus.CounterVec
	deadLettered   *prometheus.CounterVec
	handlerLatency *prometheus.HistogramVec
	consumerLag    *prometheus.GaugeVec
	consumerLagAge *prometheus.GaugeVec
	walLagBytes    prometheus.Gauge
	walBehind      prometheus.Gauge
	walActive      prometheus.Gauge
}

// New creates the collectors and registers them on reg. It fails if reg
// already holds collectors of the same names.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		relayBatches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "protoevents", Subsystem: "relay", Name: "batch_rows",
			Help:    "Rows per batch the relay claimed from the outbox.",
			Buckets: []float64{1, 5, 10, 50, 100, 250, 500, 1000, 5000},
		}),
		relayPublished: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "protoevents", Subsystem: "relay", Name: "published_total",
			Help: "Outbox rows the broker acknowledged and the relay marked published.",
		}),
		relayErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "protoevents", Subsystem: "relay", Name: "publish_errors_total",
			Help: "Batches whose publishing failed and was retried after a backoff.",
		}),
		outboxPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "outbox", Name: "pending_rows",
			Help: "Outbox rows not yet published.",
		}),
		outboxOldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "outbox", Name: "oldest_pending_seconds",
			Help: "Age of the oldest unpublished outbox row; alert when it grows.",
		}),
		relayLanes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "relay", Name: "lanes_owned",
			Help: "Key-hash lanes of the outbox this relay owns.",
		}),
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "protoevents", Subsystem: "consumer", Name: "processed_total",
			Help: "Events applied: handler ran and its transaction committed.",
		}, []string{"consumer", "topic", "event_type"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "protoevents", Subsystem: "consumer", Name: "duplicates_total",
			Help: "Redelivered events the dedup table absorbed (handler skipped).",
		}, []string{"consumer", "topic", "event_type"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "protoevents", Subsystem: "consumer", Name: "retries_total",
			Help: "Failed attempts that will be retried.",
		}, []string{"consumer", "topic"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "protoevents", Subsystem: "consumer", Name: "dead_lettered_total",
			Help: "Messages given up on and published to their DLQ topic.",
		}, []string{"topic", "consumer"}),
		handlerLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "protoevents", Subsystem: "consumer", Name: "process_seconds",
			Help:    "Time of a successful attempt: dedup insert, handler and commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"consumer", "topic"}),
		consumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "consumer", Name: "lag_messages",
			Help: "Messages in the partition after the last fetched one.",
		}, []string{"consumer", "topic", "partition"}),
		consumerLagAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "consumer", Name: "lag_seconds",
			Help: "Age of the oldest message of the partition not yet handled (0 once its last known message is handled); alert when it exceeds what the consumers' users can wait.",
		}, []string{"consumer", "topic", "partition"}),
		walLagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "walrelay", Name: "slot_lag_bytes",
			Help: "WAL the WAL relay's replication slot retains (written since its confirmed position); alert well below max_slot_wal_keep_size.",
		}),
		walBehind: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "walrelay", Name: "behind_seconds",
			Help: "How long the oldest event the WAL relay read and Kafka has not acknowledged has been committed.",
		}),
		walActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "protoevents", Subsystem: "walrelay", Name: "active",
			Help: "1 while this WAL relay streams from the slot, 0 while it waits as a standby.",
		}),
	}
	for _, c := range []prometheus.Collector{
		m.relayBatches, m.relayPublished, m.relayErrors, m.outboxPending, m.outboxOldest, m.relayLanes,
		m.consumed, m.duplicates, m.retries, m.deadLettered, m.handlerLatency, m.consumerLag, m.consumerLagAge,
		m.walLagBytes, m.walBehind, m.walActive,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Relay returns the hooks to pass to outbox.WithHooks.
func (m *Metrics) Relay() outbox.Hooks {
	return outbox.Hooks{
		Batch:         func(rows int) { m.relayBatches.Observe(float64(rows)) },
		Published:     func(rows int) { m.relayPublished.Add(float64(rows)) },
		PublishFailed: func(error) { m.relayErrors.Inc() },
		Pending: func(rows int64, oldest time.Duration) {
			m.outboxPending.Set(float64(rows))
			m.outboxOldest.Set(oldest.Seconds())
		},
		Lanes: func(owned int) { m.relayLanes.Set(float64(owned)) },
	}
}

// WALRelay returns the hooks to pass to walrelay.WithHooks: published
// records and failures count in the relay series the polling relay uses,
// the slot's lag and the relay's role in the walrelay series.
func (m *Metrics) WALRelay() walrelay.Hooks {
	return walrelay.Hooks{
		Published:     func(n int) { m.relayPublished.Add(float64(n)) },
		PublishFailed: func(error) { m.relayErrors.Inc() },
		Lag: func(bytes int64, behind time.Duration) {
			m.walLagBytes.Set(float64(bytes))
			m.walBehind.Set(behind.Seconds())
		},
		Active: func(on bool) {
			if on {
				m.walActive.Set(1)
			} else {
				m.walActive.Set(0)
			}
		},
	}
}

// Consumer returns the hooks to pass to consumer.WithHooks of the consumer
// named name (the name given to consumer.New), which labels its series so several
// consumers in one process stay apart. alert, if not nil, is also called
// for every dead-lettered message.
func (m *Metrics) Consumer(name string, alert ...func(consumer.DeadLetter)) consumer.Hooks {
	return consumer.Hooks{
		Processed: func(d events.Delivery, eventType string, latency time.Duration) {
			m.consumed.WithLabelValues(name, d.Topic, eventType).Inc()
			m.handlerLatency.WithLabelValues(name, d.Topic).Observe(latency.Seconds())
		},
		Duplicate: func(d events.Delivery, eventType string) {
			m.duplicates.WithLabelValues(name, d.Topic, eventType).Inc()
		},
		Retry: func(d events.Delivery, _ error, _ time.Duration) { m.retries.WithLabelValues(name, d.Topic).Inc() },
		DeadLettered: func(dl consumer.DeadLetter) {
			m.deadLettered.WithLabelValues(dl.Original.Topic, dl.Consumer).Inc()
			for _, a := range alert {
				if a != nil {
					a(dl)
				}
			}
		},
		Lag: func(topic string, partition int, lag int64, age time.Duration) {
			p := strconv.Itoa(partition)
			m.consumerLag.WithLabelValues(name, topic, p).Set(float64(lag))
			m.consumerLagAge.WithLabelValues(name, topic, p).Set(age.Seconds())
		},
	}
}
