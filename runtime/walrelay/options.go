package walrelay

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go/sasl"

	"github.com/protoevents/protoevents/runtime/internal/sqlident"
	"github.com/protoevents/protoevents/runtime/internal/walrecord"
)

// Option configures the WAL relay and its Setup, Drop and SlotStatus.
type Option func(*config)

// MessagePrefix is the logical decoding message prefix of the events an
// outbox Writer with the WAL source emits: what to filter on when reading
// the slot with other tools (pg_recvlogical, a CDC pipeline).
const MessagePrefix = walrecord.Prefix

// DefaultSlot and DefaultPublication are the names the relay uses unless
// WithSlot and WithPublication say otherwise.
const (
	DefaultSlot        = "protoevents"
	DefaultPublication = "protoevents"
)

type config struct {
	slot, publication string
	batchSize         int
	lanes             int
	statusInterval    time.Duration
	heartbeat         time.Duration
	standbyRetry      time.Duration
	stallTimeout      time.Duration
	maxLagBytes       int64
	writeTimeout      time.Duration
	maxAttempts       int
	grace             time.Duration
	tls               *tls.Config
	sasl              sasl.Mechanism
	log               *slog.Logger
	hooks             Hooks
	err               error

	// The backoffs after a failed session (the database) and a failed
	// publish (the brokers): the min doubling up to the max. Fixed; tests
	// set them.
	sessionRetryMin, sessionRetryMax time.Duration
	publishRetryMin, publishRetryMax time.Duration
}

func newConfig(opts []Option) (config, error) {
	c := config{
		slot: DefaultSlot, publication: DefaultPublication,
		batchSize: 1000, lanes: 2, statusInterval: time.Second, heartbeat: 10 * time.Second,
		standbyRetry: 2 * time.Second, stallTimeout: time.Minute, maxLagBytes: 1 << 30,
		writeTimeout: 10 * time.Second, maxAttempts: 3, grace: 5 * time.Second,
		log:             slog.Default(),
		sessionRetryMin: 100 * time.Millisecond, sessionRetryMax: 10 * time.Second,
		publishRetryMin: 50 * time.Millisecond, publishRetryMax: 5 * time.Second,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.err != nil {
		return c, c.err
	}
	if err := sqlident.CheckSlot(c.slot); err != nil {
		return c, fmt.Errorf("walrelay: %w", err)
	}
	if err := sqlident.CheckName("publication", c.publication); err != nil {
		return c, fmt.Errorf("walrelay: %w", err)
	}
	return c, nil
}

func (c *config) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("walrelay: "+format, args...)
	}
}

func positive(name string, d time.Duration, set func(*config)) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("%s %v must be positive", name, d)
			return
		}
		set(c)
	}
}

// WithSlot names the logical replication slot (default DefaultSlot): lower
// case letters, digits and _. One relay at a time reads a slot; others
// given the same slot wait as standbys.
func WithSlot(name string) Option { return func(c *config) { c.slot = name } }

// WithPublication names the (empty) publication pgoutput is started with
// (default DefaultPublication).
func WithPublication(name string) Option { return func(c *config) { c.publication = name } }

// WithBatchSize sets the most records per Kafka produce call (default
// 1000); a transaction is never split across calls.
func WithBatchSize(n int) Option {
	return func(c *config) {
		if n < 1 || n > 100_000 {
			c.fail("batch size %d: want 1..100000", n)
			return
		}
		c.batchSize = n
	}
}

// WithLanes sets how many publishers the relay runs (default 2), each with
// its own Kafka producer and one produce call in flight: the keys are split
// between them by hash, so each key's records stay in commit order while
// the lanes publish side by side. The slot is confirmed up to the last
// transaction whose every lane's share was acknowledged.
func WithLanes(n int) Option {
	return func(c *config) {
		if n < 1 || n > 64 {
			c.fail("lanes %d: want 1..64", n)
			return
		}
		c.lanes = n
	}
}

// WithStatusInterval sets how often the relay confirms its position to
// Postgres and reads the slot's lag (default 1s).
func WithStatusInterval(d time.Duration) Option {
	return positive("status interval", d, func(c *config) { c.statusInterval = d })
}

// WithHeartbeat sets how often the active relay writes a heartbeat message
// (default 10s), so that the slot's position moves on while the database
// writes no events and retains no WAL for it; 0 turns it off.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.fail("heartbeat %v must not be negative", d)
			return
		}
		c.heartbeat = d
	}
}

// WithStandbyRetry sets how often a standby relay tries to take the slot
// over (default 2s).
func WithStandbyRetry(d time.Duration) Option {
	return positive("standby retry", d, func(c *config) { c.standbyRetry = d })
}

// WithStallTimeout sets how long events may wait unpublished before
// /readyz fails (default 1m).
func WithStallTimeout(d time.Duration) Option {
	return positive("stall timeout", d, func(c *config) { c.stallTimeout = d })
}

// WithMaxLagBytes sets how much WAL the slot may retain before /readyz
// fails (default 1 GiB; 0: no bound). Keep it well below the server's
// max_slot_wal_keep_size, past which Postgres invalidates the slot.
func WithMaxLagBytes(n int64) Option {
	return func(c *config) {
		if n < 0 {
			c.fail("max lag bytes %d must not be negative", n)
			return
		}
		c.maxLagBytes = n
	}
}

// WithShutdownGrace sets how long, once Run's context is done, the batch in
// flight may take to be acknowledged (default 5s); what is not
// acknowledged by then is sent again by the next relay.
func WithShutdownGrace(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.fail("shutdown grace %v must not be negative", d)
			return
		}
		c.grace = d
	}
}

// WithWriteTimeout bounds one Kafka produce request (default 10s).
func WithWriteTimeout(d time.Duration) Option {
	return positive("write timeout", d, func(c *config) { c.writeTimeout = d })
}

// WithMaxAttempts sets kafka-go's attempts per produce call (default 3);
// the relay retries a failed call itself, with backoff, for ever.
func WithMaxAttempts(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.fail("max attempts %d must be at least 1", n)
			return
		}
		c.maxAttempts = n
	}
}

// WithTLS connects to the brokers over TLS.
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }

// WithSASL authenticates to the brokers.
func WithSASL(m sasl.Mechanism) Option { return func(c *config) { c.sasl = m } }

// WithLogger sets the relay's logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}

// WithHooks installs observability callbacks.
func WithHooks(h Hooks) Option { return func(c *config) { c.hooks = h } }

// Hooks receive the relay's measurements, for an adapter to export. Every
// field is optional; they are called from Run's goroutines and must not
// block.
type Hooks struct {
	// Published is called with the number of records each acknowledged
	// batch held.
	Published func(records int)
	// PublishFailed is called when a produce call failed; the relay backs
	// off and sends the same batch again.
	PublishFailed func(err error)
	// Lag is called every status interval by the active relay with the WAL
	// the slot retains (bytes) and how long the oldest unpublished event
	// has been committed.
	Lag func(bytes int64, behind time.Duration)
	// Active is called when this relay takes the slot (true) or loses it.
	Active func(active bool)
}
