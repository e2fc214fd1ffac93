package outbox

import "time"

// Hooks receive the relay's measurements, for an adapter to export (e.g.
// runtime/prommetrics or runtime/otelmetrics); WithHooks installs them.
// Every field is optional. The relay calls them from its Run goroutines
// (with WithWorkers, from every worker, concurrently); they must not block.
//
// Hooks observe; they cannot change what the relay does. Fault injection
// for tests (a crash between the broker's ack and the mark) is armed
// through the context given to Run, with runtime/faultinject.
type Hooks struct {
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
