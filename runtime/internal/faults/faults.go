// Package faults carries test-only fault-injection points from a test to
// the runtime through the context given to Run. The runtime reads them with
// the From functions; tests and demos set them with the public
// runtime/faultinject package. Nothing here is reachable from an option, so
// a production binary cannot turn a fault on by configuration.
package faults

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// Row describes one outbox row handed to a relay fault point.
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

// Relay are the polling relay's fault points.
type Relay struct {
	// AfterClaim runs after the relay claimed a non-empty batch, before it
	// is sent (with pipelining, while the previous batch is in flight).
	AfterClaim func(ctx context.Context, rows []Row)
	// AfterPublish runs after the broker acknowledged a whole batch and
	// before it is marked published. An error simulates a crash right
	// there: nothing of the batch is marked, the relay's connections are
	// closed (its lanes freed) and Run returns the error.
	AfterPublish func(ctx context.Context, rows []Row) error
}

// Consumer are a consumer's fault points.
type Consumer struct {
	// AfterDBCommit runs after a message's transaction committed and before
	// its offset is marked. An error aborts Run with that error, leaving the
	// offset uncommitted, like a crash at that point: the message is
	// delivered again and the dedup table absorbs it.
	AfterDBCommit func(kafka.Message) error
}

// Transition describes a saga transition handed to a saga fault point.
type Transition struct {
	SagaID, Saga string
	// Kind is the last path entry the transition wrote, e.g. "sent".
	Kind string
	// Status and Step are the saga's state after the transition.
	Status string
	Step   int
}

// Saga are a saga's fault points.
type Saga struct {
	// InTransaction runs inside a transition's transaction, after its
	// writes and before the commit: a crash here rolls the whole transition
	// back.
	InTransaction func(Transition)
}

// WALRelay are the WAL relay's fault points.
type WALRelay struct {
	// AfterPublish runs after the brokers acknowledged a lane's batch
	// (records of it) and before its transactions count as acknowledged.
	// An error simulates a crash right there: nothing of the batch is
	// confirmed to the slot, the session ends and Run returns the error.
	AfterPublish func(ctx context.Context, records int) error
}

type relayKey struct{}
type walRelayKey struct{}
type consumerKey struct{}
type sagaKey struct{}

// WithWALRelay returns ctx carrying the WAL relay points p.
func WithWALRelay(ctx context.Context, p WALRelay) context.Context {
	return context.WithValue(ctx, walRelayKey{}, p)
}

// WALRelayFrom returns the WAL relay points ctx carries, or none.
func WALRelayFrom(ctx context.Context) WALRelay {
	p, _ := ctx.Value(walRelayKey{}).(WALRelay)
	return p
}

// WithRelay returns ctx carrying the relay points p.
func WithRelay(ctx context.Context, p Relay) context.Context {
	return context.WithValue(ctx, relayKey{}, p)
}

// RelayFrom returns the relay points ctx carries, or none.
func RelayFrom(ctx context.Context) Relay {
	p, _ := ctx.Value(relayKey{}).(Relay)
	return p
}

// WithConsumer returns ctx carrying the consumer points p.
func WithConsumer(ctx context.Context, p Consumer) context.Context {
	return context.WithValue(ctx, consumerKey{}, p)
}

// ConsumerFrom returns the consumer points ctx carries, or none.
func ConsumerFrom(ctx context.Context) Consumer {
	p, _ := ctx.Value(consumerKey{}).(Consumer)
	return p
}

// WithSaga returns ctx carrying the saga points p.
func WithSaga(ctx context.Context, p Saga) context.Context {
	return context.WithValue(ctx, sagaKey{}, p)
}

// SagaFrom returns the saga points ctx carries, or none.
func SagaFrom(ctx context.Context) Saga {
	p, _ := ctx.Value(sagaKey{}).(Saga)
	return p
}
