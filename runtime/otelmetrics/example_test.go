package otelmetrics_test

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/protoevents/protoevents/runtime/otelmetrics"
)

// Wire the relay's metrics to an OpenTelemetry meter provider; here a
// manual reader stands in for an exporter.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	m, err := otelmetrics.New(mp)
	if err != nil {
		panic(err)
	}
	relayMetrics := m.Relay() // outbox.NewRelay(pool, brokers, outbox.WithHooks(relayMetrics))
	relayMetrics.Published(500)
	relayMetrics.Published(20)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if s, ok := mt.Data.(metricdata.Sum[int64]); ok {
				fmt.Println(mt.Name, s.DataPoints[0].Value)
			}
		}
	}
	// Output: protoevents.relay.published 520
}
