package events

import "time"

// PublishOption changes the metadata of the events of one publish call.
type PublishOption func(*PublishOptions)

// PublishOptions is the metadata a publish call may set; the zero value means
// "choose defaults" (a new ULID, the current time, the writer's producer).
type PublishOptions struct {
	// EventID, when not zero, is used instead of a fresh ULID. Only for a
	// single-event publish: a batch with a fixed ID is refused.
	EventID EventID
	// OccurredAt, when not zero, replaces the time of the publish call.
	OccurredAt time.Time
	// Producer, when not empty, replaces the writer's producer name.
	Producer string
	// CorrelationID and CausationID link the event to its flow and cause.
	CorrelationID string
	CausationID   string
	// TraceParent is the W3C traceparent to carry to consumers.
	TraceParent string
}

// ApplyPublishOptions folds opts into a PublishOptions value, in order.
func ApplyPublishOptions(opts []PublishOption) PublishOptions {
	var o PublishOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// WithEventID publishes the event under a given ID, e.g. to make a retried
// command idempotent end to end.
func WithEventID(id EventID) PublishOption {
	return func(o *PublishOptions) { o.EventID = id }
}

// WithOccurredAt records when the event happened, if not now.
func WithOccurredAt(t time.Time) PublishOption {
	return func(o *PublishOptions) { o.OccurredAt = t }
}

// WithProducer overrides the producer name recorded in the envelope.
func WithProducer(name string) PublishOption {
	return func(o *PublishOptions) { o.Producer = name }
}

// WithCorrelationID ties the event to a business flow.
func WithCorrelationID(id string) PublishOption {
	return func(o *PublishOptions) { o.CorrelationID = id }
}

// WithCausationID records the ID of what caused the event.
func WithCausationID(id string) PublishOption {
	return func(o *PublishOptions) { o.CausationID = id }
}

// WithTraceParent carries a W3C traceparent to the consumers.
func WithTraceParent(tp string) PublishOption {
	return func(o *PublishOptions) { o.TraceParent = tp }
}

// CausedBy marks the event as caused by the consumed event described by m:
// the causation ID becomes m's event ID, and the correlation ID and trace
// parent are carried over. Use it when a handler publishes follow-up events.
func CausedBy(m Meta) PublishOption {
	return func(o *PublishOptions) {
		o.CausationID = m.EventID.String()
		o.CorrelationID = m.CorrelationID
		if o.TraceParent == "" {
			o.TraceParent = m.TraceParent
		}
	}
}
