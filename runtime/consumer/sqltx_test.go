package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/events"
)

// TestHandleSQL: a handler written against database/sql gets the dedup
// transaction as a *sql.Tx: its writes commit with the dedup row, a
// failure rolls them back (alone, in a batch), and each event is applied
// once, batched or one transaction per event.
func TestHandleSQL(t *testing.T) {
	t.Parallel()
	for _, bc := range []struct {
		name string
		opts []Option
	}{{"batched", nil}, {"per-event", []Option{WithMaxBatch(1)}}} {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			const total = 40
			var msgs []kafka.Message
			for i := range total {
				msgs = append(msgs, message(t, b.event(t, fmt.Sprint("k", i%5), i), nil))
			}
			b.produce(t, msgs...)
			s, err := New(b.pool, b.kafka.Brokers, "sql", append(append(fastOptions(), WithGroupID(b.kafka.Group("sql"))), bc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			var retries counter
			if err := HandleSQL(s, b.d, func(ctx context.Context, tx *sql.Tx, meta events.Meta, ev testEvent) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects (consumer, event_id, k, n, part, off) VALUES ('sql', $1, $2, $3, $4, $5)`,
					meta.EventID.String(), string(ev.EventKey()), ev.Seq(), meta.Partition, meta.Offset); err != nil {
					return err
				}
				if ev.Seq()%10 == 4 && meta.Attempt == 1 {
					retries.inc()
					return errors.New("fails after its write")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- s.Run(ctx) }()
			b.effectsAtLeast(t, total, 60*time.Second)
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if n := query(t, b.pool, `SELECT count(DISTINCT n) FROM effects`); n != total || query(t, b.pool, `SELECT count(*) FROM effects`) != total {
				t.Fatalf("effects not exactly once: %d distinct of %d", n, query(t, b.pool, `SELECT count(*) FROM effects`))
			}
			if n := query(t, b.pool, `SELECT count(*) FROM consumed_events WHERE consumer = 'sql'`); n != total {
				t.Fatalf("%d dedup rows, want %d", n, total)
			}
			if retries.get() != 4 {
				t.Fatalf("%d failed first attempts, want 4", retries.get())
			}
		})
	}
}
