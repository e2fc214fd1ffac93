package otelmetrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/protoevents/protoevents/eventstest"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/otelmetrics"
	"github.com/protoevents/protoevents/runtime/outbox"
)

func TestMain(m *testing.M) { eventstest.Main(m) }

// collect reads every data point the reader holds, by instrument name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func sum(a metricdata.Aggregation) int64 {
	var n int64
	if s, ok := a.(metricdata.Sum[int64]); ok {
		for _, p := range s.DataPoints {
			n += p.Value
		}
	}
	return n
}

// TestRelayAndConsumerReportThroughOTel runs a real relay and a real
// consumer with the OpenTelemetry hooks: the published and processed
// counters match the events that went through, a poison message counts as
// retried and dead-lettered, and the alert fires.
func TestRelayAndConsumerReportThroughOTel(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	m, err := otelmetrics.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	env := eventstest.New(t, eventstest.WithOwnKafka())
	for _, id := range []string{"o-1", "o-2", "o-3", "poison"} {
		env.Produce(t, &ordersv1.OrderPlaced{OrderId: id})
	}
	relay, err := outbox.NewRelay(env.DB, env.Brokers, outbox.WithHooks(m.Relay()), outbox.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var alerts int
	c := env.NewConsumer(t, "billing",
		consumer.WithMaxAttempts(2), consumer.WithBackoff(time.Millisecond, 5*time.Millisecond),
		consumer.WithHooks(m.Consumer("billing", func(consumer.DeadLetter) { alerts++ })))
	if err := ordersv1.HandleOrderPlaced(c, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev *ordersv1.OrderPlaced) error {
		if ev.GetOrderId() == "poison" {
			return errors.New("cannot bill")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	cdone := make(chan error, 1)
	go func() { cdone <- c.Run(cctx) }()
	deadline := time.Now().Add(eventstest.DefaultTimeout)
	for time.Now().Before(deadline) {
		got := collect(t, reader)
		if sum(got["protoevents.consumer.processed"]) >= 3 && sum(got["protoevents.consumer.dead_lettered"]) >= 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	ccancel()
	if err := <-cdone; err != nil {
		t.Fatal(err)
	}

	got := collect(t, reader)
	if n := sum(got["protoevents.relay.published"]); n != 4 {
		t.Errorf("relay.published = %d, want 4", n)
	}
	if n := sum(got["protoevents.consumer.processed"]); n != 3 {
		t.Errorf("consumer.processed = %d, want 3", n)
	}
	if n := sum(got["protoevents.consumer.retries"]); n != 1 {
		t.Errorf("consumer.retries = %d, want 1 (2 attempts)", n)
	}
	if n := sum(got["protoevents.consumer.dead_lettered"]); n != 1 || alerts != 1 {
		t.Errorf("consumer.dead_lettered = %d, alerts %d; want 1 and 1", n, alerts)
	}
	if h, ok := got["protoevents.consumer.process.duration"].(metricdata.Histogram[float64]); !ok || len(h.DataPoints) == 0 || h.DataPoints[0].Count != 3 {
		t.Errorf("consumer.process.duration = %+v, want 3 observations", got["protoevents.consumer.process.duration"])
	}
	if _, ok := got["protoevents.relay.batch.size"].(metricdata.Histogram[int64]); !ok {
		t.Errorf("relay.batch.size missing: %v", got)
	}
}
