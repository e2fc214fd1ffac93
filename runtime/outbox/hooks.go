package outbox

import (
	"context"
	"time"
)

// Metrics receives the relay's measurements, for an adapter to export (e.g.
// to Prometheus). Every field is optional. The relay calls them from its Run
// goroutine, one at a time; they must not block.
type Metrics struct {
	// Batch is called with the number of rows of each batch sent.
	Batch func(rows int)
	// Published is called after a batch commits with the number of rows the
	// broker acknowledged and that are now marked published; summed over
	// time it is the published count, its rate the published/s.
	Published func(rows int)
	// PublishFailed is called when publishing a batch, or the database work
	// around it, failed; the relay backs off and retries.
	PublishFailed func(err error)
	// Pending is called every status interval with the number of pending
	// rows and the age of the oldest.
	Pending func(rows int64, oldest time.Duration)
	// Lanes is called when the number of lanes this relay owns changes.
	Lanes func(owned int)
}

// Hooks are fault-injection points for tests.
type Hooks struct {
	// AfterPublish runs after the broker acknowledged a whole batch and
	// before it is marked published. An error simulates a crash right
	// there: nothing of the batch is marked, the relay's connections are
	// closed (its lanes freed) and Run returns the error.
	AfterPublish func(ctx context.Context, rows []Row) error
	// AfterClaim runs after the relay claimed a non-empty batch, before it
	// is sent (with pipelining, while the previous batch is in flight).
	AfterClaim func(ctx context.Context, rows []Row)
}

// Row describes one outbox row handed to a hook.
type Row struct {
	// ID is the row's position in the outbox's order.
	ID int64
	// EventID is the envelope's ULID, as text.
	EventID string
	// EventType and Topic are the event's type and Kafka topic.
	EventType, Topic string
	// Key is the Kafka message key.
	Key []byte
	// Lane is the key-hash lane of the row.
	Lane int
	// Attempts counts earlier publish attempts of the row.
	Attempts int
}
