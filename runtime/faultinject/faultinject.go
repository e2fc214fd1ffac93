// Package faultinject arms test-only fault points in the runtime: a relay
// that dies between the broker's ack and marking the batch, a consumer that
// dies between its DB commit and its offset commit, a saga transition that
// dies inside its transaction. Tests and demos use it to prove what the
// guarantees promise at the worst moment.
//
// The points travel in the context given to Run (Relay.Run, Consumer.Run,
// the saga's consumer and timeout runner), never in an option: a production
// binary that does not import this package cannot arm one, and one that
// does arms only the Runs it hands such a context. Do not import it outside
// tests and demos.
package faultinject

import (
	"context"

	"github.com/protoevents/protoevents/runtime/internal/faults"
)

// Row describes one outbox row handed to a relay point.
type Row = faults.Row

// RelayPoints are the polling relay's fault points; see the fields.
type RelayPoints = faults.Relay

// WALRelayPoints are the WAL relay's fault points; see the fields.
type WALRelayPoints = faults.WALRelay

// ConsumerPoints are a consumer's fault points; see the fields.
type ConsumerPoints = faults.Consumer

// Transition describes a saga transition handed to a saga point.
type Transition = faults.Transition

// SagaPoints are a saga's fault points; see the fields.
type SagaPoints = faults.Saga

// Relay returns ctx arming p for the relay whose Run receives it.
func Relay(ctx context.Context, p RelayPoints) context.Context {
	return faults.WithRelay(ctx, p)
}

// WALRelay returns ctx arming p for the WAL relay whose Run receives it.
func WALRelay(ctx context.Context, p WALRelayPoints) context.Context {
	return faults.WithWALRelay(ctx, p)
}

// Consumer returns ctx arming p for the consumer whose Run receives it.
func Consumer(ctx context.Context, p ConsumerPoints) context.Context {
	return faults.WithConsumer(ctx, p)
}

// Saga returns ctx arming p for the saga transitions run under it (the
// consumer's Run that handles the saga's replies, and the saga's timeout
// runner).
func Saga(ctx context.Context, p SagaPoints) context.Context {
	return faults.WithSaga(ctx, p)
}
