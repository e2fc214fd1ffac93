package outbox

import (
	"context"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// tracerName names the relay's OpenTelemetry instrumentation scope.
const tracerName = "github.com/protoevents/protoevents/runtime/outbox"

// maxSpanLinks bounds the links of one batch span: one per distinct
// producer trace, the rest counted in an attribute.
const maxSpanLinks = 128

// batchTracer makes the relay's spans: one producer span per published
// batch. A batch carries events of many traces, so the span is a root of
// its own with a link to each event's producer span (the envelope's
// traceparent), as the OpenTelemetry messaging conventions do for batches.
type batchTracer struct{ t trace.Tracer }

func newBatchTracer(tp trace.TracerProvider) batchTracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return batchTracer{t: tp.Tracer(tracerName)}
}

// start opens the span of a flight; end closes it with the publish's
// outcome.
func (b batchTracer) start(ctx context.Context, fl *flight) (context.Context, func(error)) {
	links, dropped := batchLinks(fl.msgs)
	topic := ""
	if len(fl.msgs) > 0 {
		topic = fl.msgs[0].Topic
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.type", "send"),
		attribute.Int("messaging.batch.message_count", len(fl.msgs)),
	}
	if topic != "" {
		attrs = append(attrs, attribute.String("messaging.destination.name", topic))
	}
	if dropped > 0 {
		attrs = append(attrs, attribute.Int("protoevents.links_dropped", dropped))
	}
	ctx, span := b.t.Start(ctx, "outbox publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithNewRoot(), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// batchLinks returns a link to each distinct producer span of the batch's
// messages, at most maxSpanLinks, and how many were left out.
func batchLinks(msgs []kafka.Message) ([]trace.Link, int) {
	var links []trace.Link
	seen := map[[24]byte]bool{}
	dropped := 0
	for i := range msgs {
		tp := ""
		for _, h := range msgs[i].Headers {
			if h.Key == envelope.HeaderTraceParent {
				tp = string(h.Value)
				break
			}
		}
		if tp == "" {
			continue
		}
		sc := trace.SpanContextFromContext(events.ContextWithTraceParent(context.Background(), tp))
		var id [24]byte
		tid, sid := sc.TraceID(), sc.SpanID()
		copy(id[:16], tid[:])
		copy(id[16:], sid[:])
		if !sc.IsValid() || seen[id] {
			continue
		}
		seen[id] = true
		if len(links) >= maxSpanLinks {
			dropped++
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
	}
	return links, dropped
}
