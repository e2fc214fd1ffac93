package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of the optional settings.
const (
	DefaultMaxAttempts    = 5
	DefaultBaseBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
	DefaultCommitInterval = time.Second
	// DefaultRetentionFloor is the shortest retention Prune accepts unless
	// WithRetentionFloor lowers it: Kafka's default log retention.
	DefaultRetentionFloor = 7 * 24 * time.Hour
	// DefaultMaxErrorBytes bounds the error text put in the DLQ header.
	DefaultMaxErrorBytes = 4 << 10
	// DefaultAttemptTimeout bounds one attempt: dedup insert, handler and
	// commit, so a stuck handler cannot hold its partition forever.
	DefaultAttemptTimeout = time.Minute
	// DefaultHeartbeatInterval, DefaultSessionTimeout and
	// DefaultRebalanceTimeout are the consumer-group timeouts (see
	// WithGroupTimeouts and docs/design.md, "Rebalance defaults"): a killed
	// member's partitions move after about 10s instead of kafka-go's 30s,
	// live members notice a rebalance within a second, the session stays
	// above a broker's default group.min.session.timeout.ms (6s), and a
	// member that cannot rejoin within 10s (a handler ignoring its
	// context) holds up the others' rebalance for no longer than that.
	DefaultHeartbeatInterval = time.Second
	DefaultSessionTimeout    = 10 * time.Second
	DefaultRebalanceTimeout  = 10 * time.Second
	// DefaultJoinGroupBackoff is the wait before joining again after a
	// failed join (kafka-go's default is 5s).
	DefaultJoinGroupBackoff = time.Second
)

// settings are the optional knobs, shared by New, Migrate and Prune.
type settings struct {
	table          string
	maxAttempts    int
	baseBackoff    time.Duration
	maxBackoff     time.Duration
	concurrency    int
	commitInterval time.Duration
	hooks          Hooks
	logger         *slog.Logger
	startOffset    int64
	heartbeat      time.Duration
	session        time.Duration
	rebalance      time.Duration
	joinBackoff    time.Duration
	maxWait        time.Duration
	retentionFloor time.Duration
	pruneEvery     time.Duration
	pruneOlderThan time.Duration
	pruneBatch     int
	maxErrorBytes  int
	dialer         *kafka.Dialer
	tracer         trace.Tracer
	attemptTimeout time.Duration
	groupID        string
	middleware     []Middleware
	topicWait      time.Duration // 0: a missing topic fails Run; else the warning interval while waiting
	topicPoll      time.Duration // how often a waiting Run checks the topics again
	unassignedWarn time.Duration // 0: never warn
	partitionWatch time.Duration
	drainTimeout   time.Duration
	handlerGrace   time.Duration // how long a handler may run past its context's end before it is abandoned
	maxBatch       int
	retentionCheck RetentionCheck
	queued         int // messages fetched ahead per partition
	fetchMaxBytes  int // most bytes one fetch request asks for

	// Test seams, unexported on purpose (fault points travel in Run's
	// context instead: see runtime/faultinject).
	noDedup       bool         // benchmark baseline: run the handler without the dedup insert
	lostCommitAck func() error // a non-nil error replaces a successful commit's result, as a connection lost in COMMIT would

	errs []error
}

func defaultSettings() settings {
	return settings{
		table:          DefaultTable,
		maxAttempts:    DefaultMaxAttempts,
		baseBackoff:    DefaultBaseBackoff,
		maxBackoff:     DefaultMaxBackoff,
		commitInterval: DefaultCommitInterval,
		logger:         slog.Default(),
		startOffset:    kafka.FirstOffset,
		retentionFloor: DefaultRetentionFloor,
		pruneBatch:     DefaultPruneBatch,
		maxErrorBytes:  DefaultMaxErrorBytes,
		attemptTimeout: DefaultAttemptTimeout,
		maxWait:        250 * time.Millisecond,
		heartbeat:      DefaultHeartbeatInterval,
		session:        DefaultSessionTimeout,
		rebalance:      DefaultRebalanceTimeout,
		joinBackoff:    DefaultJoinGroupBackoff,
		dialer:         kafka.DefaultDialer,
		tracer:         otel.GetTracerProvider().Tracer(tracerName),
		topicPoll:      time.Second,
		unassignedWarn: DefaultWarnInterval,
		partitionWatch: 5 * time.Second,
		drainTimeout:   DefaultDrainTimeout,
		handlerGrace:   time.Second,
		maxBatch:       DefaultMaxBatch,
		queued:         DefaultQueuedMessages,
		fetchMaxBytes:  DefaultFetchMaxBytes,
	}
}

// tracerName names the consumer's OpenTelemetry instrumentation scope.
const tracerName = "github.com/protoevents/protoevents/runtime/consumer"

// WithTracerProvider sets where the consumer's spans go (one consumer span
// per handled event, child of the producer's span when the envelope carries
// a traceparent); default the global OpenTelemetry provider, a no-op until
// the program installs one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *Consumer) {
		if tp == nil {
			c.s.fail("WithTracerProvider: nil provider")
			return
		}
		c.s.tracer = tp.Tracer(tracerName)
	}
}

func (s *settings) fail(format string, args ...any) {
	s.errs = append(s.errs, fmt.Errorf("consumer: "+format, args...))
}

// settingsFrom applies opts to the defaults and reports invalid values.
func settingsFrom(opts []Option) (settings, error) {
	c := &Consumer{s: defaultSettings()}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	return c.s, errors.Join(c.s.errs...)
}

// WithGroupID sets the Kafka consumer group ID; default the consumer's
// name. Members with the same group ID share the partitions; the name
// alone scopes deduplication.
func WithGroupID(id string) Option {
	return func(c *Consumer) {
		if id == "" {
			c.s.fail("WithGroupID: empty group ID")
			return
		}
		c.s.groupID = id
	}
}

// WithTable sets the dedup table, "table" or "schema.table"; default
// "consumed_events". Migrate, New and Prune must agree on it.
func WithTable(name string) Option {
	return func(c *Consumer) {
		if _, err := parseTable(name); err != nil {
			c.s.errs = append(c.s.errs, err)
			return
		}
		c.s.table = name
	}
}

// WithMaxAttempts sets how often a failing message is tried before it goes
// to the DLQ; default 5. A message marked Permanent is tried once.
func WithMaxAttempts(n int) Option {
	return func(c *Consumer) {
		if n < 1 {
			c.s.fail("max attempts %d < 1", n)
			return
		}
		c.s.maxAttempts = n
	}
}

// WithBackoff sets the retry backoff: attempt n waits about
// base·2^(n-1), capped at max, with jitter; defaults 100ms and 30s.
func WithBackoff(base, max time.Duration) Option {
	return func(c *Consumer) {
		if base <= 0 || max < base {
			c.s.fail("backoff base %v, max %v: want 0 < base <= max", base, max)
			return
		}
		c.s.baseBackoff, c.s.maxBackoff = base, max
	}
}

// WithConcurrency bounds how many partitions run a handler at the same
// time; 0 (the default) means one at a time per assigned partition, all in
// parallel. Within a partition messages are always handled one by one, in
// offset order.
func WithConcurrency(n int) Option {
	return func(c *Consumer) {
		if n < 0 {
			c.s.fail("concurrency %d < 0", n)
			return
		}
		c.s.concurrency = n
	}
}

// WithCommitInterval sets how often handled offsets are committed to Kafka;
// default 1s. Offsets are also committed when a partition goes idle, after
// a message was dead-lettered and on shutdown; 0 commits after every
// message. An offset is only ever committed after its transaction
// committed, so a longer interval costs only redeliveries (absorbed by the
// dedup table) after a crash, never lost events.
func WithCommitInterval(d time.Duration) Option {
	return func(c *Consumer) {
		if d < 0 {
			c.s.fail("commit interval %v < 0", d)
			return
		}
		c.s.commitInterval = d
	}
}

// WithHooks installs observability callbacks.
func WithHooks(h Hooks) Option {
	return func(c *Consumer) { c.s.hooks = h }
}

// WithLogger sets the logger; default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *Consumer) {
		if l != nil {
			c.s.logger = l
		}
	}
}

// WithStartFromLatest makes a consumer group without committed offsets
// start at the end of the topic instead of the beginning (the default,
// which applies every event still retained).
func WithStartFromLatest() Option {
	return func(c *Consumer) { c.s.startOffset = kafka.LastOffset }
}

// WithGroupTimeouts sets the consumer-group heartbeat interval, session
// timeout and rebalance timeout; a zero keeps the default (1s, 10s, 10s:
// DefaultHeartbeatInterval and the others). The session timeout is how
// long a consumer that died without leaving the group (killed, cut off)
// keeps its partitions; the heartbeat interval how soon live members
// notice a rebalance; the rebalance timeout how long the group waits for
// members to rejoin. The broker bounds the session timeout
// (group.min.session.timeout.ms, default 6s, to
// group.max.session.timeout.ms); keep the heartbeat at a third of it or
// less. The wait before joining again after a failed join follows the
// heartbeat interval. A clean shutdown leaves the group at once whatever
// the timeouts.
func WithGroupTimeouts(heartbeat, session, rebalance time.Duration) Option {
	return func(c *Consumer) {
		if heartbeat < 0 || session < 0 || rebalance < 0 {
			c.s.fail("WithGroupTimeouts: negative timeout (heartbeat %v, session %v, rebalance %v)", heartbeat, session, rebalance)
			return
		}
		if heartbeat > 0 {
			c.s.heartbeat, c.s.joinBackoff = heartbeat, heartbeat
		}
		if session > 0 {
			c.s.session = session
		}
		if rebalance > 0 {
			c.s.rebalance = rebalance
		}
		if c.s.heartbeat >= c.s.session {
			c.s.fail("WithGroupTimeouts: heartbeat interval %v must be below the session timeout %v (a third of it or less)", c.s.heartbeat, c.s.session)
		}
	}
}

// WithRetentionFloor sets the shortest retention Prune accepts; default 7
// days. Dedup rows must outlive every copy of their event on Kafka, so the
// floor should be at least the topic's retention.ms.
func WithRetentionFloor(d time.Duration) Option {
	return func(c *Consumer) {
		if d < 0 {
			c.s.fail("retention floor %v < 0", d)
			return
		}
		c.s.retentionFloor = d
	}
}

// WithPruneBatch sets how many rows one pruning statement deletes; default
// 5000. Smaller batches hold locks for less time.
func WithPruneBatch(n int) Option {
	return func(c *Consumer) {
		if n < 1 {
			c.s.fail("prune batch %d < 1", n)
			return
		}
		c.s.pruneBatch = n
	}
}

// WithPruning makes Run also prune dedup rows older than olderThan, every
// interval, in the background (see Prune; the retention floor applies).
// Several consumers may prune the same table.
func WithPruning(every, olderThan time.Duration) Option {
	return func(c *Consumer) {
		if every <= 0 {
			c.s.fail("prune interval %v <= 0", every)
			return
		}
		c.s.pruneEvery, c.s.pruneOlderThan = every, olderThan
	}
}

// WithAttemptTimeout bounds one attempt at a message (dedup insert, handler,
// commit; default DefaultAttemptTimeout). A timed-out attempt rolls back and
// counts as a failure, so it is retried and finally dead-lettered: a handler
// stuck on a lock or a slow dependency cannot block its partition forever.
// The handler sees the deadline in its context; 0 disables it.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *Consumer) {
		if d < 0 {
			c.s.fail("WithAttemptTimeout: negative timeout %s", d)
			return
		}
		c.s.attemptTimeout = d
	}
}

// WithMaxErrorBytes bounds the error text (and panic stack) recorded in the
// DLQ's dlq_error header; default 4 KiB.
func WithMaxErrorBytes(n int) Option {
	return func(c *Consumer) {
		if n < 64 {
			c.s.fail("max error bytes %d < 64", n)
			return
		}
		c.s.maxErrorBytes = n
	}
}

// WithKafkaDialer sets the dialer (TLS, SASL, timeouts, client ID) for
// every connection the consumer makes: group coordination, fetching and DLQ
// publishing. Default kafka.DefaultDialer.
func WithKafkaDialer(d *kafka.Dialer) Option {
	return func(c *Consumer) {
		if d != nil {
			c.s.dialer = d
		}
	}
}

// withMaxWait sets how long a fetch waits for new messages (tests only).
func withMaxWait(d time.Duration) Option {
	return func(c *Consumer) { c.s.maxWait = d }
}

// withLostCommitAck makes successful commits report fn's error (tests only).
func withLostCommitAck(fn func() error) Option {
	return func(c *Consumer) { c.s.lostCommitAck = fn }
}

// withoutDedup skips the dedup insert: the benchmark's baseline.
func withoutDedup() Option {
	return func(c *Consumer) { c.s.noDedup = true }
}

// Defaults of the drain, warning and batch settings.
const (
	// DefaultDrainTimeout is how long in-flight messages may still finish
	// after Run's context ends.
	DefaultDrainTimeout = 10 * time.Second
	// DefaultWarnInterval is how often Run repeats a warning about missing
	// or unassigned topics.
	DefaultWarnInterval = 30 * time.Second
	// DefaultMaxBatch is how many consecutive messages of a partition are
	// applied in one database transaction: the best of 8 to 256 measured
	// (docs/design.md), and below Postgres' 64 cached subtransaction IDs
	// per transaction (each handler's savepoint takes one once it writes),
	// past which every snapshot on the server gets slower.
	DefaultMaxBatch = 32
)

// WithMiddleware wraps every handler of the consumer in mw, the first
// outermost: WithMiddleware(a, b) runs a, which calls b, which calls the
// handler. Middleware runs inside the handler's span and transaction, and
// its error is the attempt's result. Several WithMiddleware options add up.
func WithMiddleware(mw ...Middleware) Option {
	return func(c *Consumer) {
		for _, m := range mw {
			if m == nil {
				c.s.fail("WithMiddleware: nil middleware")
				return
			}
		}
		c.s.middleware = append(c.s.middleware, mw...)
	}
}

// WithWaitForTopics makes Run wait for missing topics (consumed topics and
// their DLQs) instead of returning a *MissingTopicsError: it logs a warning
// naming them every warn interval (WithWarnInterval) and starts consuming
// once they all exist.
func WithWaitForTopics() Option {
	return func(c *Consumer) {
		c.s.topicWait = c.s.unassignedWarn
		if c.s.topicWait <= 0 {
			c.s.topicWait = DefaultWarnInterval
		}
	}
}

// WithWarnInterval sets how often Run repeats its warnings about topics it
// waits for (WithWaitForTopics) and about consumed topics of which this
// member has held no partition for that long; default 30s, 0 turns the
// unassigned-topic warning off.
func WithWarnInterval(d time.Duration) Option {
	return func(c *Consumer) {
		if d < 0 {
			c.s.fail("WithWarnInterval: negative interval %s", d)
			return
		}
		c.s.unassignedWarn = d
		if c.s.topicWait > 0 && d > 0 {
			c.s.topicWait = d
		}
	}
}

// WithDrainTimeout sets how long messages being handled when Run's context
// ends may still finish (and commit) before they are abandoned: rolled back
// and left for redelivery; default DefaultDrainTimeout. 0 abandons them at
// once. A handler that ignores its context is abandoned too (see
// WithAttemptTimeout), so Run always returns.
func WithDrainTimeout(d time.Duration) Option {
	return func(c *Consumer) {
		if d < 0 {
			c.s.fail("WithDrainTimeout: negative timeout %s", d)
			return
		}
		c.s.drainTimeout = d
	}
}

// WithMaxBatch sets how many consecutive, already fetched messages of one
// partition are applied in one database transaction, each handler call in
// its own savepoint; default DefaultMaxBatch. 1 gives one transaction per
// message.
func WithMaxBatch(n int) Option {
	return func(c *Consumer) {
		if n < 1 {
			c.s.fail("WithMaxBatch: %d < 1", n)
			return
		}
		c.s.maxBatch = n
	}
}

// Defaults of the fetch limits (WithFetchLimits).
const (
	// DefaultQueuedMessages is how many fetched messages a partition holds
	// ahead of its handler.
	DefaultQueuedMessages = 100
	// DefaultFetchMaxBytes is the most bytes one fetch request asks the
	// broker for (the broker still sends a larger single record batch).
	DefaultFetchMaxBytes = 10 << 20
)

// WithFetchLimits bounds what each assigned partition fetches ahead of its
// handler: at most queued messages (default DefaultQueuedMessages) waiting
// in memory, and fetch requests of at most maxBytes (default
// DefaultFetchMaxBytes). A handler slower than its input fills the queue
// and the partition stops reading from the broker until the handler takes
// the next message: the backlog waits on the broker (as lag), not in
// memory. A consumer's memory for messages is about the assigned
// partitions × queued × the message size, plus one record batch being
// decoded per partition. The queue also feeds batches (WithMaxBatch): a
// queue shorter than the batch size shortens the batches.
func WithFetchLimits(queued, maxBytes int) Option {
	return func(c *Consumer) {
		if queued < 1 || maxBytes < 1 {
			c.s.fail("WithFetchLimits: queued %d and maxBytes %d must be at least 1", queued, maxBytes)
			return
		}
		c.s.queued, c.s.fetchMaxBytes = queued, maxBytes
	}
}

// withTopicPoll sets how often a waiting Run looks for the topics (tests).
func withTopicPoll(d time.Duration) Option {
	return func(c *Consumer) { c.s.topicPoll = d }
}

// withHandlerGrace sets how long a handler may overrun its context (tests).
func withHandlerGrace(d time.Duration) Option {
	return func(c *Consumer) { c.s.handlerGrace = d }
}

// withPartitionWatch sets how often a generation checks for added
// partitions (tests; default 5s).
func withPartitionWatch(d time.Duration) Option {
	return func(c *Consumer) { c.s.partitionWatch = d }
}
