// Package consumer runs idempotent Kafka consumers: each message is
// deduplicated and handled in one Postgres transaction, and its offset is
// committed only after that transaction commits.
//
// The loop, per message: decode the envelope, begin a transaction, insert
// (consumer name, event ID) into the dedup table with ON CONFLICT DO
// NOTHING; if the row is new, run the handler in the same transaction;
// commit; only then mark the offset for commit. A redelivered event (relay
// re-send, rebalance, crash before the offset commit) finds its dedup row and
// skips the handler, so each event ID is applied once per consumer name.
//
// Consecutive messages of a partition that are already fetched are
// applied in one transaction (WithMaxBatch): one dedup statement for the
// batch, each handler isolated by a savepoint; the first failing event
// ends the batch, the ones before it commit, and it is retried or
// dead-lettered alone (see batch.go).
//
// New and Handle build one consumer (one group, one dedup name) for one or
// several event types, each on its own topic with its own DLQ.
// WithMiddleware wraps every handler.
//
// Every assigned partition has its own goroutine and its own fetcher
// (kafka-go's ConsumerGroup, one Generation.Start per partition), so a
// partition that is retrying a failing message blocks only itself: order
// within a partition (and so per key) is kept, the others go on.
//
// # Failures
//
// A handler error or panic, or an attempt that outlives WithAttemptTimeout
// (default one minute), rolls the transaction back and is retried with
// exponential backoff and jitter, up to WithMaxAttempts (default 5). Errors
// wrapped with Permanent, envelopes that do not decode, another event type
// and a schema_version newer than the descriptor's are not retried. Then the
// message, with its original key, value and headers plus the dlq_* headers
// (HeaderDLQError and the others below), is published to the event's DLQ
// topic (Descriptor.DLQTopic, default "<topic>.dlq", which must exist); then
// its offset is committed; then Hooks.DeadLettered fires. A DLQ publish that
// fails is retried until it succeeds, with the offset uncommitted: a message
// is never dropped. Failures of the dedup step itself (database down) are
// retried without limit and never dead-letter. Cancelling Run's context is
// not a failure: in-flight work may finish for WithDrainTimeout, then is
// rolled back and the message redelivered. A handler that ignores its
// context is abandoned (its connection closed) and reported at ERROR.
// Transient database errors (lost connections, server shutdown,
// serialization failures, deadlocks) are retried without counting.
// ListDLQ and Redrive inspect and replay a DLQ without a running consumer.
//
// # Retention
//
// Dedup rows must outlive every copy of their event on Kafka, or a late
// redelivery would apply it again. Prune (and WithPruning) refuse a
// retention below WithRetentionFloor, default 7 days; keep the retention at
// least as long as the consumed topics' retention.ms.
package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/internal/faults"
)

// Option changes an optional setting of a Consumer. The schema options
// (WithTable, WithRetentionFloor, WithPruneBatch) are also read by Migrate
// and Prune.
type Option func(*Consumer)

// Consumer is an idempotent consumer: one Kafka consumer group, one dedup
// name, and one handler per consumed topic, each with its own DLQ, retries
// and redrive. Build it with New, add a handler per event type with Handle
// (or the generated Handle<Event> functions), then call Run once. A
// consumer of a single event type is a Consumer with one handler.
//
// One Consumer per service (per read model) is the intended shape: its
// handlers share one group, so a deploy rebalances once, and one missing
// topic is reported at Run instead of stalling a group shared by several
// consumers.
type Consumer struct {
	name    string
	groupID string
	brokers []string
	db      *pgxpool.Pool
	routes  map[string]*route // by topic
	topics  []string          // registration order
	s       settings
	sql     *sqlSet
	log     *slog.Logger
	sem     chan struct{}
	writer  *kafka.Writer
	running atomic.Bool
	aborted atomic.Bool
	ready   chan struct{}
	readyOn sync.Once
	watch   *assignWatch
	sqlOnce sync.Once
	sqldb   *sql.DB // for database/sql handlers (HandleSQL), opened on first use
	health  healthState
	faults  faults.Consumer // the test-only fault points Run's context carries
}

// route is the handling of one topic: its event type, handler and DLQ.
type route struct {
	d           *events.Descriptor
	dlq         string
	fn          HandlerFunc // the handler wrapped in the service's middleware
	maxAttempts int
	sql         bool // a database/sql handler: its transaction is a *sql.Tx (HandleSQL)
}

// New returns a consumer without handlers: pool is the database the dedup
// transactions run on, brokers the Kafka bootstrap brokers, and name the
// dedup scope (each event is applied once per name) and, unless
// WithGroupID sets another, the Kafka consumer group ID. Keep the name
// stable across deploys: a new name is a new read model, which applies
// every retained event again. New checks its arguments and options but
// does not connect; Run does.
func New(pool *pgxpool.Pool, brokers []string, name string, opts ...Option) (*Consumer, error) {
	c := &Consumer{name: name, db: pool, s: defaultSettings(), routes: map[string]*route{}, ready: make(chan struct{})}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	errs := c.s.errs
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("consumer: "+format, args...)) }
	if pool == nil {
		bad("nil pool")
	}
	if len(brokers) == 0 {
		bad("no Kafka brokers")
	}
	for _, b := range brokers {
		if b == "" {
			bad("empty Kafka broker address: give host:port")
			break
		}
	}
	if name == "" {
		bad("empty name")
	}
	if c.s.pruneEvery > 0 && c.s.pruneOlderThan < c.s.retentionFloor {
		bad("pruning: retention %v is below the floor %v", c.s.pruneOlderThan, c.s.retentionFloor)
	}
	var err error
	if c.sql, err = renderSQL(c.s.table); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c.brokers = append([]string(nil), brokers...)
	c.groupID = c.s.groupID
	if c.groupID == "" {
		c.groupID = name
	}
	if c.s.concurrency > 0 {
		c.sem = make(chan struct{}, c.s.concurrency)
	}
	c.log = c.s.logger.With("consumer", name)
	return c, nil
}

// Ready returns a channel closed once Run has joined the consumer group
// and started consuming its assigned partitions (possibly none, when the
// group has more members than partitions): for tests and health checks.
func (c *Consumer) Ready() <-chan struct{} { return c.ready }

// Run joins the consumer group and consumes until ctx is cancelled, then
// lets in-flight messages finish for up to the drain timeout
// (WithDrainTimeout), commits the offsets of the messages handled, leaves
// the group and returns nil. A message still being handled when the drain
// timeout ends is abandoned: its transaction rolls back and it is
// redelivered later; cancellation never counts as a failure.
//
// Before joining, Run checks that every consumed topic and its DLQ exist;
// if not it returns a *MissingTopicsError, or with WithWaitForTopics logs a
// warning and waits for them. Run may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	if len(c.topics) == 0 {
		return fmt.Errorf("consumer: %s: no handlers: register one with Handle before Run", c.name)
	}
	c.faults = faults.ConsumerFrom(ctx)
	c.health.live.Store(true)
	defer c.health.live.Store(false)
	if err := c.awaitTopics(ctx); err != nil {
		return err
	}
	if err := c.checkRetention(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil // cancelled while waiting for topics or their retention
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		fatalMu sync.Mutex
		fatal   error
	)
	abort := func(err error) {
		fatalMu.Lock()
		if fatal == nil {
			fatal = err
		}
		fatalMu.Unlock()
		c.aborted.Store(true)
		cancel(err)
	}

	defer func() {
		if c.sqldb != nil {
			_ = c.sqldb.Close()
		}
	}()
	transport := transportFor(c.s.dialer)
	defer transport.CloseIdleConnections()
	c.writer = &kafka.Writer{
		// No Topic: each dead-lettered message names its DLQ topic.
		Addr: kafka.TCP(c.brokers...),
		// Keyed like the relay (murmur2, the Java client's default), so a
		// key's dead letters land in the partition the relay would pick.
		Balancer:     kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		// No client-side cap below the broker's: the dead-letter copy is
		// the original plus the dlq_* headers, and the broker (the DLQ
		// topic's max.message.bytes) decides; see deadLetter for a refusal.
		BatchBytes: 64 << 20,
		Transport:  transport,
	}
	defer func() {
		if err := c.writer.Close(); err != nil {
			c.log.Warn("consumer: close DLQ writer", "err", err)
		}
	}()

	var bg sync.WaitGroup
	defer bg.Wait()
	if c.s.pruneEvery > 0 {
		bg.Go(func() { c.pruneLoop(ctx) })
	}
	bg.Go(func() { c.checkDatabase(ctx) })
	bg.Go(func() { c.checkKafka(ctx) })
	c.watch = newAssignWatch(c.topics)
	if c.s.unassignedWarn > 0 {
		bg.Go(func() { c.watchAssignments(ctx) })
	}

	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                c.groupID,
		Brokers:           c.brokers,
		Topics:            c.topics,
		Dialer:            c.s.dialer,
		HeartbeatInterval: c.s.heartbeat,
		SessionTimeout:    c.s.session,
		RebalanceTimeout:  c.s.rebalance,
		JoinGroupBackoff:  c.s.joinBackoff,
		StartOffset:       c.s.startOffset,
		// Added partitions are watched by watchPartitions, whose baseline
		// is read before Ready (kafka-go's watcher reads it later).
		Logger:      kafka.LoggerFunc(func(msg string, args ...any) { c.log.Debug(fmt.Sprintf(msg, args...)) }),
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) { c.log.Debug(fmt.Sprintf(msg, args...)) }),
	})
	if err != nil {
		cancel(nil)
		return fmt.Errorf("consumer: %s: consumer group: %w", c.name, err)
	}
	c.log.Info("consumer: started", "group", c.groupID, "topics", c.topics)
	for {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			// The group retries joining by itself, with backoff.
			c.log.Warn("consumer: join group", "group", c.groupID, "err", err)
			c.health.joinErr.Store(err.Error())
			continue
		}
		c.log.Debug("consumer: new generation", "generation", gen.ID, "assignments", gen.Assignments)
		c.health.joinErr.Store("")
		c.watch.assigned(gen.Assignments)
		// Ready once every partition of the generation has started (or
		// given up); a generation without partitions is ready at once.
		var toStart atomic.Int64
		for _, parts := range gen.Assignments {
			toStart.Add(int64(len(parts)))
		}
		started := func() {
			if toStart.Add(-1) == 0 {
				c.readyOn.Do(func() { close(c.ready) })
			}
		}
		// The partition baseline is read before the partitions start (and
		// so before Ready): partitions added from then on are noticed.
		if c.s.partitionWatch > 0 {
			bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
			base, err := partitionCounts(bctx, c.s.dialer, c.brokers, c.topics)
			bcancel()
			if err != nil {
				c.log.Warn("consumer: cannot read partition counts; added partitions are noticed at the next rebalance", "err", err)
			} else {
				gen.Start(func(gctx context.Context) { c.watchPartitions(gctx, base, c.s.partitionWatch) })
			}
		}
		if toStart.Load() == 0 {
			c.readyOn.Do(func() { close(c.ready) })
		}
		for topic, parts := range gen.Assignments {
			for _, a := range parts {
				gen.Start(func(gctx context.Context) {
					if err := c.runPartition(ctx, gctx, gen, topic, a, started); err != nil {
						abort(err)
					}
				})
			}
		}
	}
	// Close ends the current generation, waits for its partition
	// goroutines (which commit what they handled) and leaves the group.
	if err := cg.Close(); err != nil {
		c.log.Warn("consumer: leave group", "err", err)
	}
	cancel(nil)
	bg.Wait()
	c.log.Info("consumer: stopped")
	fatalMu.Lock()
	defer fatalMu.Unlock()
	return fatal
}

// acquire takes a concurrency slot, if concurrency is bounded.
func (c *Consumer) acquire(ctx context.Context) (release func(), err error) {
	if c.sem == nil {
		return func() {}, nil
	}
	select {
	case c.sem <- struct{}{}:
		return func() { <-c.sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// pruneLoop prunes the dedup table every pruneEvery until ctx ends.
func (c *Consumer) pruneLoop(ctx context.Context) {
	t := time.NewTicker(c.s.pruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := prune(ctx, c.db, c.sql, c.s.pruneOlderThan, c.s.pruneBatch)
		switch {
		case err != nil && ctx.Err() == nil:
			c.log.Warn("consumer: prune", "err", err)
		case n > 0:
			c.log.Info("consumer: pruned dedup rows", "rows", n, "older_than", c.s.pruneOlderThan)
		}
	}
}
