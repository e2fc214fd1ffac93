package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestBatchIsolatesFailingEvents: messages already fetched are applied
// several to a transaction; an event failing once is retried alone and one
// failing for good is dead-lettered alone, while the others commit, each
// applied once and in offset order.
func TestBatchIsolatesFailingEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE batch_effects (seq bigserial PRIMARY KEY, n int NOT NULL, txid bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const total = 200
	var msgs []kafka.Message
	for i := range total {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprint("k", i%3), i), nil))
	}
	b.produce(t, msgs...)
	var retries, dead counter
	h := bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		if _, err := tx.Exec(ctx, `INSERT INTO batch_effects (n, txid) VALUES ($1, txid_current())`, ev.Seq()); err != nil {
			return err
		}
		switch {
		case ev.Seq()%50 == 7 && meta.Attempt == 1:
			return errors.New("flaky once") // after its write: the savepoint must undo it
		case ev.Seq() == 120:
			return Permanent(errors.New("poison"))
		}
		return nil
	})
	c := b.newConsumer(t, "batch", h, WithMaxBatch(32), WithHooks(Hooks{
		Retry:        func(events.Delivery, error, time.Duration) { retries.inc() },
		DeadLettered: func(DeadLetter) { dead.inc() },
	}))
	r := start(t, c)
	testenv.WaitFor(t, 60*time.Second, "every good event applied", func() (bool, string) {
		n := query(t, b.pool, `SELECT count(*) FROM batch_effects`)
		return n >= total-1, fmt.Sprint(n)
	})
	entries := b.dlqEntries(t, 1, 30*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].OriginalOffset != 120 || dead.get() != 1 {
		t.Fatalf("DLQ %+v, %d alerts; want offset 120 alone", entries, dead.get())
	}
	if retries.get() != 4 {
		t.Fatalf("%d retries, want 4 (the flaky events, once each)", retries.get())
	}
	rows, err := b.pool.Query(ctx, `SELECT n FROM batch_effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != total-1 || !slices.IsSorted(ns) || slices.Contains(ns, 120) {
		t.Fatalf("applied %d events (want %d, each once, in offset order, without 120): %v", len(ns), total-1, ns)
	}
	txs := query(t, b.pool, `SELECT count(DISTINCT txid) FROM batch_effects`)
	if txs >= total/2 {
		t.Fatalf("%d transactions for %d events: not batched", txs, total-1)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM consumed_events WHERE consumer = 'batch'`); n != total-1 {
		t.Fatalf("%d dedup rows, want %d (none for the dead-lettered event)", n, total-1)
	}
	t.Logf("%d events in %d transactions", total-1, txs)
}

// TestBatchSavepointVariants: in a batch, a handler that fails after a
// query (savepoint set lazily by QueryRow), one that fails without
// touching the transaction, and one that tries to commit it are each
// isolated; every event is applied once.
func TestBatchSavepointVariants(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE sp_effects (n int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	const total = 60
	var msgs []kafka.Message
	for i := range total {
		msgs = append(msgs, message(t, b.event(t, "k", i), nil))
	}
	b.produce(t, msgs...)
	var commitRefused counter
	h := bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		first := meta.Attempt == 1
		switch {
		case ev.Seq()%10 == 5 && first:
			return errors.New("fails before any statement")
		case ev.Seq()%10 == 8 && first:
			if errors.Is(tx.Commit(ctx), errHandlerEndsTx) {
				commitRefused.inc()
			}
		}
		var n int
		if err := tx.QueryRow(ctx, `INSERT INTO sp_effects (n) VALUES ($1) RETURNING n`, ev.Seq()).Scan(&n); err != nil {
			return err
		}
		if ev.Seq()%10 == 3 && first {
			return errors.New("fails after a query")
		}
		return nil
	})
	r := start(t, b.newConsumer(t, "sp", h, WithMaxBatch(16)))
	testenv.WaitFor(t, 60*time.Second, "every event applied", func() (bool, string) {
		n := query(t, b.pool, `SELECT count(*) FROM sp_effects`)
		return n == total, fmt.Sprint(n)
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if commitRefused.get() == 0 {
		t.Fatal("a handler's Commit of the batch transaction was not refused")
	}
	if n := query(t, b.pool, `SELECT count(*) FROM consumed_events WHERE consumer = 'sp'`); n != total {
		t.Fatalf("%d dedup rows, want %d", n, total)
	}
}
