// Package eventstest is the test kit for code built on protoevents, modelled
// on River's rivertest: it gives a test a real Postgres schema of its own,
// migrated with the outbox and the consumers' dedup table, and a Kafka
// cluster spoken to over the wire protocol, plus helpers to publish a typed
// event, run a consumer until it has applied N events, run the relay until
// the outbox is drained, read a dead-letter topic and look at outbox rows.
//
// Postgres is $PROTOEVENTS_TEST_DATABASE_URL when set (each test gets a
// schema on it, dropped at the end), else a throwaway cluster started once per
// test binary with the machine's initdb and pg_ctl. Kafka is
// $PROTOEVENTS_KAFKA_BROKERS when set, else an in-process kfake cluster per
// test, reached over loopback TCP. Nothing is stubbed: the code under test
// talks to the same servers it meets in production.
//
// Call Main from TestMain so a throwaway server is stopped at the end:
//
//	func TestMain(m *testing.M) { eventstest.Main(m) }
//
//	func TestShippingCreatesShipment(t *testing.T) {
//		env := eventstest.New(t)
//		c := env.NewConsumer(t, "shipping")
//		if err := ordersv1.HandleOrderPlaced(c, shipping.Handle); err != nil {
//			t.Fatal(err)
//		}
//		env.Publish(t, &ordersv1.OrderPlaced{OrderId: "o-1"})
//		env.ConsumeUntil(t, c, "shipping", 1)
//		// assert on the shipments table through env.DB
//	}
package eventstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/topics"
)

// DefaultTimeout bounds every wait of an Env (ConsumeUntil, Relay, DLQ):
// generous, because tests run on loaded CI machines; the waits return as
// soon as their condition holds.
const DefaultTimeout = 2 * time.Minute

// Env is one test's environment: a migrated schema, a Kafka cluster and a
// writer. Build it with New; it is torn down when the test ends.
type Env struct {
	// DB is a pool on the test's own schema, where the outbox and the dedup
	// table (consumed_events) exist.
	DB *pgxpool.Pool
	// Schema is the schema's name.
	Schema string
	// Kafka is the cluster; Brokers its bootstrap addresses.
	Kafka   *kafkacluster.Cluster
	Brokers []string
	// Writer writes into the outbox, as generated producers do.
	Writer *outbox.Writer

	cfg     config
	mu      sync.Mutex
	ensured map[string]bool
	runErr  error // the first error a Runner stopped with on its own
	kw      *kafka.Writer
}

type config struct {
	format     envelope.Format
	fake       bool
	partitions int
	timeout    time.Duration
}

// Option changes how New builds an Env.
type Option func(*config)

// WithFormat sets the wire format of the envelopes Publish and Writer
// produce (default envelope.FormatJSON).
func WithFormat(f envelope.Format) Option { return func(c *config) { c.format = f } }

// WithOwnKafka gives the Env a Kafka cluster of its own (OwnKafka)
// even when $PROTOEVENTS_KAFKA_BROKERS names a shared one: for tests whose
// topics and consumer groups have fixed names (generated events), which
// would meet other runs' messages on a shared cluster.
func WithOwnKafka() Option { return func(c *config) { c.fake = true } }

// WithPartitions sets the partition count of the topics the Env creates
// (default 3).
func WithPartitions(n int) Option { return func(c *config) { c.partitions = n } }

// WithTimeout bounds the Env's waits (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// New returns a test environment: a schema of the test's own, migrated with
// outbox.Migrate and consumer.Migrate, and a Kafka cluster.
func New(t testing.TB, opts ...Option) *Env {
	t.Helper()
	cfg := config{format: envelope.FormatJSON, partitions: 3, timeout: DefaultTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	pool, schema := DB(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	if err := consumer.Migrate(ctx, pool); err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	var k *kafkacluster.Cluster
	if cfg.fake {
		k = OwnKafka(t)
	} else {
		k = Kafka(t)
	}
	w, err := outbox.NewWriter(outbox.WithFormat(cfg.format))
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	e := &Env{DB: pool, Schema: schema, Kafka: k, Brokers: k.Brokers, Writer: w, cfg: cfg, ensured: map[string]bool{}}
	// The relay's partitioner (Java-client compatible murmur2), so a key lands
	// on the partition it would in production.
	e.kw = &kafka.Writer{Addr: kafka.TCP(k.Brokers...), Balancer: kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	t.Cleanup(func() { _ = e.kw.Close() })
	return e
}

func (e *Env) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), e.cfg.timeout)
}

// NewConsumer returns a consumer named name on the Env's pool and brokers,
// without handlers: register them with Handle (or the generated
// Handle<Event> functions), then run it with Start or ConsumeUntil. An
// invalid option fails the test.
func (e *Env) NewConsumer(t testing.TB, name string, opts ...consumer.Option) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(e.DB, e.Brokers, name, opts...)
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	return c
}

// CreateTopics creates the topics and dead-letter topics of the described
// events, unless they exist. Publish, Produce and Relay call it for the
// events they see, so tests rarely need it.
func (e *Env) CreateTopics(t testing.TB, ds ...*events.Descriptor) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	var todo []*events.Descriptor
	for _, d := range ds {
		if !e.ensured[d.Type+"\x00"+d.Topic] {
			todo = append(todo, d)
		}
	}
	if len(todo) == 0 {
		return
	}
	ctx, cancel := e.context()
	defer cancel()
	if _, err := topics.Ensure(ctx, e.Brokers, topics.Config{Partitions: e.cfg.partitions}, todo...); err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	for _, d := range todo {
		e.ensured[d.Type+"\x00"+d.Topic] = true
	}
}

// Publish sends ev straight to its Kafka topic, encoded exactly as the relay
// sends an outbox row (key, envelope value, ce_* headers), and returns its
// event ID: the way to feed a consumer under test.
func (e *Env) Publish(t testing.TB, ev events.Event, opts ...events.PublishOption) events.EventID {
	t.Helper()
	d := ev.EventDescriptor()
	e.CreateTopics(t, d)
	env, err := envelope.New(ev, events.ApplyPublishOptions(opts), envelope.Options{Format: e.cfg.format})
	if err != nil {
		t.Fatalf("eventstest: publish: %v", err)
	}
	value, headers, err := env.Encode()
	if err != nil {
		t.Fatalf("eventstest: publish: %v", err)
	}
	ctx, cancel := e.context()
	defer cancel()
	msg := kafka.Message{Topic: d.Topic, Key: env.Key, Value: value, Headers: headers}
	if err := e.kw.WriteMessages(ctx, msg); err != nil {
		t.Fatalf("eventstest: publish %s to %s: %v", d.Type, d.Topic, err)
	}
	return env.EventID
}

// Produce writes ev into the outbox in a transaction of its own, as a
// generated producer does, and returns its event ID. Relay then sends it.
func (e *Env) Produce(t testing.TB, ev events.Event, opts ...events.PublishOption) events.EventID {
	t.Helper()
	e.CreateTopics(t, ev.EventDescriptor())
	ctx, cancel := e.context()
	defer cancel()
	var id events.EventID
	err := pgx.BeginFunc(ctx, e.DB, func(tx pgx.Tx) error {
		var err error
		id, err = e.Writer.Write(ctx, tx, ev, opts...)
		return err
	})
	if err != nil {
		t.Fatalf("eventstest: produce: %v", err)
	}
	return id
}

// Relay runs an outbox relay until no row of the outbox is pending, then
// stops it. The topics of the pending rows must exist: rows written by
// Produce have theirs; for rows written by your own code, call CreateTopics.
func (e *Env) Relay(t testing.TB) {
	t.Helper()
	r, err := outbox.NewRelay(e.DB, e.Brokers, outbox.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatalf("eventstest: relay: %v", err)
	}
	stop := e.Start(t, r)
	e.waitFor(t, "the outbox has no pending rows", func(ctx context.Context) (bool, error) {
		st, err := outbox.Status(ctx, e.DB)
		return err == nil && st.Pending == 0, err
	})
	stop()
}

// ConsumeUntil runs c until the consumer named name (the name c was built with) has
// applied at least n events in total, counted in the dedup table, then stops
// it. A consumer that fails, or does not get there within the Env's timeout,
// fails the test. To keep a consumer running while waiting for something
// else (a dead letter, say), use Start and WaitApplied.
func (e *Env) ConsumeUntil(t testing.TB, c Runner, name string, n int) {
	t.Helper()
	stop := e.Start(t, c)
	e.WaitApplied(t, name, n)
	stop()
}

// Runner is what Start runs: a *consumer.Consumer or an *outbox.Relay.
type Runner interface {
	Run(ctx context.Context) error
}

// Start runs r in the background until the returned stop is called or the
// test ends, whichever comes first; stop cancels r and waits for it to
// return. An error from r other than its cancellation fails the test.
func (e *Env) Start(t testing.TB, r Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := r.Run(ctx)
		if err != nil && ctx.Err() == nil {
			e.mu.Lock()
			if e.runErr == nil {
				e.runErr = fmt.Errorf("%T stopped: %w", r, err)
			}
			e.mu.Unlock()
		}
		done <- err
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("eventstest: %T stopped with an error: %v", r, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// WaitApplied waits until the consumer named name has applied at least n
// events in total (its rows in the dedup table); the consumer must be
// running (Start).
func (e *Env) WaitApplied(t testing.TB, name string, n int) {
	t.Helper()
	e.waitFor(t, fmt.Sprintf("%s has applied %d events", name, n), func(ctx context.Context) (bool, error) {
		got, err := e.Applied(ctx, name)
		return got >= n, err
	})
}

// Applied counts the events the consumer named name has applied (its rows in
// the dedup table).
func (e *Env) Applied(ctx context.Context, name string) (int, error) {
	var n int
	if err := e.DB.QueryRow(ctx, sqlApplied, name).Scan(&n); err != nil {
		return 0, fmt.Errorf("eventstest: count events applied by %s: %w", name, err)
	}
	return n, nil
}

// waitFor polls cond until it holds, failing the test after the Env's
// timeout.
func (e *Env) waitFor(t testing.TB, what string, cond func(context.Context) (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(e.cfg.timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		e.mu.Lock()
		runErr := e.runErr
		e.mu.Unlock()
		if runErr != nil {
			t.Fatalf("eventstest: waiting until %s: %v", what, runErr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := cond(ctx)
		cancel()
		if ok {
			return
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("eventstest: not true after %v: %s (last error: %v)", e.cfg.timeout, what, lastErr)
}

// DLQ waits until the dead-letter topic holds at least n messages and
// returns them all, decoded with consumer.ListDLQ.
func (e *Env) DLQ(t testing.TB, dlqTopic string, n int) []consumer.DLQEntry {
	t.Helper()
	var got []consumer.DLQEntry
	e.waitFor(t, fmt.Sprintf("DLQ %s holds %d messages", dlqTopic, n), func(ctx context.Context) (bool, error) {
		var err error
		got, err = consumer.ListDLQ(ctx, e.Brokers, dlqTopic)
		return err == nil && len(got) >= n, err
	})
	return got
}

// OutboxRow is one row of the outbox, with its envelope decoded.
type OutboxRow struct {
	// ID is the row's publish order.
	ID int64
	// Topic is where the relay sends the row.
	Topic string
	// Envelope is the decoded event: metadata, key and payload.
	Envelope *envelope.Envelope
	// Published tells whether the relay has sent the row.
	Published bool
}

// Unmarshal decodes the row's payload into dst, a message of the row's event
// type.
func (r OutboxRow) Unmarshal(dst proto.Message) error { return r.Envelope.UnmarshalPayload(dst) }

// OutboxRows returns the rows of the outbox in publish order, so a test can
// assert on what a producer wrote (and, above all, on what it did not write
// when its transaction rolled back).
func (e *Env) OutboxRows(t testing.TB) []OutboxRow {
	t.Helper()
	ctx, cancel := e.context()
	defer cancel()
	rows, err := e.DB.Query(ctx, sqlOutboxRows)
	if err != nil {
		t.Fatalf("eventstest: read outbox: %v", err)
	}
	var out []OutboxRow
	for rows.Next() {
		var (
			r          OutboxRow
			key, value []byte
			headers    []byte
		)
		if err := rows.Scan(&r.ID, &r.Topic, &key, &value, &headers, &r.Published); err != nil {
			t.Fatalf("eventstest: read outbox: %v", err)
		}
		var pairs [][2]string
		if err := json.Unmarshal(headers, &pairs); err != nil {
			t.Fatalf("eventstest: outbox row %d: headers: %v", r.ID, err)
		}
		m := kafka.Message{Topic: r.Topic, Key: key, Value: value}
		for _, p := range pairs {
			m.Headers = append(m.Headers, kafka.Header{Key: p[0], Value: []byte(p[1])})
		}
		if r.Envelope, err = envelope.Decode(m); err != nil {
			t.Fatalf("eventstest: outbox row %d: %v", r.ID, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("eventstest: read outbox: %v", err)
	}
	return out
}

// The kit's SQL: the default tables that New migrates, found on the test
// schema's search_path.
const (
	sqlApplied    = `SELECT count(*) FROM consumed_events WHERE consumer = $1`
	sqlOutboxRows = `SELECT id, topic, key, value, headers, published_at IS NOT NULL FROM outbox ORDER BY id`
)
