package brokerfaults

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/apachekafka"
	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/topics"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

func TestMain(m *testing.M) { servers.Main(m) }

// relayKind picks the relay a pipeline runs.
type relayKind string

const (
	pollingRelay relayKind = "polling"
	walRelay     relayKind = "wal"
)

// Number of keys the writers spread events over, and the topic's
// partitions at the start.
const (
	keys       = 24
	partitions = 3
)

// pipeline is one test's world: a three-node Kafka cluster, a database,
// writers committing keyed events into the outbox, a relay and a
// consumer applying each event to an effects table in its dedup
// transaction.
type pipeline struct {
	t       *testing.T
	kafka   *apachekafka.Cluster
	brokers []string
	pool    *pgxpool.Pool
	d       *events.Descriptor
	writer  *outbox.Writer
	begin   func(context.Context, *pgxpool.Pool, func(pgx.Tx) error) error

	relayHealth func() (ready bool, why string)
	published   atomic.Int64 // unix nanoseconds of the relay's last acknowledged publish
	consumer    *consumer.Consumer

	logs *capture // what the relay and the consumer logged
	// reorderAllowed makes check count per-key order breaks instead of
	// failing on them (a grown topic: see TestPartitionsGrow).
	reorderAllowed bool

	mu        sync.Mutex
	written   map[string]int // events committed per key
	stop      chan struct{}  // closed to stop the writers
	writers   sync.WaitGroup
	writeErrs atomic.Int64
}

// capture keeps the records logged at Info and above (as "LEVEL message
// key=value ..."), and passes records on to stderr as the test's verbosity
// asks.
type capture struct {
	slog.Handler
	mu   *sync.Mutex
	msgs *[]string
}

func newCapture() *capture {
	level := slog.LevelError + 1
	if os.Getenv("PROTOEVENTS_TEST_LOG") != "" {
		level = slog.LevelDebug
	} else if testing.Verbose() {
		level = slog.LevelWarn
	}
	return &capture{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}), mu: &sync.Mutex{}, msgs: new([]string)}
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }

func (c *capture) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelInfo {
		line := r.Level.String() + " " + r.Message
		r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
		c.mu.Lock()
		*c.msgs = append(*c.msgs, line)
		c.mu.Unlock()
	}
	if c.Handler.Enabled(ctx, r.Level) {
		return c.Handler.Handle(ctx, r)
	}
	return nil
}

func (c *capture) WithAttrs(as []slog.Attr) slog.Handler {
	return &capture{Handler: c.Handler.WithAttrs(as), mu: c.mu, msgs: c.msgs}
}

func (c *capture) WithGroup(name string) slog.Handler {
	return &capture{Handler: c.Handler.WithGroup(name), mu: c.mu, msgs: c.msgs}
}

// logged reports whether a record containing every one of parts was
// logged.
func (c *capture) logged(parts ...string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range *c.msgs {
		all := true
		for _, s := range parts {
			all = all && strings.Contains(m, s)
		}
		if all {
			return true
		}
	}
	return false
}

func (p *pipeline) logger() *slog.Logger { return slog.New(p.logs) }

// newPipeline starts the cluster, the database, the relay of kind and the
// consumer; writers start with write.
func newPipeline(t *testing.T, kind relayKind) *pipeline {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kc := servers.ApacheKafka(t, 3)
	p := &pipeline{t: t, kafka: kc, brokers: kc.Brokers(), written: map[string]int{}, stop: make(chan struct{}), logs: newCapture()}
	topic := servers.Topic(t, "faults")
	p.d = testenv.Descriptor(topic)
	if _, err := topics.Create(ctx, p.brokers, topics.Config{Partitions: partitions, ReplicationFactor: 3}, topic, p.d.DLQTopic); err != nil {
		t.Fatal(err)
	}
	// The controller acknowledged the topics; each broker learns of them a
	// moment later. The consumer refuses to start on a topic the broker it
	// asks does not know yet, so wait until every one knows both.
	for _, addr := range p.brokers {
		testenv.WaitFor(t, time.Minute, "broker "+addr+" to know the new topics", func() (bool, string) {
			conn, err := kafka.DialContext(ctx, "tcp", addr)
			if err != nil {
				return false, err.Error()
			}
			defer conn.Close()
			parts, err := conn.ReadPartitions(topic, p.d.DLQTopic)
			if err != nil {
				return false, err.Error()
			}
			return len(parts) == 2*partitions, fmt.Sprint(len(parts), " partitions")
		})
	}
	switch kind {
	case walRelay:
		_, p.pool = testenv.OwnCluster(t, ctx, pgcluster.WithSetting("wal_level", "logical"))
	default:
		p.pool, _ = servers.DB(t)
	}
	if err := outbox.Migrate(ctx, p.pool); err != nil {
		t.Fatal(err)
	}
	if err := consumer.Migrate(ctx, p.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, `CREATE TABLE effects (
		seq bigserial PRIMARY KEY, event_id text NOT NULL, k text NOT NULL, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p.begin = func(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, pool, fn)
	}
	var wopts []outbox.WriterOption
	if kind == walRelay {
		if err := walrelay.Setup(ctx, p.pool); err != nil {
			t.Fatal(err)
		}
		wopts = append(wopts, outbox.WithWALSource(walrelay.DefaultSlot))
		p.begin = outbox.BeginFunc
	}
	w, err := outbox.NewWriter(wopts...)
	if err != nil {
		t.Fatal(err)
	}
	p.writer = w
	p.startRelay(kind)
	p.startConsumer()
	return p
}

// run runs fn until the test ends, failing the test if it returns an
// error before that.
func (p *pipeline) run(what string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	p.t.Cleanup(func() {
		// An error Run returned on its own, before the test stopped it, is
		// a failure; after cancel, Run's return is its graceful stop.
		select {
		case err := <-done:
			p.t.Errorf("%s stopped on its own: %v", what, err)
			cancel()
			return
		default:
		}
		cancel()
		<-done
	})
}

func (p *pipeline) startRelay(kind relayKind) {
	switch kind {
	case walRelay:
		r, err := walrelay.New(p.pool, p.brokers, walrelay.WithLogger(p.logger()),
			walrelay.WithStatusInterval(100*time.Millisecond), walrelay.WithHeartbeat(100*time.Millisecond),
			walrelay.WithHooks(walrelay.Hooks{Published: func(int) { p.published.Store(time.Now().UnixNano()) }}))
		if err != nil {
			p.t.Fatal(err)
		}
		p.relayHealth = func() (bool, string) { return testenv.Ready(r.ReadyHandler()) }
		p.run("wal relay", r.Run)
	default:
		r, err := outbox.NewRelay(p.pool, p.brokers, outbox.WithLogger(p.logger()), outbox.WithHealthInterval(200*time.Millisecond),
			outbox.WithHooks(outbox.Hooks{Published: func(int) { p.published.Store(time.Now().UnixNano()) }}))
		if err != nil {
			p.t.Fatal(err)
		}
		p.relayHealth = func() (bool, string) { return testenv.Ready(r.ReadyHandler()) }
		p.run("relay", r.Run)
	}
}

func (p *pipeline) startConsumer() {
	c, err := consumer.New(p.pool, p.brokers, "faults", consumer.WithLogger(p.logger()),
		consumer.WithGroupTimeouts(500*time.Millisecond, 6*time.Second, 10*time.Second),
		consumer.WithCommitInterval(50*time.Millisecond))
	if err != nil {
		p.t.Fatal(err)
	}
	if err := consumer.Handle(c, p.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testenv.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, k, n) VALUES ($1, $2, $3)`, meta.EventID.String(), string(ev.EventKey()), ev.Seq())
		return err
	}); err != nil {
		p.t.Fatal(err)
	}
	p.consumer = c
	p.run("consumer", c.Run)
}

// write starts n writers committing one or two events per transaction,
// over the keys, until stopWriting.
func (p *pipeline) write(n int) {
	for w := range n {
		p.writers.Add(1)
		go func() {
			defer p.writers.Done()
			for i := 0; ; i++ {
				select {
				case <-p.stop:
					return
				default:
				}
				// Each writer owns its keys, so a key's numbers are
				// committed in order.
				key := fmt.Sprintf("key-%02d", (i*n+w)%keys)
				p.mu.Lock()
				seq := p.written[key]
				p.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := p.begin(ctx, p.pool, func(tx pgx.Tx) error {
					_, err := p.writer.Write(ctx, tx, testenv.NewEvent(p.d, key, seq))
					return err
				})
				cancel()
				if err != nil {
					p.writeErrs.Add(1)
					continue // not committed: the same number again
				}
				p.mu.Lock()
				p.written[key]++
				p.mu.Unlock()
				time.Sleep(2 * time.Millisecond) // a steady flow, not a flood
			}
		}()
	}
	p.t.Cleanup(p.stopWriting)
}

func (p *pipeline) stopWriting() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.writers.Wait()
}

func (p *pipeline) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.written {
		n += c
	}
	return n
}

func (p *pipeline) applied() int {
	var n int
	if err := p.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		p.t.Fatal(err)
	}
	return n
}

// progress waits until at least more events than now were applied.
func (p *pipeline) progress(more int, within time.Duration) {
	p.t.Helper()
	from := p.applied()
	testenv.WaitFor(p.t, within, fmt.Sprintf("%d more events applied", more), func() (bool, string) {
		n := p.applied()
		return n >= from+more, fmt.Sprintf("%d applied (from %d), %d written", n, from, p.total())
	})
}

// check stops the writers, waits until every committed event is applied
// and asserts the invariants: every event applied exactly once, each key's
// events in order, nothing dead-lettered, no outbox row left unpublished.
func (p *pipeline) check(within time.Duration) {
	p.t.Helper()
	p.stopWriting()
	want := p.total()
	testenv.WaitFor(p.t, within, fmt.Sprintf("all %d events applied", want), func() (bool, string) {
		n := p.applied()
		return n >= want, fmt.Sprintf("%d of %d applied; relay: %s", n, want, p.relayStatus())
	})
	ctx := context.Background()
	var total, distinct int
	if err := p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM effects`).Scan(&total, &distinct); err != nil {
		p.t.Fatal(err)
	}
	if total != want || distinct != want {
		p.t.Fatalf("applied %d effects of %d distinct events, want %d exactly once", total, distinct, want)
	}
	rows, err := p.pool.Query(ctx, `SELECT k, n FROM effects ORDER BY seq`)
	if err != nil {
		p.t.Fatal(err)
	}
	next := map[string]int{}
	byKey := map[string]int{}
	reordered := 0
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			p.t.Fatal(err)
		}
		if n != next[k] {
			if !p.reorderAllowed {
				p.t.Fatalf("key %s: event %d applied when %d was due (per-key order broken)", k, n, next[k])
			}
			reordered++
		}
		next[k] = max(next[k], n+1)
		byKey[k]++
	}
	if err := rows.Err(); err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	for k, n := range p.written {
		if byKey[k] != n || next[k] != n {
			p.t.Errorf("key %s: %d applied, %d written", k, byKey[k], n)
		}
	}
	p.mu.Unlock()
	if p.reorderAllowed {
		p.t.Logf("%d events applied out of their key's order across the change", reordered)
	}
	if n := testenv.CountRecords(p.t, p.brokers, p.d.DLQTopic, partitions); n != 0 {
		p.t.Fatalf("%d messages dead-lettered for an infrastructure fault, want 0", n)
	}
	// (The WAL relay's writer inserts no rows: for it the table is empty.)
	var pending int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&pending); err != nil {
		p.t.Fatal(err)
	}
	if pending != 0 {
		p.t.Fatalf("%d outbox rows left unpublished", pending)
	}
	p.t.Logf("%d events written and applied exactly once, in per-key order; %d write transactions failed and were retried", want, p.writeErrs.Load())
}

func (p *pipeline) relayStatus() string {
	if p.relayHealth == nil {
		return "none"
	}
	_, why := p.relayHealth()
	return why
}

// leaders returns the node leading each partition of topic.
func (p *pipeline) leaders(topic string) map[int]int {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(p.brokers...), Timeout: 10 * time.Second}
	for {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil {
			out := map[int]int{}
			for _, part := range md.Topics[0].Partitions {
				out[part.ID] = part.Leader.ID
			}
			return out
		}
		if ctx.Err() != nil {
			p.t.Fatalf("metadata of %s: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// coordinator returns the node coordinating the consumer group.
func (p *pipeline) coordinator(group string) int {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(p.brokers...), Timeout: 10 * time.Second}
	for {
		resp, err := cl.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: group, KeyType: kafka.CoordinatorKeyTypeConsumer})
		if err == nil && resp.Error == nil && resp.Coordinator != nil {
			return resp.Coordinator.NodeID
		}
		if ctx.Err() != nil {
			p.t.Fatalf("coordinator of %s: %v", group, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
