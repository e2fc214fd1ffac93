package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/events"
)

// TestReplayRebuildsReadModel is docs/runbook.md's "Replaying a consumer"
// (under "Consumer lag and replay"): after a consumer applied every event,
// resetting its group to the start and running it again under the same
// name changes nothing (every event comes by again and is counted as a
// duplicate), while a consumer under a new name, its own group starting at
// the beginning, applies every event exactly once: the way to rebuild a
// read model.
func TestReplayRebuildsReadModel(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	const n = 60
	var msgs []kafka.Message
	for i := range n {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprintf("k%d", i%7), i), nil))
	}
	b.produce(t, msgs...)
	effects := func(name string) (total, distinct int64) {
		return query(t, b.pool, `SELECT count(*) FROM effects WHERE consumer = $1`, name),
			query(t, b.pool, `SELECT count(DISTINCT event_id) FROM effects WHERE consumer = $1`, name)
	}
	// caughtUp waits until the group committed every offset.
	caughtUp := func(group string) {
		t.Helper()
		b.waitGroup(t, group, group+" caught up", func(st GroupStatus) bool {
			return len(st.Partitions) == 3 && st.Lag() == 0 && st.Partitions[0].Committed >= 0
		})
	}
	run := func(name string, dups *counter) {
		t.Helper()
		c := b.newConsumer(t, name, b.handler(name, nil), WithCommitInterval(0),
			WithHooks(Hooks{Duplicate: func(events.Delivery, string) { dups.inc() }}))
		r := start(t, c)
		b.waitGroup(t, name, name+" caught up with every event handled", func(st GroupStatus) bool {
			total, _ := effects(name)
			return total+dups.get() >= n && len(st.Partitions) == 3 && st.Lag() == 0
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}

	var first counter
	run("orders-view", &first)
	caughtUp("orders-view")
	if total, distinct := effects("orders-view"); total != n || distinct != n || first.get() != 0 {
		t.Fatalf("first run: %d effects of %d events, %d duplicates; want %d, %d, 0", total, distinct, first.get(), n, n)
	}

	// Replay under the same name: absorbed by the dedup table.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	moves, err := ResetGroup(ctx, b.kafka.Brokers, b.kafka.Group("orders-view"), nil, ResetToEarliest())
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != 3 {
		t.Fatalf("reset moved %d partitions, want 3", len(moves))
	}
	if st := b.describe(t, "orders-view"); st.Lag() != n {
		t.Fatalf("lag %d after the reset, want %d", st.Lag(), n)
	}
	var replayed counter
	run("orders-view", &replayed)
	if total, distinct := effects("orders-view"); total != n || distinct != n || replayed.get() != n {
		t.Fatalf("replay under the same name: %d effects of %d events, %d duplicates; want %d, %d, %d", total, distinct, replayed.get(), n, n, n)
	}

	// A new name: a new group from the start, a new dedup scope.
	var fresh counter
	run("orders-view-v2", &fresh)
	if total, distinct := effects("orders-view-v2"); total != n || distinct != n || fresh.get() != 0 {
		t.Fatalf("under a new name: %d effects of %d events, %d duplicates; want %d, %d, 0", total, distinct, fresh.get(), n, n)
	}
	if total, _ := effects("orders-view"); total != n {
		t.Fatalf("the new consumer changed the old one's effects: %d, want %d", total, n)
	}
	if rows := query(t, b.pool, `SELECT count(*) FROM consumed_events`); rows != 2*n {
		t.Fatalf("%d dedup rows, want %d (one per event and consumer name)", rows, 2*n)
	}
}
