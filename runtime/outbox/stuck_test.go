package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestStuckRowListedParkedRetriedDropped: an event larger than its topic's
// max.message.bytes blocks its key. It is listed as stuck with the broker's
// error, parked (the key's later events then flow), retried (stuck again,
// under a new id) and dropped; every step is logged, and every event is
// either on Kafka or in the dead table: nothing is lost.
func TestStuckRowListedParkedRetriedDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	// A topic of its own that refuses messages over 4 KiB.
	small := missingTopic(b)
	resp, err := b.kafka.Client().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: small.topic, NumPartitions: 2, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "4096"}},
	}}})
	if err == nil {
		err = resp.Errors[small.topic]
	}
	if err != nil {
		t.Fatal(err)
	}
	big := newEvent(small.d, "blocked", 0)
	big.Fields["pad"] = structpb.NewStringValue(strings.Repeat("x", 16<<10))
	evs := []events.Event{big, newEvent(small.d, "blocked", 1), newEvent(small.d, "blocked", 2), newEvent(small.d, "free", 0)}
	ids := b.write(t, evs)
	b.startRelay(t)

	var stuck []StuckRow
	testenv.WaitFor(t, 15*time.Second, "the big row to be listed as stuck", func() (bool, string) {
		var err error
		stuck, err = ListStuck(ctx, b.pool, StuckFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return len(stuck) == 1, fmtRows(stuck)
	})
	s := stuck[0]
	if s.EventID != ids[0].String() || s.Topic != small.topic || string(s.Key) != "blocked" || s.Attempts < 1 ||
		!strings.Contains(s.LastError, "Too Large") || s.Waiting != 3 {
		t.Fatalf("stuck row %+v: want the big event of key blocked, failed with the broker's size error, 3 rows waiting", s)
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if ts := topicOf(st, small.topic); ts.Pending != 3 || ts.FailingKeys != 1 || ts.OldestPending <= 0 {
		t.Fatalf("status of %s: %+v, want 3 pending, 1 failing key", small.topic, ts)
	}

	// Park: the row leaves the outbox, its key's later rows get through.
	op := Operation{By: "alice", Reason: "16 KiB payload, broker limit 4 KiB"}
	res, err := Park(ctx, b.pool, s.ID, op)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != StatePending || res.To != StateParked || res.EventID != s.EventID {
		t.Fatalf("park: %+v", res)
	}
	b.waitDrained(t, 15*time.Second)
	got := map[string]int{}
	for _, p := range small.readAll(t) {
		for _, m := range p {
			got[m.Key]++
		}
	}
	if got["blocked"] != 2 || got["free"] != 1 {
		t.Fatalf("after parking, Kafka holds %v, want blocked:2 (seq 1, 2) free:1", got)
	}
	if state, err := Locate(ctx, b.pool, s.ID); err != nil || state != StateParked {
		t.Fatalf("locate parked row: %q, %v", state, err)
	}
	if st, _ := Status(ctx, b.pool); topicOf(st, small.topic).Parked != 1 {
		t.Fatalf("status after park: %+v, want 1 parked row on %s", st.Topics, small.topic)
	}

	// Retry: back in the outbox under a new id, and stuck again.
	res, err = Retry(ctx, b.pool, s.ID, Operation{By: "alice", Reason: "try once more"})
	if err != nil {
		t.Fatal(err)
	}
	if res.From != StateParked || res.NewID <= s.ID {
		t.Fatalf("retry: %+v, want it back from parked under a new id", res)
	}
	checkLanes(t, b.pool, DefaultLanes) // the retried row is in its key's lane
	testenv.WaitFor(t, 15*time.Second, "the retried row to fail again", func() (bool, string) {
		stuck, err = ListStuck(ctx, b.pool, StuckFilter{Topic: small.topic})
		if err != nil {
			t.Fatal(err)
		}
		return len(stuck) == 1 && stuck[0].ID == res.NewID, fmtRows(stuck)
	})
	if _, err := Park(ctx, b.pool, s.ID, op); !errors.Is(err, ErrNotStuck) || !strings.Contains(err.Error(), "retried") {
		t.Fatalf("parking the retried original: %v, want ErrNotStuck saying it was retried", err)
	}

	// Drop: moved out for good, kept for the record.
	if _, err := Drop(ctx, b.pool, res.NewID, Operation{By: "bob", Reason: "superseded by a smaller event"}); err != nil {
		t.Fatal(err)
	}
	b.waitDrained(t, 5*time.Second)
	var publishedID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM outbox WHERE published_at IS NOT NULL LIMIT 1`).Scan(&publishedID); err != nil {
		t.Fatal(err)
	}
	if _, err := Retry(ctx, b.pool, publishedID, op); !errors.Is(err, ErrNotStuck) || !strings.Contains(err.Error(), "already published") {
		t.Fatalf("retrying a published row: %v, want ErrNotStuck saying it is published", err)
	}
	if _, err := Drop(ctx, b.pool, 0, Operation{}); err == nil || !strings.Contains(err.Error(), "who") {
		t.Fatalf("an anonymous drop: %v, want it refused", err)
	}

	// Nothing lost: the big event is in the dead table twice (the retried
	// original, the dropped copy), with the same bytes.
	dead, err := ListDead(ctx, b.pool, "", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 2 || dead[0].ID != s.ID || dead[0].State != StateRetried || dead[0].RetriedAs != res.NewID ||
		dead[1].ID != res.NewID || dead[1].State != StateDropped || dead[1].MovedBy != "bob" ||
		dead[0].EventID != s.EventID || dead[1].EventID != s.EventID {
		t.Fatalf("dead rows %+v", dead)
	}
	var value []byte
	if err := b.pool.QueryRow(ctx, `SELECT value FROM outbox_dead WHERE outbox_id = $1`, res.NewID).Scan(&value); err != nil || len(value) < 16<<10 {
		t.Fatalf("dropped row's value: %d bytes, %v", len(value), err)
	}
	ops, err := Operations(ctx, b.pool, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var log []string
	for _, o := range ops {
		log = append(log, o.Action+" "+o.Actor+" "+o.Reason)
		if o.EventID != s.EventID || o.DBUser == "" {
			t.Fatalf("operation %+v", o)
		}
	}
	want := "park alice 16 KiB payload, broker limit 4 KiB|retry alice try once more|drop bob superseded by a smaller event"
	if strings.Join(log, "|") != want {
		t.Fatalf("operations log:\n%s\nwant\n%s", strings.Join(log, "\n"), strings.ReplaceAll(want, "|", "\n"))
	}
}

// TestMigrateAddsStuckTablesToOldOutbox: an outbox made before the
// stuck-row tables existed keeps working for Status, refuses stuck-row
// actions with a hint to migrate, and gains the tables when Migrate runs
// again, with its rows untouched.
func TestMigrateAddsStuckTablesToOldOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE outbox_dead; DROP TABLE outbox_ops`); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("old")
	if _, err := w.Write(ctx, tx, newEvent(d, "k", 0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := Status(ctx, pool)
	if err != nil || st.Pending != 1 || topicOf(st, "old").Pending != 1 {
		t.Fatalf("status of an old outbox: %+v, %v", st, err)
	}
	if _, err := Park(ctx, pool, 1, Operation{By: "x"}); !errors.Is(err, ErrNoStuckTables) || !strings.Contains(err.Error(), "eventsctl migrate") {
		t.Fatalf("park on an old outbox: %v, want ErrNoStuckTables naming eventsctl migrate", err)
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	stuck, err := ListStuck(ctx, pool, StuckFilter{AnyAttempts: true})
	if err != nil || len(stuck) != 1 {
		t.Fatalf("after migrate: %v, %v", stuck, err)
	}
	if _, err := Park(ctx, pool, stuck[0].ID, Operation{By: "x"}); err != nil {
		t.Fatal(err)
	}
}

func topicOf(st TableStatus, topic string) TopicStatus {
	for _, ts := range st.Topics {
		if ts.Topic == topic {
			return ts
		}
	}
	return TopicStatus{Topic: topic}
}

func fmtRows(rows []StuckRow) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r.Topic + "/" + string(r.Key) + ": " + r.LastError + "; ")
	}
	return b.String()
}
