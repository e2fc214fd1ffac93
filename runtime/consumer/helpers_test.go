package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

func TestMain(m *testing.M) { servers.Main(m) }

// testEvent is the runtime tests' hand-written event; seq numbers a key's
// events.
type testEvent = testenv.Event

func descriptorFor(topic string) *events.Descriptor { return testenv.Descriptor(topic) }

// bundle is one test's world: a schema with the dedup and effects tables,
// a Kafka cluster, and a topic with its DLQ.
type bundle struct {
	pool    *pgxpool.Pool
	schema  string
	kafka   *kafkacluster.Cluster
	topic   string
	d       *events.Descriptor
	effects string // SQL inserting one effect row
}

func setup(t testing.TB, partitions int) *bundle {
	t.Helper()
	return setupOn(t, partitions, servers.Kafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond)))
}

// setupOn is setup on a given cluster.
func setupOn(t testing.TB, partitions int, kc *kafkacluster.Cluster) *bundle {
	t.Helper()
	pool, schema := servers.DB(t)
	b := &bundle{pool: pool, schema: schema, kafka: kc, topic: servers.Topic(t, "consumer")}
	b.d = descriptorFor(b.topic)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kc.CreateTopics(ctx, partitions, b.topic, b.d.DLQTopic); err != nil {
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
	return b
}

// event returns a test event with key k and number n.
func (b *bundle) event(t testing.TB, k string, n int) testEvent {
	t.Helper()
	return testenv.NewEvent(b.d, k, n)
}

// message encodes ev as the Kafka message the relay would produce.
func message(t testing.TB, ev testEvent, edit func(*envelope.Envelope)) kafka.Message {
	t.Helper()
	env, err := envelope.New(ev, events.PublishOptions{}, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(env)
	}
	value, headers, err := env.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return kafka.Message{Key: env.Key, Value: value, Headers: headers}
}

// produce writes msgs to the topic, keyed, in order.
func (b *bundle) produce(t testing.TB, msgs ...kafka.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(b.kafka.Brokers...), Topic: b.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 500}
	defer w.Close()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// handler records every applied event in the effects table, in the dedup
// transaction; fail, if set, decides whether an event fails instead.
func (b *bundle) handler(name string, fail func(ev testEvent, meta events.Meta) error) testHandler {
	return bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		if fail != nil {
			if err := fail(ev, meta); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id, k, n, part, off) VALUES ($1, $2, $3, $4, $5, $6)`,
			name, meta.EventID.String(), string(ev.EventKey()), ev.Seq(), meta.Partition, meta.Offset)
		return err
	})
}

// fastOptions make retries and group changes quick in tests.
func fastOptions() []Option {
	return []Option{
		WithBackoff(2*time.Millisecond, 10*time.Millisecond),
		WithGroupTimeouts(100*time.Millisecond, time.Second, 2*time.Second),
		withMaxWait(50 * time.Millisecond),
		WithLogger(testLogger()),
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("PROTOEVENTS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testHandler is a handler of the test event type and its descriptor, as
// newConsumer registers it with Handle.
type testHandler struct {
	d  *events.Descriptor
	fn func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error
}

func bind(d *events.Descriptor, fn func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error) testHandler {
	return testHandler{d: d, fn: fn}
}

// newConsumer returns a consumer named name on the bundle's pool and
// brokers with the single handler h.
func (b *bundle) newConsumer(t testing.TB, name string, h testHandler, opts ...Option) *Consumer {
	t.Helper()
	return newConsumerOn(t, b.pool, b.kafka, name, h, append(fastOptions(), opts...)...)
}

// newConsumerOn is New plus Handle(h), failing the test on an error. Its
// group is the cluster's Group(name), so tests sharing a real cluster keep
// to groups of their own; an option may set another.
func newConsumerOn(t testing.TB, pool *pgxpool.Pool, kc *kafkacluster.Cluster, name string, h testHandler, opts ...Option) *Consumer {
	t.Helper()
	c, err := New(pool, kc.Brokers, name, append([]Option{WithGroupID(kc.Group(name))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := Handle(c, h.d, h.fn); err != nil {
		t.Fatal(err)
	}
	return c
}

// running is a consumer started by start.
type running struct {
	cancel context.CancelFunc
	errc   chan error
	once   sync.Once
	err    error
}

// start runs c until stop (or the test's end).
func start(t testing.TB, c *Consumer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- c.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func (r *running) stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.errc
	})
	return r.err
}

// counter counts hook calls.
type counter struct{ n atomic.Int64 }

func (c *counter) inc()       { c.n.Add(1) }
func (c *counter) get() int64 { return c.n.Load() }

// query returns one int64.
func query(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// effectsAtLeast waits until the effects table has n rows.
func (b *bundle) effectsAtLeast(t testing.TB, n int64, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, fmt.Sprintf("%d effects", n), func() (bool, string) {
		got := query(t, b.pool, `SELECT count(*) FROM effects`)
		return got >= n, fmt.Sprintf("have %d", got)
	})
}

// dlqEntries waits until the DLQ holds n entries and returns them.
func (b *bundle) dlqEntries(t testing.TB, n int, timeout time.Duration) []DLQEntry {
	t.Helper()
	var got []DLQEntry
	testenv.WaitFor(t, timeout, fmt.Sprintf("%d DLQ entries", n), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		got, err = ListDLQ(ctx, b.kafka.Brokers, b.d.DLQTopic)
		if err != nil {
			return false, err.Error()
		}
		return len(got) >= n, fmt.Sprintf("have %d", len(got))
	})
	return got
}
