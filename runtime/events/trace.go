package events

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// traceContext is the W3C Trace Context propagator: the format of the
// traceparent header the envelope carries.
var traceContext = propagation.TraceContext{}

// TraceParentFromContext returns the W3C traceparent of the span in ctx
// (OpenTelemetry), or "" when ctx carries none. The outbox writer records it
// in the envelope when the publish options set no trace parent, so a
// consumer's work joins the producer's trace.
func TraceParentFromContext(ctx context.Context) string {
	c := propagation.MapCarrier{}
	traceContext.Inject(ctx, c)
	return c["traceparent"]
}

// ContextWithTraceParent returns ctx carrying the remote span context of a
// W3C traceparent (as spans started from it become its children). An empty
// or malformed traceparent leaves ctx as it is.
func ContextWithTraceParent(ctx context.Context, traceParent string) context.Context {
	if traceParent == "" {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": traceParent})
}
