package walrelay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// EnvLogicalDatabaseURL names a server with wal_level = logical for these
// tests to use instead of starting clusters of their own (each test then
// takes a database of its own on it). The shared test server runs
// wal_level = replica, so by default every test starts a throwaway
// cluster.
const EnvLogicalDatabaseURL = "PROTOEVENTS_TEST_LOGICAL_DATABASE_URL"

// bundle is one test's database (wal_level = logical), Kafka, topic and
// WAL-source Writer.
type bundle struct {
	cluster *pgcluster.Cluster // nil on a server given by the environment
	pool    *pgxpool.Pool
	kafka   *kafkacluster.Cluster
	topic   string
	d       *events.Descriptor
	writer  *outbox.Writer
	parts   int
	brokers []string
	slot    string
}

var dbSeq atomic.Int64

// logicalDB returns a database on a server with wal_level = logical: a
// cluster of the test's own, or a new database on the server the
// environment names.
func logicalDB(t testing.TB, opts ...pgcluster.Option) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := os.Getenv(EnvLogicalDatabaseURL)
	if url == "" {
		return testenv.OwnCluster(t, ctx, append([]pgcluster.Option{pgcluster.WithSetting("wal_level", "logical")}, opts...)...)
	}
	name := fmt.Sprintf("walrelay_%d_%d", os.Getpid(), dbSeq.Add(1))
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		_, _ = conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return nil, pool
}

// setup makes a test's bundle; opts are settings for a cluster of its own.
func setup(t testing.TB, partitions int, opts ...pgcluster.Option) *bundle {
	t.Helper()
	return setupOn(t, partitions, servers.Kafka(t), opts...)
}

// setupOn is setup on a given Kafka cluster.
func setupOn(t testing.TB, partitions int, kc *kafkacluster.Cluster, opts ...pgcluster.Option) *bundle {
	t.Helper()
	ctx := context.Background()
	cluster, pool := logicalDB(t, opts...)
	b := &bundle{cluster: cluster, pool: pool, kafka: kc, parts: partitions, slot: DefaultSlot}
	b.brokers = b.kafka.Brokers
	b.topic = servers.Topic(t, "walrelay")
	if err := b.kafka.CreateTopics(ctx, partitions, b.topic); err != nil {
		t.Fatal(err)
	}
	b.d = testenv.Descriptor(b.topic)
	if err := Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(outbox.WithWALSource(b.slot))
	if err != nil {
		t.Fatal(err)
	}
	b.writer = w
	return b
}

// sequence builds n events over keys, numbering each key's events from 0.
func sequence(d *events.Descriptor, n, keys int) ([]events.Event, map[string]int) {
	evs := make([]events.Event, n)
	count := map[string]int{}
	for i := range n {
		k := fmt.Sprintf("key-%02d", i%keys)
		evs[i] = testenv.NewEvent(d, k, count[k])
		count[k]++
	}
	return evs, count
}

// write commits evs in transactions of per events each, alternating a
// plain pgx.Tx and an outbox.CommitTx.
func (b *bundle) write(t testing.TB, evs []events.Event, per int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < len(evs); i += per {
		chunk := evs[i:min(i+per, len(evs))]
		begin := func(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, pool, fn)
		}
		if (i/per)%2 == 1 {
			begin = outbox.BeginFunc
		}
		if err := begin(ctx, b.pool, func(tx pgx.Tx) error {
			if len(chunk) == 1 {
				_, err := b.writer.Write(ctx, tx, chunk[0])
				return err
			}
			_, err := b.writer.WriteBatch(ctx, tx, chunk)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// runningRelay is a relay running in the test's process.
type runningRelay struct {
	r         *Relay
	cancel    context.CancelFunc
	done      chan error
	published atomic.Int64
	failures  atomic.Int64
}

func quietLogger() *slog.Logger {
	level := slog.LevelError + 1
	if testing.Verbose() {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// testOptions are the fast settings the tests run relays with.
func (b *bundle) testOptions(rr *runningRelay) []Option {
	return []Option{
		WithSlot(b.slot), WithLogger(quietLogger()), WithStatusInterval(100 * time.Millisecond),
		WithHeartbeat(100 * time.Millisecond), WithStandbyRetry(100 * time.Millisecond),
		WithHooks(Hooks{
			Published:     func(n int) { rr.published.Add(int64(n)) },
			PublishFailed: func(error) { rr.failures.Add(1) },
		}),
	}
}

func (b *bundle) startRelay(t testing.TB, opts ...Option) *runningRelay {
	t.Helper()
	rr := &runningRelay{done: make(chan error, 1)}
	r, err := New(b.pool, b.brokers, append(b.testOptions(rr), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	rr.r = r
	ctx, cancel := context.WithCancel(context.Background())
	rr.cancel = cancel
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		if err := rr.stop(t); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return rr
}

// stop cancels the relay and returns what Run returned.
func (rr *runningRelay) stop(t testing.TB) error {
	t.Helper()
	rr.cancel()
	select {
	case err := <-rr.done:
		rr.done <- err
		return err
	case <-time.After(time.Minute):
		t.Fatal("relay did not stop within a minute")
		return nil
	}
}

// waitFor polls cond until it holds; the deadline only bounds a hang.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitConfirmed waits until the slot has confirmed everything written so
// far: every event committed before the call is then acknowledged by
// Kafka (the heartbeats move the position past the last commit). The
// target is the insert position, not pg_current_wal_lsn's write position,
// which lags the last commit under synchronous_commit = off.
func (b *bundle) waitConfirmed(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	var now string
	if err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	target, err := pglogrepl.ParseLSN(now)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the slot to confirm "+now, func() bool {
		st, err := SlotStatus(ctx, b.pool, WithSlot(b.slot))
		if err != nil || !st.Exists {
			return false
		}
		got, err := pglogrepl.ParseLSN(st.Confirmed)
		return err == nil && got >= target
	})
}

func (b *bundle) readAll(t testing.TB) [][]testenv.Delivered {
	t.Helper()
	return testenv.ReadTopic(t, b.brokers, b.topic, b.parts)
}

func TestMain(m *testing.M) { servers.Main(m) }
