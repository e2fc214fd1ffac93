package envelope_test

import (
	"testing"

	"github.com/segmentio/kafka-go"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// sampleRecord encodes the demo's OrderPlaced as the relay sends it, with a
// correlation ID and a trace parent, in format f.
func sampleRecord(tb testing.TB, f envelope.Format) kafka.Message {
	tb.Helper()
	ev := &ordersv1.OrderPlaced{OrderId: "ord-00042", CustomerId: "cust-0007", TotalCents: 4200, Currency: "EUR", Country: "DE",
		Items: []*ordersv1.LineItem{{Sku: "sku-1", Quantity: 2}, {Sku: "sku-2", Quantity: 1}}}
	po := events.ApplyPublishOptions([]events.PublishOption{events.WithCorrelationID("req-42"),
		events.WithTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")})
	env, err := envelope.New(ev, po, envelope.Options{Format: f})
	if err != nil {
		tb.Fatal(err)
	}
	value, headers, err := env.Encode()
	if err != nil {
		tb.Fatal(err)
	}
	return kafka.Message{Key: env.Key, Value: value, Headers: headers}
}

// BenchmarkWireSize encodes one record per format and reports its size
// (key, value and headers; the metric make bench compares) and its value's
// size alone.
func BenchmarkWireSize(b *testing.B) {
	for _, f := range envelope.Formats {
		b.Run(f.String(), func(b *testing.B) {
			var m kafka.Message
			for b.Loop() {
				m = sampleRecord(b, f)
			}
			b.ReportMetric(float64(recordBytes(m)), "bytes/record")
			b.ReportMetric(float64(len(m.Value)), "value-bytes/record")
		})
	}
}

// TestCloudEventsFormatsAreSmaller: dropping the wrapper shrinks a record;
// the metadata travels once, in the headers.
func TestCloudEventsFormatsAreSmaller(t *testing.T) {
	size := map[envelope.Format]int{}
	for _, f := range envelope.Formats {
		size[f] = recordBytes(sampleRecord(t, f))
		t.Logf("%-8s %4d bytes per record", f, size[f])
	}
	if size[envelope.FormatCloudEventsJSON] >= size[envelope.FormatJSON] || size[envelope.FormatCloudEventsProto] >= size[envelope.FormatProto] {
		t.Errorf("sizes %v: the CloudEvents binary formats must be smaller than the envelopes they replace", size)
	}
}
