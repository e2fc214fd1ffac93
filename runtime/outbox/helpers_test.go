package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

func TestMain(m *testing.M) { servers.Main(m) }

// testEvent is the runtime tests' hand-written event; seq numbers a key's
// events.
type testEvent = testenv.Event

func descriptorFor(topic string) *events.Descriptor { return testenv.Descriptor(topic) }

func newEvent(d *events.Descriptor, key string, seq int) testEvent {
	return testenv.NewEvent(d, key, seq)
}

// sequence builds n events over keys, numbering each key's events from 0 in
// order, and returns them with the count per key.
func sequence(d *events.Descriptor, n, keys int) ([]events.Event, map[string]int) {
	evs := make([]events.Event, n)
	count := map[string]int{}
	for i := range n {
		k := fmt.Sprintf("key-%02d", i%keys)
		evs[i] = newEvent(d, k, count[k])
		count[k]++
	}
	return evs, count
}

// bundle is one test's outbox, Kafka cluster and topic.
type bundle struct {
	pool    *pgxpool.Pool
	kafka   *kafkacluster.Cluster
	topic   string
	d       *events.Descriptor
	writer  *Writer
	parts   int
	brokers []string
}

func setup(t testing.TB, fake bool, partitions int) *bundle {
	t.Helper()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var c *kafkacluster.Cluster
	if fake {
		c = servers.FakeKafka(t)
	} else {
		c = servers.Kafka(t)
	}
	topic := servers.Topic(t, "outbox")
	if err := c.CreateTopics(ctx, partitions, topic); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, kafka: c, topic: topic, d: descriptorFor(topic), writer: w, parts: partitions, brokers: c.Brokers}
}

// write inserts evs in one committed transaction.
func (b *bundle) write(t testing.TB, evs []events.Event) []events.EventID {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ids, err := b.writer.WriteBatch(ctx, tx, evs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// quietLogger keeps the relays' expected retry warnings out of test output
// unless -v is given.
func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.DiscardHandler)
}

// runningRelay is a relay started by a test.
type runningRelay struct {
	cancel    context.CancelFunc
	done      chan error
	published atomic.Int64
	failures  atomic.Int64
	lanes     atomic.Int64
	pending   atomic.Int64 // last Hooks.Pending report, -1 before the first
	batches   atomic.Int64
}

// stop cancels the relay and returns what Run returned.
func (r *runningRelay) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop within 30s")
		return nil
	}
}

// startRelay runs a relay with fast test settings until the test ends.
func (b *bundle) startRelay(t testing.TB, opts ...RelayOption) *runningRelay {
	t.Helper()
	return b.startRelayIn(t, context.Background(), opts...)
}

// startRelayIn is startRelay with Run's context derived from parent, which
// may arm fault points (faultinject.Relay).
func (b *bundle) startRelayIn(t testing.TB, parent context.Context, opts ...RelayOption) *runningRelay {
	t.Helper()
	rr := &runningRelay{done: make(chan error, 1)}
	rr.pending.Store(-1)
	base := []RelayOption{
		WithLogger(quietLogger()),
		WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		WithRebalanceInterval(100 * time.Millisecond),
		WithHooks(Hooks{
			Published:     func(n int) { rr.published.Add(int64(n)) },
			PublishFailed: func(error) { rr.failures.Add(1) },
			Lanes:         func(n int) { rr.lanes.Store(int64(n)) },
			Pending:       func(n int64, _ time.Duration) { rr.pending.Store(n) },
			Batch:         func(int) { rr.batches.Add(1) },
		}),
	}
	r, err := NewRelay(b.pool, b.brokers, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(parent)
	rr.cancel = cancel
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		if err := rr.stop(t); err != nil && !errors.Is(err, errCrash) {
			t.Errorf("relay: %v", err)
		}
	})
	return rr
}

var errCrash = errors.New("simulated crash")

// waitDrained waits until the outbox has no pending rows.
func (b *bundle) waitDrained(t testing.TB, timeout time.Duration) {
	t.Helper()
	// The timeout only bounds a hang: on a loaded machine everything takes
	// longer, and the tests wait on the condition, not on speed.
	timeout = max(timeout, 3*time.Minute)
	deadline := time.Now().Add(timeout)
	for {
		st, err := Status(context.Background(), b.pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox not drained after %v: %+v", timeout, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// delivered is one message read back from Kafka.
type delivered = testenv.Delivered

// readAll reads every message of the bundle's topic (testenv.ReadTopic).
func (b *bundle) readAll(t testing.TB) [][]delivered {
	t.Helper()
	return testenv.ReadTopic(t, b.brokers, b.topic, b.parts)
}

// checkDelivery is testenv.CheckDelivery.
func checkDelivery(t testing.TB, parts [][]delivered, want map[string]int) int {
	t.Helper()
	return testenv.CheckDelivery(t, parts, want)
}

// bundleOnOwnCluster returns a bundle on a Postgres cluster of the test's
// own (to stop and start: outage tests) and on kc, with a topic of 3
// partitions, and the cluster.
func bundleOnOwnCluster(t *testing.T, ctx context.Context, kc *kafkacluster.Cluster) (*pgcluster.Cluster, *bundle) {
	t.Helper()
	c, pool := testenv.OwnCluster(t, ctx)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	topic := servers.Topic(t, "outbox")
	if err := kc.CreateTopics(ctx, 3, topic); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	return c, &bundle{pool: pool, kafka: kc, topic: topic, d: descriptorFor(topic), writer: w, parts: 3, brokers: kc.Brokers}
}
