package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// TestHandlerEventsGoWithTheCommit: the handler's transaction is an
// outbox.CommitTx: the events the handler writes commit (or roll back) with
// its effects, and with one transaction per message they go with the
// COMMIT.
func TestHandlerEventsGoWithTheCommit(t *testing.T) {
	t.Parallel()
	for _, maxBatch := range []int{1, DefaultMaxBatch} {
		t.Run(fmt.Sprintf("batch-%d", maxBatch), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, 1)
			if err := outbox.Migrate(ctx, b.pool); err != nil {
				t.Fatal(err)
			}
			pool, trace := testenv.TracedPool(t, b.pool)
			w, err := outbox.NewWriter()
			if err != nil {
				t.Fatal(err)
			}
			followUp := testenv.Descriptor(servers.Topic(t, "follow-up"))
			h := bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id, k, n, part, off) VALUES ($1, $2, $3, $4, $5, $6)`,
					"pipe", meta.EventID.String(), string(ev.EventKey()), ev.Seq(), meta.Partition, meta.Offset); err != nil {
					return err
				}
				if _, err := w.Write(ctx, tx, testenv.NewEvent(followUp, string(ev.EventKey()), ev.Seq())); err != nil {
					return err
				}
				if string(ev.EventKey()) == "refused" {
					return Permanent(errors.New("refused after writing its event"))
				}
				return nil
			})
			c := newConsumerOn(t, pool, b.kafka, "pipe", h, append(fastOptions(), WithMaxBatch(maxBatch))...)
			b.produce(t, message(t, b.event(t, "kept", 1), nil), message(t, b.event(t, "refused", 2), nil))
			r := start(t, c)
			b.effectsAtLeast(t, 1, 30*time.Second)
			b.dlqEntries(t, 1, 30*time.Second)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if n := query(t, b.pool, `SELECT count(*) FROM effects`); n != 1 {
				t.Fatalf("%d effects, want the kept event's", n)
			}
			if n := query(t, b.pool, `SELECT count(*) FROM outbox WHERE key = 'kept'::bytea`); n != 1 {
				t.Fatalf("%d follow-up events of the applied message, want 1", n)
			}
			if n := query(t, b.pool, `SELECT count(*) FROM outbox WHERE key = 'refused'::bytea`); n != 0 {
				t.Fatalf("%d follow-up events of the refused message, want none", n)
			}
			if maxBatch == 1 && !trace.Batch(`INSERT INTO "outbox"`, "COMMIT") {
				t.Fatal("the handler's event did not go with the COMMIT")
			}
		})
	}
}

// TestBatchHandlerNestedWriteThenFailure: a handler in a batch that writes
// its event in a nested transaction and then fails has its savepoint rolled
// back in the aborted transaction, and the rest of the batch stands: every
// message is handled once, the failing one once more.
func TestBatchHandlerNestedWriteThenFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 1)
	if err := outbox.Migrate(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	followUp := testenv.Descriptor(servers.Topic(t, "nested"))
	var calls counter
	h := bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		calls.inc()
		err := pgx.BeginFunc(ctx, tx, func(nested pgx.Tx) error {
			_, err := w.Write(ctx, nested, testenv.NewEvent(followUp, string(ev.EventKey()), ev.Seq()))
			return err
		})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id, k, n, part, off) VALUES ($1, $2, $3, $4, $5, $6)`,
			"nested", meta.EventID.String(), string(ev.EventKey()), ev.Seq(), meta.Partition, meta.Offset); err != nil {
			return err
		}
		divisor := 1
		if ev.Seq()%4 == 3 && meta.Attempt == 1 {
			divisor = 0 // fails once, after its writes, aborting the transaction
		}
		_, err = tx.Exec(ctx, `SELECT 1 / $1::int`, divisor)
		return err
	})
	const n = 16
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = message(t, b.event(t, "k", i), nil)
	}
	b.produce(t, msgs...)
	c := b.newConsumer(t, "nested", h, WithMaxBatch(n))
	r := start(t, c)
	b.effectsAtLeast(t, n, 30*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := calls.get(), int64(n+n/4); got != want {
		t.Fatalf("handler called %d times, want %d (each message once, the %d failing ones once more)", got, want, n/4)
	}
	if got := query(t, b.pool, `SELECT count(*) FROM outbox`); got != n {
		t.Fatalf("%d follow-up events, want %d", got, n)
	}
}
