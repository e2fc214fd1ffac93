package envelope_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// An event in CloudEvents binary content mode: the value is the payload
// alone, the metadata is in the ce_* headers; Decode reads it back.
func Example_cloudEventsBinary() {
	po := events.ApplyPublishOptions([]events.PublishOption{
		events.WithEventID(ulid.MustParse("01JDQ2X7Y4Z8KQ3B6M9T5V0W1R")),
		events.WithOccurredAt(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)),
		events.WithCorrelationID("req-42"),
	})
	env, err := envelope.New(&ordersv1.OrderPlaced{OrderId: "o-1", TotalCents: 4200}, po, envelope.Options{Format: envelope.FormatCloudEventsJSON})
	if err != nil {
		panic(err)
	}
	value, headers, err := env.Encode()
	if err != nil {
		panic(err)
	}
	var compact bytes.Buffer // protojson varies its spacing on purpose
	if err := json.Compact(&compact, value); err != nil {
		panic(err)
	}
	fmt.Printf("value: %s\n", compact.Bytes())
	for _, h := range headers {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}
	// Output:
	// value: {"order_id":"o-1","total_cents":"4200"}
	// ce_specversion: 1.0
	// ce_id: 01JDQ2X7Y4Z8KQ3B6M9T5V0W1R
	// ce_type: shop.orders.v1.OrderPlaced
	// ce_source: orders
	// ce_time: 2026-12-02T10:00:00Z
	// ce_schemaversion: 1
	// content-type: application/json
	// ce_correlationid: req-42
}
