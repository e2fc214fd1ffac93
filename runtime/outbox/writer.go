// Package outbox writes events into a Postgres outbox table inside the
// caller's own transaction and relays them to Kafka.
package outbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	events "github.com/protoevents/protoevents/runtime"
)

// errNotImplemented marks the API skeleton; the implementation replaces it.
var errNotImplemented = errors.New("outbox: not implemented")

// Writer inserts event envelopes into the outbox table. It holds no
// connection: every write happens in the transaction the caller passes, so
// the event commits or rolls back with the business change.
type Writer struct{}

// WriterOption configures a Writer.
type WriterOption func(*Writer)

// NewWriter returns a Writer for the default outbox table.
func NewWriter(opts ...WriterOption) (*Writer, error) {
	w := &Writer{}
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// Write inserts one event into the outbox within tx and returns its ID.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, ev events.Event, opts ...events.PublishOption) (events.EventID, error) {
	return events.EventID{}, errNotImplemented
}

// WriteBatch inserts many events into the outbox within tx in one round
// trip and returns their IDs in order.
func (w *Writer) WriteBatch(ctx context.Context, tx pgx.Tx, evs []events.Event, opts ...events.PublishOption) ([]events.EventID, error) {
	return nil, errNotImplemented
}
