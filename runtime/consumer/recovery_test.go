package consumer

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// The recovery tests take a dependency away while the consumer works, long
// enough for its partitions to fail and back off, and bring it back: every
// partition must apply events again soon after (resumeBound), although
// the backoff they sleep out is far longer (WithBackoff(40s, 1m): the
// first delay alone is 20–40 s). Only the database check seeing the
// database back, and waking them, gets them there in time.
const (
	resumeBound     = 10 * time.Second
	outageAfterFail = 2 * time.Second // the outage goes on this long after the failures are seen
)

// recoveryMessages returns n messages numbered from first, over 30 keys
// (every partition of three gets some).
func recoveryMessages(t *testing.T, b *bundle, first, n int) []kafka.Message {
	var msgs []kafka.Message
	for i := first; i < first+n; i++ {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprint("k", i%30), i), nil))
	}
	return msgs
}

// waitEffects waits until the effects table has n rows, riding out the
// pool's connections that died with the server.
func waitEffects(t *testing.T, pool *pgxpool.Pool, n int64, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, fmt.Sprintf("%d effects", n), func() (bool, string) {
		var got int64
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&got); err != nil {
			return false, err.Error()
		}
		return got >= n, fmt.Sprintf("have %d", got)
	})
}

// TestConsumerResumesWhenPostgresReturns: Postgres goes down while events
// arrive on three partitions; each partition fails, and sleeps out a
// backoff of 20 s or more, until the database is back: then every one of
// them applies its events within resumeBound, none twice.
func TestConsumerResumesWhenPostgresReturns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg, pool := testenv.OwnCluster(t, ctx)
	kc := servers.Kafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	b := &bundle{pool: pool, kafka: kc, topic: servers.Topic(t, "recovery")}
	b.d = descriptorFor(b.topic)
	if err := kc.CreateTopics(ctx, 3, b.topic, b.d.DLQTopic); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (
		seq bigserial PRIMARY KEY, consumer text NOT NULL, event_id text NOT NULL,
		k text NOT NULL, n int NOT NULL, part int NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var retries, dead counter
	c := b.newConsumer(t, "recovery", b.handler("recovery", nil), WithBackoff(40*time.Second, time.Minute),
		WithHooks(Hooks{
			Retry:        func(events.Delivery, error, time.Duration) { retries.inc() },
			DeadLettered: func(DeadLetter) { dead.inc() },
		}))
	r := start(t, c)
	b.produce(t, recoveryMessages(t, b, 0, 30)...)
	waitEffects(t, pool, 30, time.Minute)

	if err := pg.Down(ctx); err != nil {
		t.Fatal(err)
	}
	b.produce(t, recoveryMessages(t, b, 30, 30)...)
	testenv.WaitFor(t, time.Minute, "every partition retrying a transient database failure", func() (bool, string) {
		h := c.Health()
		return strings.Contains(h.String(), "3 partition(s) retrying a transient database failure"), h.String()
	})
	time.Sleep(outageAfterFail)
	if err := pg.Up(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitEffects(t, pool, 60, time.Minute)
	resumed := time.Since(back)
	t.Logf("every partition applied its events %v after the database came back", resumed.Round(time.Millisecond))
	if resumed > resumeBound {
		t.Fatalf("the last partition resumed %v after the database came back, want within %v", resumed.Round(time.Millisecond), resumeBound)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := query(t, pool, `SELECT count(*) FROM effects`); n != 60 {
		t.Fatalf("%d effects for 60 events", n)
	}
	if retries.get() != 0 || dead.get() != 0 {
		t.Fatalf("the outage counted as handler failures: %d retries, %d dead letters", retries.get(), dead.get())
	}
}

// TestConsumerResumesWhenKafkaReturns: the brokers go away, the consumer
// loses its partitions, and they stay away past its session timeout (as in
// a real outage of a minute: the member the consumer could not take out of
// the group has expired); events produced once they are back are applied
// within resumeBound of their return. No sleep of the consumer's own is
// involved: kafka-go rejoins every join backoff (1 s). A shorter outage
// costs more: kafka-go rejoins as a new member, and the broker holds the
// join until the old one's session expires (up to 10 s after the outage
// began; docs/design.md, "Recovery at the speed of the dependency").
func TestConsumerResumesWhenKafkaReturns(t *testing.T) {
	t.Parallel()
	kc := servers.FakeKafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	b := setupOn(t, 3, kc)
	down := testenv.KafkaOutage(kc.Fake)
	// The default group timeouts, not the tests' quick ones: the rejoin
	// after the outage is timed as a deployed consumer does it.
	c := b.newConsumer(t, "recovery", b.handler("recovery", nil), WithBackoff(40*time.Second, time.Minute),
		WithGroupTimeouts(DefaultHeartbeatInterval, DefaultSessionTimeout, DefaultRebalanceTimeout))
	start(t, c)
	b.produce(t, recoveryMessages(t, b, 0, 30)...)
	waitEffects(t, b.pool, 30, time.Minute)

	down.Store(true)
	testenv.WaitFor(t, time.Minute, "the partitions to stop", func() (bool, string) {
		h := c.Health()
		return h.Partitions == 0, h.String()
	})
	testenv.WaitFor(t, time.Minute, "/readyz to say the brokers are unreachable", func() (bool, string) {
		code, body := probeHandler(t, c.ReadyHandler())
		return code == http.StatusServiceUnavailable && strings.Contains(body, "kafka unreachable"), body
	})
	time.Sleep(DefaultSessionTimeout + time.Second)
	down.Store(false)
	back := time.Now()
	b.produce(t, recoveryMessages(t, b, 30, 30)...)
	waitEffects(t, b.pool, 60, time.Minute)
	resumed := time.Since(back)
	testenv.WaitFor(t, time.Minute, "/readyz to say ready again", func() (bool, string) {
		code, body := probeHandler(t, c.ReadyHandler())
		return code == http.StatusOK, body
	})
	t.Logf("events produced after the outage applied %v after the brokers came back", resumed.Round(time.Millisecond))
	if resumed > resumeBound {
		t.Fatalf("the consumer resumed %v after the brokers came back, want within %v", resumed.Round(time.Millisecond), resumeBound)
	}
	if n := query(t, b.pool, `SELECT count(DISTINCT n) FROM effects`); n != 60 {
		t.Fatalf("%d distinct events applied, want 60", n)
	}
}
