package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/structpb"

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
type delivered struct {
	partition int
	offset    int64
	key       string
	seq       int
	id        events.EventID
}

// readAll reads every message of the topic, partition by partition, each in
// log order. It fetches with plain Fetch requests from offset 0 to the end
// offset, so it waits only on the broker's answers; the deadline bounds a
// hang, generously, for loaded machines.
func (b *bundle) readAll(t testing.TB) [][]delivered {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Timeout: time.Minute}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range b.parts {
		req.Topics[b.topic] = append(req.Topics[b.topic], kafka.LastOffsetOf(p))
	}
	resp, err := cl.ListOffsets(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]delivered, b.parts)
	var wg sync.WaitGroup
	errs := make(chan error, b.parts)
	for _, po := range resp.Topics[b.topic] {
		if po.Error != nil {
			t.Fatal(po.Error)
		}
		if po.LastOffset == 0 {
			continue
		}
		wg.Add(1)
		go func(p int, end int64) {
			defer wg.Done()
			msgs, err := fetchPartition(ctx, cl, b.topic, p, end)
			if err != nil {
				errs <- fmt.Errorf("partition %d: %w", p, err)
				return
			}
			for _, m := range msgs {
				env, err := envelope.Decode(m)
				if err != nil {
					errs <- fmt.Errorf("partition %d offset %d: %w", p, m.Offset, err)
					return
				}
				var s structpb.Struct
				if err := env.UnmarshalPayload(&s); err != nil {
					errs <- err
					return
				}
				if got := s.Fields["key"].GetStringValue(); got != string(m.Key) {
					errs <- fmt.Errorf("message key %q but payload key %q", m.Key, got)
					return
				}
				out[p] = append(out[p], delivered{partition: p, offset: m.Offset, key: string(m.Key), seq: int(s.Fields["seq"].GetNumberValue()), id: env.EventID})
			}
		}(po.Partition, po.LastOffset)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// fetchPartition returns the messages of a partition from offset 0 up to
// end, in log order, retrying failed fetches until ctx ends.
func fetchPartition(ctx context.Context, cl *kafka.Client, topic string, p int, end int64) ([]kafka.Message, error) {
	var msgs []kafka.Message
	offset := int64(0)
	for offset < end {
		resp, err := cl.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: p, Offset: offset, MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 100 * time.Millisecond})
		if err == nil && resp.Error != nil {
			err = resp.Error
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("fetch at offset %d of %d: %w", offset, end, err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for {
			rec, err := resp.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("read record at offset %d: %w", offset, err)
			}
			if rec.Offset < offset {
				continue
			}
			key, err := kafka.ReadAll(rec.Key)
			if err != nil {
				return nil, err
			}
			value, err := kafka.ReadAll(rec.Value)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, kafka.Message{Topic: topic, Partition: p, Offset: rec.Offset, Key: key, Value: value, Headers: rec.Headers})
			offset = rec.Offset + 1
		}
	}
	return msgs, nil
}

// checkDelivery asserts that what Kafka holds is exactly the events of want
// (count per key), each key on one partition, in per-key order once
// duplicates (same event ID, re-sent after a failure) are dropped the way a
// consumer's dedup table would. It returns the number of duplicates.
func checkDelivery(t testing.TB, parts [][]delivered, want map[string]int) int {
	t.Helper()
	next := map[string]int{}
	partOf := map[string]int{}
	seen := map[events.EventID]delivered{}
	dups := 0
	for _, msgs := range parts {
		for _, m := range msgs {
			if p, ok := partOf[m.key]; ok && p != m.partition {
				t.Fatalf("key %s on partitions %d and %d", m.key, p, m.partition)
			}
			partOf[m.key] = m.partition
			if first, ok := seen[m.id]; ok {
				if first.key != m.key || first.seq != m.seq {
					t.Fatalf("event %s delivered as %s/%d and %s/%d", m.id, first.key, first.seq, m.key, m.seq)
				}
				dups++
				continue
			}
			seen[m.id] = m
			if m.seq != next[m.key] {
				t.Fatalf("key %s: got seq %d at partition %d offset %d, want %d (order broken or event lost)", m.key, m.seq, m.partition, m.offset, next[m.key])
			}
			next[m.key]++
		}
	}
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if next[k] != want[k] {
			t.Errorf("key %s: %d events delivered, want %d", k, next[k], want[k])
		}
	}
	for k := range next {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected key %s delivered (%d events)", k, next[k])
		}
	}
	return dups
}
