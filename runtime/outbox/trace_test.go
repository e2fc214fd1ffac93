package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/protoevents/protoevents/runtime/events"
)

// TestRelaySpansLinkProducers: every published batch is one producer span
// linked to the span of each event's producer (the envelope's traceparent),
// and the spans together cover every event.
func TestRelaySpansLinkProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx)

	const n = 30
	want := map[trace.SpanID]bool{}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for i := range n {
		var tid trace.TraceID
		var sid trace.SpanID
		copy(tid[:], fmt.Sprintf("trace-%010d", i))
		copy(sid[:], fmt.Sprintf("s-%06d", i))
		want[sid] = true
		parent := fmt.Sprintf("00-%s-%s-01", tid, sid)
		if _, err := b.writer.Write(ctx, tx, newEvent(b.d, fmt.Sprintf("k%d", i%4), i/4), events.WithTraceParent(parent)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.startRelay(t, WithTracerProvider(tp))
	b.waitDrained(t, 60*time.Second)

	deadline := time.Now().Add(2 * time.Minute)
	for {
		linked, messages, batches := map[trace.SpanID]bool{}, 0, 0
		for _, s := range rec.Ended() {
			if s.Name() != "outbox publish" {
				continue
			}
			if s.SpanKind() != trace.SpanKindProducer {
				t.Fatalf("span kind %v, want producer", s.SpanKind())
			}
			batches++
			for _, l := range s.Links() {
				linked[l.SpanContext.SpanID()] = true
			}
			for _, a := range s.Attributes() {
				if a.Key == "messaging.batch.message_count" {
					messages += int(a.Value.AsInt64())
				}
			}
		}
		if messages == n {
			for sid := range want {
				if !linked[sid] {
					t.Fatalf("no batch span links the producer span %s", sid)
				}
			}
			if len(linked) != n {
				t.Fatalf("%d distinct links, want %d", len(linked), n)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("spans cover %d messages in %d batches, want %d messages", messages, batches, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
