package walrelay

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/internal/testenv"
)

// TestWALRelayPublishesCommittedEventsOnly: events of committed
// transactions arrive once each, in per-key order; a rolled-back
// transaction's never do.
func TestWALRelayPublishesCommittedEventsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 3)
	phantom, _ := sequence(testenv.Descriptor(b.topic), 20, 4)
	errRollback := errors.New("roll back")
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.writer.WriteBatch(ctx, tx, phantom); err != nil {
			return err
		}
		return errRollback
	}); !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	evs, want := sequence(b.d, 300, 7)
	b.write(t, evs[:150], 10) // written before the relay starts
	rr := b.startRelay(t)
	b.write(t, evs[150:], 1)
	b.waitConfirmed(t)
	if dups := testenv.CheckDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
	if got := rr.published.Load(); got != int64(len(evs)) {
		t.Fatalf("published %d records, want %d", got, len(evs))
	}
}
