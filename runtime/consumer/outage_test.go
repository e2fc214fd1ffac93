package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestPostgresOutageBurnsNoAttempts stops Postgres while a handler is in
// its transaction and keeps it down far longer than the retry budget
// (MaxAttempts 2, backoff ≤ 200ms): the connection failures are retried
// without counting, nothing is dead-lettered, and once the server is back
// every event is applied exactly once.
func TestPostgresOutageBurnsNoAttempts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, pool := testenv.OwnCluster(t, ctx)
	kc := servers.Kafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	b := &bundle{pool: pool, kafka: kc, topic: servers.Topic(t, "outage")}
	b.d = descriptorFor(b.topic)
	if err := kc.CreateTopics(ctx, 2, b.topic, b.d.DLQTopic); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (event_id text NOT NULL, k text NOT NULL, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const total = 40
	var msgs []kafka.Message
	for i := range total {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprint("k", i%4), i), nil))
	}
	b.produce(t, msgs...)

	entered, resume := make(chan struct{}), make(chan struct{})
	var retries, dead counter
	h := bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		if ev.Seq() == 10 && meta.Attempt == 1 {
			select {
			case <-entered:
			default:
				close(entered)
				<-resume // Postgres goes down here, mid-transaction
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, k, n) VALUES ($1, $2, $3)`, meta.EventID.String(), string(ev.EventKey()), ev.Seq())
		return err
	})
	c := b.newConsumer(t, "outage", h, WithMaxAttempts(2), WithBackoff(50*time.Millisecond, 200*time.Millisecond), WithAttemptTimeout(5*time.Second),
		WithHooks(Hooks{
			Retry:        func(events.Delivery, error, time.Duration) { retries.inc() },
			DeadLettered: func(DeadLetter) { dead.inc() },
		}))
	r := start(t, c)
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("handler never reached the outage point")
	}
	if err := pg.Down(ctx); err != nil {
		close(resume)
		t.Fatal(err)
	}
	close(resume)
	// Far longer than MaxAttempts × backoff: every partition keeps failing
	// to reach the database, and the consumer says it is not ready.
	testenv.WaitFor(t, 60*time.Second, "not ready during the outage", func() (bool, string) {
		h := c.Health()
		return h.Live && !h.Ready && strings.Contains(h.String(), "transient database failure"), h.String()
	})
	t.Logf("health during the outage:\n%s", c.Health())
	time.Sleep(5 * time.Second)
	if err := pg.Up(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 90*time.Second, "every event applied", func() (bool, string) {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT n) FROM effects`).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == total, fmt.Sprint(n)
	})
	testenv.WaitFor(t, 60*time.Second, "ready after the outage", func() (bool, string) {
		h := c.Health()
		return h.Ready, h.String()
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := query(t, pool, `SELECT count(*) FROM effects`); n != total {
		t.Fatalf("%d effects for %d events: some applied twice", n, total)
	}
	if dead.get() != 0 || retries.get() != 0 {
		t.Fatalf("the outage counted as handler failures: %d retries, %d dead letters", retries.get(), dead.get())
	}
	es, err := ListDLQ(ctx, kc.Brokers, b.d.DLQTopic)
	if err != nil || len(es) != 0 {
		t.Fatalf("DLQ after the outage: %d entries, %v", len(es), err)
	}
}
