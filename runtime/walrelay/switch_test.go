package walrelay

import (
	"context"
	"testing"
	"time"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// TestSwitchingRelaysLosesNothing runs the documented procedure
// (docs/runbook.md, "Moving between relays") on a live system: from the
// polling relay to the WAL relay and back, with events written all along.
// Every event arrives, in per-key order.
//
// To the WAL relay: create the slot, move the writers to the WAL source,
// wait until the outbox table has no pending rows, stop the polling relay,
// start the WAL relay (the slot kept the WAL events meanwhile). Back: move
// the writers to the table, wait until the slot has confirmed the last WAL
// write, stop the WAL relay, start the polling relay (the table kept its
// rows meanwhile).
func TestSwitchingRelaysLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 3)
	if err := outbox.Migrate(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	tableWriter, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	walWriter := b.writer
	evs, want := sequence(b.d, 1200, 7)
	write := func(w *outbox.Writer, part []events.Event) {
		t.Helper()
		b.writer = w
		b.write(t, part, 4)
	}
	startPolling := func() (stop func()) {
		r, err := outbox.NewRelay(b.pool, b.brokers, outbox.WithLogger(quietLogger()), outbox.WithPollInterval(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	tableDrained := func() {
		waitFor(t, "the outbox table to drain", func() bool {
			st, err := outbox.Status(ctx, b.pool)
			return err == nil && st.Pending == 0
		})
	}

	stopPolling := startPolling()
	write(tableWriter, evs[:300])
	// To the WAL relay. (The slot exists: setup made it.)
	write(walWriter, evs[300:500]) // the WAL events wait in the slot
	tableDrained()
	stopPolling()
	wal := b.startRelay(t)
	write(walWriter, evs[500:800])
	// Back to the polling relay.
	write(tableWriter, evs[800:1000]) // the rows wait in the table
	b.waitConfirmed(t)
	if err := wal.stop(t); err != nil {
		t.Fatal(err)
	}
	stopPolling = startPolling()
	write(tableWriter, evs[1000:])
	tableDrained()
	stopPolling()
	dups := testenv.CheckDelivery(t, b.readAll(t), want)
	t.Logf("%d events through both relays, %d duplicates", len(evs), dups)
}
