package consumer

import (
	"time"

	"github.com/protoevents/protoevents/runtime/events"
)

// Hooks are the consumer's observability callbacks, for metrics and
// alerting; every field is optional. They are called synchronously from
// the partition goroutines (several at once when several partitions are
// assigned), so they must be quick and safe for concurrent use.
type Hooks struct {
	// Processed is called after an event's transaction committed: the
	// handler ran and its effects are durable. Latency covers the whole
	// successful attempt (begin, dedup insert, handler, commit); for an
	// event applied in a batch, the whole batch's transaction.
	Processed func(d events.Delivery, eventType string, latency time.Duration)
	// Duplicate is called when an event was already applied by this
	// consumer name (a redelivery), so the handler was skipped.
	Duplicate func(d events.Delivery, eventType string)
	// Retry is called after a failed attempt that will be retried; d.Attempt
	// is the attempt that failed and backoff the wait before the next one.
	Retry func(d events.Delivery, err error, backoff time.Duration)
	// DeadLettered is the alert hook: it is called once a message was
	// published to the DLQ topic and its offset committed.
	DeadLettered func(dl DeadLetter)
	// Lag is called after each fetch with how far the partition's consumer
	// is behind: messages, the number of messages in the partition after
	// the fetched one (high watermark - offset - 1); age, how long ago the
	// fetched message was appended (its timestamp), the age of the oldest
	// message not yet handled. Once the partition's last known message is
	// handled it is called with 0 and 0, so an idle partition does not keep
	// reporting its last burst.
	Lag func(topic string, partition int, messages int64, age time.Duration)
}

// DeadLetter describes one message the consumer gave up on.
type DeadLetter struct {
	// Consumer is the consumer's name.
	Consumer string
	// Original locates the message on the consumed topic; Attempt is the
	// number of attempts made.
	Original events.Delivery
	// EventID is the envelope's event ID, empty when it did not decode.
	EventID string
	// EventType is the envelope's event type, empty when it did not decode.
	EventType string
	// Err is the last failure.
	Err error
	// FirstFailure and LastFailure bracket the failed attempts.
	FirstFailure, LastFailure time.Time
	// DLQTopic is the topic the message was published to.
	DLQTopic string
}
