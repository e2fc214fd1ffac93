package outbox

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go/sasl"
	"go.opentelemetry.io/otel/trace"

	"github.com/protoevents/protoevents/runtime/envelope"
)

// Option configures Migrate, Status and the stuck-row operations.
type Option interface{ applySchema(*schemaConfig) }

// WriterOption configures a Writer.
type WriterOption interface{ applyWriter(*writerConfig) }

// RelayOption configures a Relay.
type RelayOption interface{ applyRelay(*relayConfig) }

type schemaConfig struct {
	table    string
	lanes    int
	lanesSet bool // WithLanes was given: an existing table must match
	err      error
}

type writerConfig struct {
	table    string
	producer string
	format   envelope.Format
	walSlot  string // WithWALSource: the slot that must exist
	backlog  *BacklogPolicy
}

type relayConfig struct {
	table             string
	batchSize         int
	workers           int
	maxBatchBytes     int
	pollInterval      time.Duration
	rebalanceInterval time.Duration
	statusInterval    time.Duration
	retention         time.Duration
	cleanupInterval   time.Duration
	cleanupBatch      int
	backoffMin        time.Duration
	backoffMax        time.Duration
	hooks             Hooks
	logger            *slog.Logger
	tls               *tls.Config
	sasl              sasl.Mechanism
	writeTimeout      time.Duration
	maxAttempts       int
	shutdownGrace     time.Duration
	healthInterval    time.Duration
	stallTimeout      time.Duration
	readyBacklog      BacklogBound
	logInterval       time.Duration
	tracerProvider    trace.TracerProvider
	err               error
}

// TableOption names the outbox table; it applies to Migrate, Status,
// Writer and Relay alike, which must all agree on it.
type TableOption struct{ name string }

// WithTable sets the outbox table, "name" or "schema.name" (default
// "outbox", found through the search_path). Each part must be a plain
// identifier of at most 63 bytes; it is always quoted.
func WithTable(name string) TableOption { return TableOption{name: name} }

func (o TableOption) applySchema(c *schemaConfig) { c.table = o.name }
func (o TableOption) applyWriter(c *writerConfig) { c.table = o.name }
func (o TableOption) applyRelay(c *relayConfig)   { c.table = o.name }

type schemaFunc func(*schemaConfig)

func (f schemaFunc) applySchema(c *schemaConfig) { f(c) }

// WithLanes sets the number of key-hash lanes of a new outbox table
// (default 16): the most relay instances that can share the work. It is
// fixed when the table is created; Migrate refuses a different number for an
// existing table, and without WithLanes keeps the existing table's count.
func WithLanes(n int) Option {
	return schemaFunc(func(c *schemaConfig) {
		if n < 1 || n > maxLanes {
			c.err = fmt.Errorf("outbox: lanes %d out of range 1..%d", n, maxLanes)
			return
		}
		c.lanes, c.lanesSet = n, true
	})
}

type writerFunc func(*writerConfig)

func (f writerFunc) applyWriter(c *writerConfig) { f(c) }

// WithProducer sets the producer name recorded in envelopes whose publish
// options and descriptor name none.
func WithProducer(name string) WriterOption {
	return writerFunc(func(c *writerConfig) { c.producer = name })
}

// WithFormat sets the envelope wire form (default envelope.FormatJSON).
func WithFormat(f envelope.Format) WriterOption {
	return writerFunc(func(c *writerConfig) { c.format = f })
}

// WithWALSource makes the Writer emit each event as a transactional
// logical decoding message (pg_logical_emit_message) instead of inserting
// an outbox row: the message is in the write-ahead log of the caller's
// transaction, committed or rolled back with it, and only the WAL relay
// (package walrelay) reading slot publishes it; the polling Relay never
// sees it.
//
// A message written while no slot exists is never read by anyone, and
// Postgres accepts it even below wal_level = logical. So before its first
// write, and again at most once a minute, the Writer checks in the
// caller's transaction that wal_level is logical and that slot exists and
// is not invalidated, and refuses the write (ErrWALNotReady) otherwise:
// create the slot (walrelay.Setup, or eventsctl wal setup) before the
// first write. No table is written, so a fixed event ID
// (events.WithEventID) is not checked for duplicates: consumers
// deduplicate on it as always. See docs/design.md, "The WAL relay".
func WithWALSource(slot string) WriterOption {
	return writerFunc(func(c *writerConfig) { c.walSlot = slot })
}

type relayFunc func(*relayConfig)

func (f relayFunc) applyRelay(c *relayConfig) { f(c) }

func (c *relayConfig) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("outbox: "+format, args...)
	}
}

// WithBatchSize sets the most rows the relay claims and publishes at once
// (default 500, at most 10000). The batch size adapts to the backlog: it
// starts at 64 (or n, if smaller), doubles while batches come back full and
// halves when they come back mostly empty.
func WithBatchSize(n int) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if n < 1 || n > 10000 {
			c.fail("batch size %d out of range 1..10000", n)
			return
		}
		c.batchSize = n
	})
}

// WithWorkers sets how many lane workers the relay runs (default 1, at
// most 64). Each worker is a relay of its own inside Run: its own database
// session, its own share of the lanes (advisory locks, balanced with every
// other worker of every relay on the table), its own pipelined
// claim–publish–mark loop and its own producer (sharing one transport).
// Per-key order holds as it does across relay instances: a lane has one
// owner at a time. More workers overlap the database work of several
// batches, which raises the drain rate of one relay when the database, not
// Kafka, is the bottleneck; each one costs a connection. Hooks (WithHooks)
// are called from every worker, concurrently.
func WithWorkers(n int) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if n < 1 || n > 64 {
			c.fail("workers %d out of range 1..64", n)
			return
		}
		c.workers = n
	})
}

// WithMaxBatchBytes caps the size of one batch (default 900 KiB, below
// Kafka's default message.max.bytes), so that each partition's share of a
// batch fits in one produce request and is acknowledged all or nothing.
// A single larger row is still sent, alone.
func WithMaxBatchBytes(n int) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if n < 1024 {
			c.fail("max batch bytes %d below 1024", n)
			return
		}
		c.maxBatchBytes = n
	})
}

// WithPollInterval sets the longest delay between the relay's looks for new
// rows while it is idle (default 100ms). Right after work it looks a
// millisecond after its last look, doubling the delay on every empty look
// up to d; a Writer in the same process wakes it at once (a CommitTx
// right after its COMMIT, see Writer.Notify). Each look is one index probe
// per owned lane of the pending rows, so a short interval costs the
// database little; a longer one trades latency for fewer queries.
func WithPollInterval(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("poll interval %v must be positive", d)
			return
		}
		c.pollInterval = d
	})
}

// WithRebalanceInterval sets how often the relay recounts the live relays
// and takes or gives up lanes (default 2s).
func WithRebalanceInterval(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("rebalance interval %v must be positive", d)
			return
		}
		c.rebalanceInterval = d
	})
}

// WithStatusInterval sets how often the relay samples the pending rows for
// Hooks.Pending (default 10s).
func WithStatusInterval(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("status interval %v must be positive", d)
			return
		}
		c.statusInterval = d
	})
}

// WithRetention sets how long published rows are kept before the relay
// deletes them (default 24h); kept rows let operators see what was sent.
func WithRetention(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d < 0 {
			c.fail("retention %v must not be negative", d)
			return
		}
		c.retention = d
	})
}

// WithCleanupInterval sets how often the relay deletes expired published
// rows (default 1m), in batches of 1000.
func WithCleanupInterval(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("cleanup interval %v must be positive", d)
			return
		}
		c.cleanupInterval = d
	})
}

// WithBackoff sets the bounds of the exponential, jittered delay between
// retries after a failed publish or database error (default 100ms to 30s).
func WithBackoff(lo, hi time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if lo <= 0 || hi < lo {
			c.fail("backoff bounds %v..%v invalid", lo, hi)
			return
		}
		c.backoffMin, c.backoffMax = lo, hi
	})
}

// WithHooks installs the relay's observability callbacks (see Hooks), e.g.
// those of runtime/prommetrics or runtime/otelmetrics.
func WithHooks(h Hooks) RelayOption {
	return relayFunc(func(c *relayConfig) { c.hooks = h })
}

// WithLogger sets the relay's logger (default slog.Default()).
func WithLogger(l *slog.Logger) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithTLS makes the relay reach the brokers over TLS configured by cfg
// (default: plain TCP). One transport carries the TLS (and SASL) settings
// for every lane worker's producer and the relay's broker checks.
func WithTLS(cfg *tls.Config) RelayOption {
	return relayFunc(func(c *relayConfig) { c.tls = cfg })
}

// WithSASL authenticates the relay to the brokers with m (default: none),
// usually together with WithTLS. m is one of kafka-go's mechanisms:
// plain.Mechanism{Username, Password} from
// github.com/segmentio/kafka-go/sasl/plain, or the one
// scram.Mechanism(scram.SHA512, user, password) returns, from
// github.com/segmentio/kafka-go/sasl/scram. It is the
// one kafka-go type in the relay's options, for the uncommon case: a
// mechanism is more than a name and a password (SCRAM's hash, AWS MSK IAM's
// signer), and kafka-go's interface is what the transport takes.
func WithSASL(m sasl.Mechanism) RelayOption {
	return relayFunc(func(c *relayConfig) { c.sasl = m })
}

// WithWriteTimeout bounds the wait for the brokers' acknowledgement of one
// produce call (default 10s). A batch that times out is judged as failed
// and retried; raise it for a broker that acknowledges slowly (acks=all
// over a slow replication link).
func WithWriteTimeout(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("write timeout %v must be positive", d)
			return
		}
		c.writeTimeout = d
	})
}

// WithMaxAttempts sets how many times the producer tries a produce request
// before the batch's rows count as failed (default 3, at most 100); the
// relay then parks their keys or backs off and sends them again later, so
// 1 only makes failures surface sooner.
func WithMaxAttempts(n int) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if n < 1 || n > 100 {
			c.fail("max attempts %d out of range 1..100", n)
			return
		}
		c.maxAttempts = n
	})
}

// WithShutdownGrace sets how long the batch in flight when Run's ctx ends
// may take to be acknowledged and marked before Run gives up on it and
// returns (default 5s). A batch given up on stays pending and is re-sent
// later (duplicates); 0 abandons it at once.
func WithShutdownGrace(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d < 0 {
			c.fail("shutdown grace %v must not be negative", d)
			return
		}
		c.shutdownGrace = d
	})
}

// WithHealthInterval sets how often the relay checks that the database and
// the brokers answer, for Health (default 5s); one seen down is checked
// every half second (or this interval, if shorter) until it answers.
func WithHealthInterval(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("health interval %v must be positive", d)
			return
		}
		c.healthInterval = d
	})
}

// WithStallTimeout sets how long the relay may publish nothing while rows of
// its lanes have been pending for as long before it reports itself not
// ready (default 1m): a stuck row, a missing topic, a hung broker.
func WithStallTimeout(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("stall timeout %v must be positive", d)
			return
		}
		c.stallTimeout = d
	})
}

// WithReadyBacklog makes the relay report itself not ready while its lanes'
// backlog breaks b: more than b.MaxPending pending rows (counted up to
// b.MaxPending+1 at each health check) or a pending row older than
// b.MaxAge. Give it the bound the producers' WithBacklogPolicy uses, so
// the relay's /readyz turns red when producers start being refused (a relay
// sees its own lanes' share of the table: with several relays, divide
// MaxPending among them). Without it /readyz shows the oldest pending row's
// age and counts nothing.
func WithReadyBacklog(b BacklogBound) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if err := b.check("WithReadyBacklog"); err != nil {
			c.fail("%v", err)
			return
		}
		c.readyBacklog = b
	})
}

// WithLogInterval sets how often a repeated identical error is logged again,
// as one line with the number of repeats (default 30s); the first
// occurrence is always logged at once.
func WithLogInterval(d time.Duration) RelayOption {
	return relayFunc(func(c *relayConfig) {
		if d <= 0 {
			c.fail("log interval %v must be positive", d)
			return
		}
		c.logInterval = d
	})
}

// WithTracerProvider sets where the relay's spans go (default: the global
// OpenTelemetry provider): one producer span per published batch, linked to
// the trace of every event in it (the envelope's traceparent).
func WithTracerProvider(tp trace.TracerProvider) RelayOption {
	return relayFunc(func(c *relayConfig) { c.tracerProvider = tp })
}
