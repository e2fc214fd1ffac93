package prommetrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/outbox"
)

func TestMain(m *testing.M) { servers.Main(m) }

// TestOutboxCollectorPerTopic: the collector reports each topic's pending
// rows, failing keys and parked rows as the database holds them.
func TestOutboxCollectorPerTopic(t *testing.T) {
	ctx := context.Background()
	pool, _ := servers.DB(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewOutboxCollector(pool))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP protoevents_outbox_status_up 1 if the last scrape read the outbox's status, 0 if the database failed it.
# TYPE protoevents_outbox_status_up gauge
protoevents_outbox_status_up 0
`), "protoevents_outbox_status_up"); err != nil {
		t.Fatalf("before Migrate: %v", err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, b := testenv.Descriptor("topic.a"), testenv.Descriptor("topic.b")
	for i, k := range []string{"k1", "k1", "k2"} {
		if _, err := w.Write(ctx, tx, testenv.NewEvent(a, k, i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Write(ctx, tx, testenv.NewEvent(b, "k9", 0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The broker refused both of topic.a's keys; an operator parks k2's row.
	if _, err := pool.Exec(ctx, `UPDATE outbox SET attempts = 3, last_error = 'refused' WHERE topic = 'topic.a'`); err != nil {
		t.Fatal(err)
	}
	var k2 int64
	if err := pool.QueryRow(ctx, `SELECT id FROM outbox WHERE key = 'k2'`).Scan(&k2); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Park(ctx, pool, k2, outbox.Operation{By: "test", Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP protoevents_outbox_topic_failing_keys Keys of the topic whose oldest pending row failed to publish (held back by the relay; see eventsctl outbox list --stuck).
# TYPE protoevents_outbox_topic_failing_keys gauge
protoevents_outbox_topic_failing_keys{topic="topic.a"} 1
protoevents_outbox_topic_failing_keys{topic="topic.b"} 0
# HELP protoevents_outbox_topic_parked_rows Rows of the topic an operator parked (moved to <outbox>_dead, to retry).
# TYPE protoevents_outbox_topic_parked_rows gauge
protoevents_outbox_topic_parked_rows{topic="topic.a"} 1
protoevents_outbox_topic_parked_rows{topic="topic.b"} 0
# HELP protoevents_outbox_topic_pending_rows Outbox rows of the topic not yet published.
# TYPE protoevents_outbox_topic_pending_rows gauge
protoevents_outbox_topic_pending_rows{topic="topic.a"} 2
protoevents_outbox_topic_pending_rows{topic="topic.b"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"protoevents_outbox_topic_pending_rows", "protoevents_outbox_topic_failing_keys", "protoevents_outbox_topic_parked_rows"); err != nil {
		t.Fatal(err)
	}
}
