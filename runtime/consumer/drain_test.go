package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/runtime/events"
)

// TestStuckHandlerDoesNotBlockShutdown: a handler that ignores its context
// (blocked on a channel, its transaction open) cannot keep Run from
// returning once its context ends: after the drain timeout the handler is
// abandoned, reported at ERROR with its event and partition, and its
// transaction rolled back; after a restart the event is applied exactly
// once.
func TestStuckHandlerDoesNotBlockShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "a", 1), nil), message(t, b.event(t, "a", 2), nil))
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	stuck := bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id, k, n, part, off) VALUES ('stuck', $1, $2, $3, $4, $5)`,
			meta.EventID.String(), string(ev.EventKey()), ev.Seq(), meta.Partition, meta.Offset); err != nil {
			return err
		}
		close(entered)
		<-release // ignores ctx
		return nil
	})
	sink := &logSink{}
	c := b.newConsumer(t, "stuck", stuck, WithLogger(slog.New(sink)), WithDrainTimeout(100*time.Millisecond), withHandlerGrace(100*time.Millisecond))
	r := start(t, c)
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("handler never ran")
	}
	r.cancel()
	select {
	case err := <-r.errc:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
		r.once.Do(func() {})
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return with a handler stuck")
	}
	if n := sink.count("ERROR", "handler ignored its context", "offset=0", "partition=0", "topic="+b.topic); n != 1 {
		t.Fatalf("%d ERROR records for the abandoned handler, want 1: %v", n, sink.recs)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM consumed_events`); n != 0 {
		t.Fatalf("%d dedup rows after an abandoned attempt: its transaction did not roll back", n)
	}
	r2 := start(t, b.newConsumer(t, "stuck", b.handler("stuck", nil)))
	b.effectsAtLeast(t, 2, 30*time.Second)
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 2; n++ {
		if got := query(t, b.pool, `SELECT count(*) FROM effects WHERE n = $1`, n); got != 1 {
			t.Fatalf("event %d applied %d times, want once", n, got)
		}
	}
}

// TestAttemptTimeoutAbandonsStuckHandler: a handler that outlives its
// attempt timeout is reported at ERROR and abandoned; the attempt counts as
// a failure and the retry (the handler no longer stuck) applies the event
// once.
func TestAttemptTimeoutAbandonsStuckHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "a", 1), nil))
	release := make(chan struct{})
	defer close(release)
	var retries counter
	h := b.handler("timeout", func(ev testEvent, meta events.Meta) error {
		if meta.Attempt == 1 {
			<-release // ignores ctx
		}
		return nil
	})
	sink := &logSink{}
	c := b.newConsumer(t, "timeout", h, WithLogger(slog.New(sink)), WithAttemptTimeout(200*time.Millisecond), withHandlerGrace(50*time.Millisecond),
		WithHooks(Hooks{Retry: func(events.Delivery, error, time.Duration) { retries.inc() }}))
	r := start(t, c)
	b.effectsAtLeast(t, 1, 60*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM effects`); n != 1 || retries.get() != 1 {
		t.Fatalf("%d effects, %d retries; want 1, 1", n, retries.get())
	}
	if n := sink.count("ERROR", "handler ignored its context", "attempt=1"); n != 1 {
		t.Fatalf("%d ERROR records, want 1", n)
	}
}
