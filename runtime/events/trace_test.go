package events

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestTraceParentRoundTrip(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	tp := TraceParentFromContext(ctx)
	if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; tp != want {
		t.Fatalf("traceparent = %q, want %q", tp, want)
	}
	got := trace.SpanContextFromContext(ContextWithTraceParent(context.Background(), tp))
	if got.TraceID() != tid || got.SpanID() != sid || !got.IsRemote() || !got.IsSampled() {
		t.Fatalf("extracted span context %+v", got)
	}
	if TraceParentFromContext(context.Background()) != "" {
		t.Error("a context without a span yields a traceparent")
	}
	if c := ContextWithTraceParent(context.Background(), "garbage"); trace.SpanContextFromContext(c).IsValid() {
		t.Error("a malformed traceparent yields a span context")
	}
}
