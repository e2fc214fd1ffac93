package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestHandlerJoinsProducerTrace checks that the handler's context carries
// the producer's trace: the envelope's traceparent becomes the parent of
// the consumer's span (with the default no-op provider the span context is
// the parent's own, which is what the handler sees).
func TestHandlerJoinsProducerTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.produce(t,
		message(t, b.event(t, "k", 1), func(e *envelope.Envelope) { e.TraceParent = tp }),
		message(t, b.event(t, "k", 2), nil))
	seen := make(chan trace.SpanContext, 2)
	c := b.newConsumer(t, "trace", bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		seen <- trace.SpanContextFromContext(ctx)
		return nil
	}))
	r := start(t, c)
	defer r.stop()
	want, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	for i, wantTrace := range []bool{true, false} {
		select {
		case sc := <-seen:
			if got := sc.TraceID() == want; got != wantTrace {
				t.Errorf("event %d: handler span context %v, want producer trace: %v", i+1, sc, wantTrace)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("event %d never handled", i+1)
		}
	}
}
